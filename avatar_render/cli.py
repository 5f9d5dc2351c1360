"""The command line: parses, calls the library, prints through one output object."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column, Table

from avatar_render.errors import AvatarRenderError
from avatar_render.progress import Figures, Ticker, done_record
from avatar_render.tables import fitted

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Render long talking-avatar videos from a reference image and an audio track.")

ConfigOpt = Annotated[Optional[Path], typer.Option(
    "-c", "--config", help="YAML config (default: the embedded preview config).")]
OverridesArg = Annotated[Optional[list[str]], typer.Argument(
    help="Config overrides, key=value (e.g. preview.fps=30).", show_default=False)]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the full traceback of unexpected errors.")]
ProgressOpt = Annotated[str, typer.Option(
    "--progress", metavar="auto|bar|lines|json|none",
    help="How progress is shown: auto (a bar on a terminal, else a line every --progress-every seconds), bar, "
         "lines, json (one JSON object per line on standard output, the end's figures last) or none.")]
ProgressEveryOpt = Annotated[float, typer.Option(
    "--progress-every", metavar="SECONDS", min=0, help="Seconds between two progress lines (lines, json).")]


class Out:
    """All terminal output: human text on stdout (on stderr when stdout carries a video or JSON lines), errors on
    stderr."""

    def __init__(self, *, quiet: bool = False, stdout_is_video: bool = False, stdout_is_json: bool = False) -> None:
        self.console = Console(highlight=False, stderr=stdout_is_video or stdout_is_json)
        self.err = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self.data_file = sys.stderr if stdout_is_video else sys.stdout  # JSON lines for scripts

    def data(self, text: str) -> None:
        """One line for a program to read (JSON progress), unstyled and unwrapped."""
        self.data_file.write(text + "\n")
        self.data_file.flush()

    def line(self, text: str) -> None:
        """One plain line of a log (progress without a terminal), never wrapped."""
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def info(self, text: str) -> None:
        if not self.quiet:
            self.console.print(escape(text), soft_wrap=True)

    def notice(self, text: str) -> None:
        """Shown even when quiet."""
        self.console.print(escape(text), soft_wrap=True)

    def warn(self, text: str) -> None:
        self.err.print(f"[yellow]Warning:[/] {escape(text)}", soft_wrap=True)

    def error(self, text: str) -> None:
        self.err.print(f"[bold red]Error:[/] {escape(text)}", soft_wrap=True)

    def table(self, table: Table) -> None:
        """A table that fits the width: narrower columns, or one block of lines per row (never a cut word)."""
        for part in fitted(table, self.console):
            self.console.print(part)


def _load_config(out: Out, path: Optional[Path], overrides: Optional[list[str]], *, seed: Optional[int] = None):
    """The config, with what ``load_config`` warns about (moved keys) printed as warnings."""
    from avatar_render.config import ConfigWarning, load_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        cfg = load_config(path, tuple(overrides or ()), seed=seed)
    for w in caught:
        if issubclass(w.category, ConfigWarning):
            out.warn(str(w.message))
    return cfg


def _guard(out: Out, debug: bool, fn: Callable[[], None]) -> None:
    """Map failures to one sentence and an exit code; tracebacks only with --debug."""
    try:
        fn()
    except AvatarRenderError as e:
        out.error(str(e))
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        out.error("Interrupted.")
        raise typer.Exit(130) from None
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - the last line of defence against tracebacks
        if debug or os.environ.get("AVATAR_RENDER_DEBUG"):
            traceback.print_exc()
        out.error(f"Unexpected internal error ({type(e).__name__}: {e}). Run again with --debug for details.")
        raise typer.Exit(2) from None


@app.command()
def render(
    ref: Annotated[Path, typer.Option("--ref", help="Reference image (PNG/JPEG/WebP) or video.")],
    audio: Annotated[str, typer.Option(
        "--audio", help="Audio of any length: wav, flac, mp3, m4a, ogg, opus or a video file; or a stream "
                        "(a session): - (standard input), post: (pushed to --serve), rtmp://ADDR:PORT/app/key or "
                        "srt://ADDR:PORT?mode=listener (listeners).")],
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", help="Output .mp4 file (the record; optional with --live or --serve).")] = None,
    overrides: OverridesArg = None,
    config: ConfigOpt = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Random seed (overrides the config).")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="Write a JSON report here.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite an existing output file; discard an interrupted render of it.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue an interrupted render of this output from the last keyframe its journal "
                         "recorded (byte for byte the uninterrupted render).")] = False,
    live: Annotated[Optional[list[str]], typer.Option(
        "--live", metavar="TARGET", help="Publish while rendering (repeatable): rtmp://host/app/key, srt://host:port, "
                                         "whip://host/path (WebRTC), PATH.m3u8 (HLS) or - (fragmented MP4 on standard "
                                         "output).")] = None,
    serve: Annotated[Optional[str], typer.Option(
        "--serve", metavar="[ADDR:]PORT", help="Serve a watch page (WebRTC, HLS as the fall-back) over HTTP "
                                               "(loopback by default; port 0: any).")] = None,
    underrun: Annotated[str, typer.Option(
        "--underrun", help="RTMP/SRT when generation is slower than real time: stall (wait), hold (last frame and "
                           "silence), preroll (start late enough to play through).")] = "stall",
    preroll: Annotated[float, typer.Option(
        "--preroll", metavar="SECONDS", help="RTMP/SRT: delay of every packet after its time.")] = 1.0,
    live_buffer: Annotated[float, typer.Option(
        "--live-buffer", metavar="SECONDS", help="RTMP/SRT: encoded media queued ahead of the wire.")] = 10.0,
    live_retry: Annotated[float, typer.Option(
        "--live-retry", metavar="SECONDS", help="RTMP/SRT: how long a lost connection is retried.")] = 30.0,
    live_gop: Annotated[Optional[float], typer.Option(
        "--live-gop", metavar="SECONDS", hidden=True, help="Old name of video.gop_seconds=SECONDS.")] = None,
    serve_linger: Annotated[float, typer.Option(
        "--serve-linger", metavar="SECONDS", help="--serve: after the render, keep serving while the page was open "
                                                  "this recently (0: stop at once).")] = 10.0,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Check the inputs, the config and the outputs, print the plan (frames, chunks, memory, "
                          "backend, face) and stop: nothing is written.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary.")] = False,
    progress: ProgressOpt = "auto",
    progress_every: ProgressEveryOpt = 5.0,
    debug: DebugOpt = False,
) -> None:
    """Render a talking-avatar MP4, written while it is generated, and publish it live with --live or
    --serve. Ctrl-C (or SIGTERM) stops after the next keyframe (every video.gop_seconds) and keeps what
    was written for --resume, ending the live streams cleanly; a second Ctrl-C stops at once. In a
    session (the audio a stream) Ctrl-C ends the stream and the file is finished with what came."""
    from avatar_render.distributed.launch import is_writer_process

    # under torchrun only process 0 reports progress (and publishes)
    writer = is_writer_process()
    out = Out(quiet=quiet or not writer, stdout_is_video="-" in (live or ()), stdout_is_json=progress == "json")
    shown = progress_choice(progress if writer else "none", quiet=out.quiet, terminal=out.console.is_terminal)

    def run() -> None:
        from avatar_render.api import LiveOptions, RenderRequest, RenderStopped, StopNow, StopSignals, stopping_notice
        from avatar_render.api import render as render_video

        given = list(overrides or ())
        if live_gop is not None:  # the old name of the one keyframe knob
            out.warn(f"--live-gop is now the config key video.gop_seconds (2 s for a live render when unset): "
                     f"pass video.gop_seconds={live_gop:g} instead.")
            given.append(f"video.gop_seconds={live_gop:g}")
        cfg = _load_config(out, config, given, seed=seed)
        if output is None and not live and serve is None:
            raise AvatarRenderError("Give an output file (-o), a live target (--live) or --serve.")
        options = LiveOptions(targets=tuple(live or ()), serve=serve, underrun=underrun, preroll_s=preroll,
                              buffer_s=live_buffer, retry_s=live_retry, linger_s=serve_linger)
        from avatar_render.io.audio_stream import is_stream

        source = audio if is_stream(audio) else Path(audio)
        request = RenderRequest(reference=ref, audio=source, output=output, config=cfg, force=force, report=report,
                                resume=resume, config_file=config, live=options)
        if dry_run:
            _show_plan(out, request, json_lines=shown == "json")
            return
        on_message = lambda level, text: {"warning": out.warn, "notice": out.notice}.get(level, out.info)(text)  # noqa: E731
        stopping = StopSignals(on_first=lambda signum: out.warn(stopping_notice(signum, session=is_stream(audio))))
        try:
            with stopping, _progress(out, shown, progress_every) as on_progress:
                result = render_video(request, on_progress=on_progress, on_message=on_message, should_stop=stopping)
        except RenderStopped as stopped:
            out.warn(str(stopped))
            raise typer.Exit(stopping.exit_code) from None
        except StopNow:  # a second signal outside the chunk loop
            out.warn("Stopped at once.")
            raise typer.Exit(stopping.exit_code) from None
        if shown == "json":
            out.data(done_record(result))
        out.info(
            f"{'Wrote' if output is not None else 'Streamed'} {result.output}: {result.duration_s:.2f} s, "
            f"{result.frames} frames at {result.fps:g} fps, "
            f"{result.width}x{result.height} | first frame {result.time_to_first_frame_s:.2f} s | "
            f"{result.generated_fps:.1f} fps generated, {result.realtime_factor:.2f}x real time | "
            f"peak memory {result.peak_rss_mb:.0f} MB"
            + ("" if result.peak_gpu_mb is None else f", GPU {result.peak_gpu_mb / 1024:.1f} GiB")
        )

    _guard(out, debug, run)


def _show_plan(out: Out, request, *, json_lines: bool) -> None:
    """``render --dry-run``: the plan, as lines or one JSON object."""
    from avatar_render.api import plan_render

    plan = plan_render(request)
    if json_lines:
        out.data(json.dumps({"event": "plan", **dataclasses.asdict(plan)}))
        return
    for key, value in plan.rows():
        out.notice(f"{key + ':':13}{value}")
    out.notice("Dry run: nothing was written.")


def _show_batch_plan(out: Out, request, *, json_lines: bool) -> None:
    """``batch --dry-run``: each job's plan as a table (or JSON lines); exit 1 if a job would fail."""
    from avatar_render.batch.dry import dry_run_batch

    plans = dry_run_batch(request)
    failing = sum(p.action == "fail" for p in plans)
    if json_lines:
        for p in plans:
            out.data(json.dumps({"event": "plan", **dataclasses.asdict(p)}))
    else:
        table = Table("job", "action", "frames", Column("reason", overflow="fold"), box=box.SIMPLE_HEAD)
        for p in plans:
            table.add_row(escape(p.name), p.action, "?" if p.frames is None else str(p.frames), escape(p.reason))
        out.table(table)
        to_run = [p for p in plans if p.action in ("render", "resume")]
        frames = sum(p.frames or 0 for p in to_run)
        out.notice(f"Dry run: {len(to_run)} of {len(plans)} jobs to render ({frames} frames), "
                   f"{failing} would fail; nothing was written.")
    if failing:
        raise typer.Exit(1)


def progress_choice(choice: str, *, quiet: bool, terminal: bool) -> Optional[str]:
    """bar, lines, json, or None for no progress; auto: a bar on a terminal, else lines."""
    if choice not in ("auto", "bar", "lines", "json", "none"):
        raise typer.BadParameter(f"'{choice}' is not one of auto, bar, lines, json, none.", param_hint="--progress")
    if choice == "none" or (quiet and choice == "auto"):
        return None
    if choice == "auto":
        return "bar" if terminal else "lines"
    return choice


class _progress:
    """Context manager giving an on_progress callback that drives a rich progress bar, or progress lines
    (plain or JSON) at a steady interval."""

    def __init__(self, out: Out, style: Optional[str], every_s: float) -> None:
        self.out, self.style = out, style
        self.bar: Progress | None = None
        self.task = None
        self.ticker = None if style not in ("lines", "json") else Ticker(
            out.data if style == "json" else out.line, style=style, every_s=every_s)

    def __enter__(self):
        if self.style is None:
            return None
        return self.update if self.ticker is None else self.tick

    def tick(self, p) -> None:
        self.ticker.update(Figures("render", frames_done=p.frames_done, frames_total=p.frames_total,
                                   frames_this_run=p.frames_done - p.frames_resumed, elapsed_s=p.elapsed_s,
                                   fps=p.fps, chunks_done=p.chunks_done, open_duration=p.open_duration))

    def _start(self, *, open_duration: bool) -> None:
        # a session (open duration): frames and elapsed time, no total and no ETA
        self.bar = Progress(
            TextColumn("[bold]rendering"),
            BarColumn(),
            TextColumn("chunk {task.fields[chunks]}"),
            TextColumn("{task.completed:.0f} frames" if open_duration else
                       "{task.completed:.0f}/{task.fields[total_text]} frames"),
            TextColumn("{task.fields[gen_fps]:.1f} fps"),
            TextColumn("{task.fields[rtf]:.2f}x real time"),
            TextColumn("elapsed" if open_duration else "ETA"),
            TimeElapsedColumn() if open_duration else TimeRemainingColumn(),
            console=self.out.console,
            transient=True,
        )
        self.bar.__enter__()
        self.task = self.bar.add_task("render", total=None, chunks=0, total_text="?", gen_fps=0.0, rtf=0.0)

    def update(self, p) -> None:
        if self.bar is None:
            self._start(open_duration=p.open_duration)
            self.bar.update(self.task, completed=p.frames_resumed)  # so that speed and ETA count this run only
        gen_fps = (p.frames_done - p.frames_resumed) / max(p.elapsed_s, 1e-9)
        self.bar.update(self.task, completed=p.frames_done, total=p.frames_total, chunks=p.chunks_done,
                        total_text=str(p.frames_total or "?"), gen_fps=gen_fps, rtf=gen_fps / p.fps)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        if self.ticker is not None:
            self.ticker.close()


@app.command()
def batch(
    source: Annotated[Path, typer.Argument(
        help="A folder (references and audio paired by name) or a .csv/.jsonl manifest.", show_default=False)],
    out_dir: Annotated[Path, typer.Option(
        "--out", help="Folder for the videos, the summary (JSON and HTML) and the ledger.")],
    overrides: OverridesArg = None,
    config: ConfigOpt = None,
    ref: Annotated[Optional[Path], typer.Option(
        "--ref", help="One reference for every audio file of the folder.")] = None,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j", min=1, help="Jobs side by side (default: CPU cores for preview, else GPUs).")] = None,
    procs_per_job: Annotated[int, typer.Option(
        "--procs-per-job", min=1, help="Processes (GPUs) per job, under torchrun when more than 1.")] = 1,
    shard: Annotated[Optional[str], typer.Option(
        "--shard", help="Take part I of N (0 <= I < N); default: the Slurm array task's part.")] = None,
    ray: Annotated[bool, typer.Option(
        "--ray", help="Run the jobs as Ray tasks (pip install -e '.[ray]') on the cluster of RAY_ADDRESS or "
                      "of 'ray start' here, or on a new local one.")] = False,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", metavar="HOST:PORT", help="The Ray cluster to run on (implies --ray).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Render every job again, replacing outputs and discarding partial renders.")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Check the jobs, their inputs and configs, say what each would do and stop: nothing is "
                          "written.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress view.")] = False,
    progress: ProgressOpt = "auto",
    progress_every: ProgressEveryOpt = 5.0,
    debug: DebugOpt = False,
) -> None:
    """Render many jobs: skips finished ones, resumes interrupted ones, goes on past failures and ends with a
    table, OUT/batch-summary.json and .html. Exit code 1 if a job failed; Ctrl-C stops after the running
    jobs' current chunks."""
    out = Out(quiet=quiet, stdout_is_json=progress == "json")
    shown = progress_choice(progress, quiet=quiet, terminal=out.console.is_terminal)

    def run() -> None:
        from avatar_render.api import StopSignals
        from avatar_render.batch import BatchRequest, run_batch
        from avatar_render.batch.shard import parse_shard
        from avatar_render.batch.view import BatchView, outcome_table

        _load_config(out, config, overrides)  # its warnings, once
        request = BatchRequest(source=source, out=out_dir, config=config, overrides=tuple(overrides or ()), ref=ref,
                               jobs=jobs, procs_per_job=procs_per_job, shard=parse_shard(shard) if shard else None,
                               force=force, ray=ray, ray_address=ray_address)
        if dry_run:
            _show_batch_plan(out, request, json_lines=shown == "json")
            return
        stopping = StopSignals()
        ticker = None if shown not in ("lines", "json") else Ticker(
            out.data if shown == "json" else out.line, style=shown, every_s=progress_every)
        with stopping, BatchView(out.console, warn=out.warn, info=out.info, live=shown == "bar",
                                 ticker=ticker) as view:
            result = run_batch(request, on_event=view.on_event, should_stop=stopping)
        if shown == "json":
            out.data(done_record(result))
        out.table(outcome_table(result.outcomes))
        out.info(f"Wrote {result.summary_json} and {result.summary_html}")
        if stopping():
            raise typer.Exit(stopping.exit_code)
        if result.failed:
            out.error(f"{result.failed} of {len(result.outcomes)} jobs failed.")
            raise typer.Exit(1)

    _guard(out, debug, run)


@app.command()
def doctor(overrides: OverridesArg = None, config: ConfigOpt = None, debug: DebugOpt = False) -> None:
    """What this machine can run: versions, codecs, devices, backends and (with model.root=...) the model's files."""
    out = Out()

    def run() -> None:
        from avatar_render.doctor import diagnose

        cfg = _load_config(out, config, overrides) if (config or overrides) else None
        table = Table("group", "item", "ok", Column("detail", overflow="fold"))  # fold: long paths stay whole
        for c in diagnose(cfg):
            table.add_row(escape(c.group), escape(c.name), "[green]yes[/]" if c.ok else "[red]no[/]", escape(c.detail))
        out.table(table)

    _guard(out, debug, run)


@app.command()
def setup(
    dest: Annotated[Optional[Path], typer.Option(
        "--dest", help="Folder for face_landmark.tflite (default: beside the package, or the user's data).")] = None,
    debug: DebugOpt = False,
) -> None:
    """Install the face landmark model the preview places the mouth and eyes with (pip downloads it once)."""
    out = Out()

    def run() -> None:
        from avatar_render.face.install import WHEEL, install_model

        target, fresh = install_model(dest)
        what = f"MediaPipe face mesh model (Apache-2.0) from {WHEEL}" if fresh else "already in place"
        out.info(f"{target}: {what}")

    _guard(out, debug, run)


@app.command()
def bench(
    durations: Annotated[str, typer.Option(
        "--durations", help="Comma-separated audio durations in seconds.")] = "10,60,600",
    sizes: Annotated[str, typer.Option(
        "--sizes", help="Comma-separated output sizes, WIDTHxHEIGHT.")] = "256x256,512x512",
    backends: Annotated[str, typer.Option(
        "--backends", help="Comma-separated backends (set with backend=NAME on each render).")] = "preview",
    ref: Annotated[Path, typer.Option("--ref", help="Reference image.")] = Path("examples/face.png"),
    speech: Annotated[Path, typer.Option(
        "--speech", help="16-bit WAV speech, repeated to each duration.")] = Path("examples/talk.wav"),
    out_dir: Annotated[Path, typer.Option(
        "--out", help="Folder for bench.json, the PNG plots and each render's report.")] = Path("bench-results"),
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Write the results as JSON here (default: OUT/bench.json).")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace result files (JSON, plots, reports) that bench did not write.")] = False,
    overrides: OverridesArg = None,
    config: ConfigOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Render speech of several durations, sizes and backends; print speed and memory, write JSON and plots.
    The first frame's wait is given in wall seconds and, with the diffusion backend, in DiT tokens processed
    before it (and before the first frame that needed sampling)."""
    out = Out()

    def run() -> None:
        from avatar_render.bench import check_bench, parse_matrix, run_bench, write_results

        cases = parse_matrix(durations, sizes, backends)
        for path in (ref, speech):
            if not os.path.lexists(path):
                raise AvatarRenderError(
                    f"'{path}' does not exist (run from the project folder, or pass --ref/--speech).")
        check_bench(cases, reference=ref, speech=speech, out_dir=out_dir, json_path=json_out, config=config,
                    force=force)
        table = Table("backend", "audio", "size", "frames", "load", "1st frame", "1st sampled", "fps", "x real",
                      "encode x", "ratio", "peak MB", "MB chunk 1/last", box=box.SIMPLE_HEAD,
                      caption="load: reading the weights; 1st frame: seconds after the inputs were ready "
                              "[DiT tokens before it]; "
                              "1st sampled: the same for the first frame that needed sampling; "
                              "fps: generated frames per second; "
                              "x real: video seconds per wall second, the whole render; encode x: the same for "
                              "its encoder alone on its frames, just after it; ratio: x real / encode x; "
                              "MB: resident memory")

        def show(case, row) -> None:
            gpu = "" if row.get("peak_gpu_mb") is None else f", GPU {row['peak_gpu_mb'] / 1024:.1f} GiB"
            out.info(f"{case.seconds:g} s at {case.width}x{case.height} ({case.backend}): "
                     f"{row['generated_fps']:.1f} fps, {row['realtime_factor']:.2f}x real time "
                     f"(the encoder alone {row['encode_realtime_factor']:.2f}x: ratio {row['encode_ratio']:.2f}), "
                     f"peak {row['peak_rss_mb']:.0f} MB{gpu}")
            tokens = "" if row["first_frame_tokens"] is None else f" [{row['first_frame_tokens']}]"
            sampled = "-" if row["first_sampled_frame_s"] is None else \
                f"{row['first_sampled_frame_s']:.2f} s [{row['first_sampled_frame_tokens']}]"
            table.add_row(case.backend, f"{row['duration_s']:g} s", f"{row['width']}x{row['height']}",
                          str(row["frames"]),
                          "-" if row["load_s"] is None else f"{row['load_s']:.2f} s",
                          f"{row['time_to_first_frame_s']:.2f} s{tokens}", sampled, f"{row['generated_fps']:.0f}",
                          f"{row['realtime_factor']:.2f}", f"{row['encode_realtime_factor']:.2f}",
                          f"{row['encode_ratio']:.2f}", f"{row['peak_rss_mb']:.0f}",
                          f"{row['rss_mb_first_chunk']:.0f} / {row['rss_mb_last_chunk']:.0f}")

        results = run_bench(cases, reference=ref, speech=speech, out_dir=out_dir, overrides=tuple(overrides or ()),
                            on_result=show, config=config, force=force)
        out.table(table)
        for path in write_results(results, out_dir, json_path=json_out):
            out.info(f"Wrote {path}")

    _guard(out, debug, run)


@app.command()
def inspect(
    video: Annotated[Path, typer.Argument(help="A rendered MP4.", show_default=False)],
    report: Annotated[Optional[Path], typer.Option(
        "--report", help="The render's --report JSON (needed for the seam ratio).")] = None,
    ref: Annotated[Optional[Path], typer.Option(
        "--ref", help="The reference image or video it was rendered from (default: its first frame).")] = None,
    audio: Annotated[Optional[Path], typer.Option(
        "--audio", help="The speech it was rendered from (default: its own audio track).")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Write the metrics over time as a PNG here.")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the metrics as JSON here.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Replace a --json or --plot file that inspect did not write.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Consistency over time: colour drift, seams, mouth against speech, blinks, head motion, identity."""
    out = Out()

    def run() -> None:
        from avatar_render.metrics.inspect import check_destinations, inspect_video, write_json
        from avatar_render.metrics.summary import summary_rows

        check_destinations(video, json_path=json_out, plot_path=plot, force=force, report=report, reference=ref,
                           audio=audio)
        with _count_progress(out, "inspecting") as on_progress:
            result = inspect_video(video, report=report, reference=ref, audio=audio, on_progress=on_progress)
        table = Table("metric", "value", "detail", title=f"{video.name}")
        for row in summary_rows(result):
            table.add_row(*row)
        out.table(table)
        for note in result.notes:
            out.warn(note)
        if plot is not None:
            from avatar_render.metrics.plots import plot_inspect

            out.info(f"Wrote {plot_inspect(result, plot)}")
        if json_out is not None:
            out.info(f"Wrote {write_json(result, json_out)}")

    _guard(out, debug, run)


class _count_progress:
    """Context manager giving an on_progress(done, total) callback that drives a transient rich bar."""

    def __init__(self, out: Out, label: str) -> None:
        self.out, self.label = out, label
        self.bar: Progress | None = None

    def __enter__(self):
        return None if self.out.quiet else self.update

    def update(self, done: int, total: int | None) -> None:
        if self.bar is None:
            self.bar = Progress(TextColumn(f"[bold]{self.label}"), BarColumn(),
                                TextColumn("{task.completed:.0f} frames"),
                                TimeRemainingColumn(), console=self.out.console, transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done, total=max(total or 0, done) or None)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


def main() -> None:
    app(prog_name="avatar-render")


if __name__ == "__main__":
    sys.exit(main())
