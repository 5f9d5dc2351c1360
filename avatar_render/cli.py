"""The command line: parses, calls the library, prints through one output object."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from avatar_render.errors import AvatarRenderError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Render long talking-avatar videos from a reference image and an audio track.")

ConfigOpt = Annotated[Optional[Path], typer.Option("-c", "--config", help="YAML config (default: the embedded preview config).")]
OverridesArg = Annotated[Optional[list[str]], typer.Argument(help="Config overrides, key=value (e.g. preview.fps=30).", show_default=False)]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show the full traceback of unexpected errors.")]


class Out:
    """All terminal output: human text on stdout, errors on stderr."""

    def __init__(self, *, quiet: bool = False) -> None:
        self.console = Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)
        self.quiet = quiet

    def info(self, text: str) -> None:
        if not self.quiet:
            self.console.print(escape(text), soft_wrap=True)

    def warn(self, text: str) -> None:
        self.err.print(f"[yellow]Warning:[/] {escape(text)}", soft_wrap=True)

    def error(self, text: str) -> None:
        self.err.print(f"[bold red]Error:[/] {escape(text)}", soft_wrap=True)

    def table(self, table: Table) -> None:
        self.console.print(table)


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
    audio: Annotated[Path, typer.Option("--audio", help="Audio of any length: wav, flac, mp3, m4a, ogg, opus or a video file.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="Output .mp4 file.")],
    overrides: OverridesArg = None,
    config: ConfigOpt = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Random seed (overrides the config).")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="Write a JSON report here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary.")] = False,
    debug: DebugOpt = False,
) -> None:
    """Render a talking-avatar MP4, written while it is generated."""
    out = Out(quiet=quiet)

    def run() -> None:
        from avatar_render.api import RenderRequest
        from avatar_render.api import render as render_video
        from avatar_render.config import load_config

        cfg = load_config(config, tuple(overrides or ()), seed=seed)
        request = RenderRequest(reference=ref, audio=audio, output=output, config=cfg, force=force, report=report)
        with _progress(out) as on_progress:
            result = render_video(request, on_progress=on_progress)
        if not result.face_detected and cfg.preview.face_box is None:
            out.warn("no face was found in the reference; the face was assumed at the image centre (set preview.face_box to place it).")
        out.info(
            f"Wrote {result.output}: {result.duration_s:.2f} s, {result.frames} frames at {result.fps:g} fps, "
            f"{result.width}x{result.height} | first frame {result.time_to_first_frame_s:.2f} s | "
            f"{result.generated_fps:.1f} fps generated, {result.realtime_factor:.2f}x real time | "
            f"peak memory {result.peak_rss_mb:.0f} MB"
        )

    _guard(out, debug, run)


class _progress:
    """Context manager giving an on_progress callback that drives a rich progress bar."""

    def __init__(self, out: Out) -> None:
        self.out = out
        self.bar: Progress | None = None
        self.task = None

    def __enter__(self):
        return None if self.out.quiet else self.update

    def _start(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]rendering"),
            BarColumn(),
            TextColumn("chunk {task.fields[chunks]}"),
            TextColumn("{task.completed:.0f}/{task.fields[total_text]} frames"),
            TextColumn("{task.fields[gen_fps]:.1f} fps"),
            TextColumn("{task.fields[rtf]:.2f}x real time"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.out.console,
            transient=True,
        )
        self.bar.__enter__()
        self.task = self.bar.add_task("render", total=None, chunks=0, total_text="?", gen_fps=0.0, rtf=0.0)

    def update(self, p) -> None:
        if self.bar is None:
            self._start()
        gen_fps = p.frames_done / max(p.elapsed_s, 1e-9)
        self.bar.update(self.task, completed=p.frames_done, total=p.frames_total, chunks=p.chunks_done,
                        total_text=str(p.frames_total or "?"), gen_fps=gen_fps, rtf=gen_fps / p.fps)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)


@app.command()
def doctor(debug: DebugOpt = False) -> None:
    """What this machine can run: versions, codecs, devices and backends."""
    out = Out()

    def run() -> None:
        from avatar_render.doctor import diagnose

        table = Table("group", "item", "ok", "detail")
        for c in diagnose():
            table.add_row(c.group, c.name, "[green]yes[/]" if c.ok else "[red]no[/]", c.detail)
        out.table(table)

    _guard(out, debug, run)


@app.command()
def bench(
    durations: Annotated[str, typer.Option("--durations", help="Comma-separated audio durations in seconds.")] = "10,60,600",
    sizes: Annotated[str, typer.Option("--sizes", help="Comma-separated output sizes, WIDTHxHEIGHT.")] = "512x512",
    ref: Annotated[Path, typer.Option("--ref", help="Reference image.")] = Path("examples/face.png"),
    speech: Annotated[Path, typer.Option("--speech", help="16-bit WAV speech, repeated to each duration.")] = Path("examples/talk.wav"),
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the results as JSON here.")] = None,
    overrides: OverridesArg = None,
    debug: DebugOpt = False,
) -> None:
    """Render speech of several durations and sizes; print speed and memory for each."""
    out = Out()

    def run() -> None:
        import json

        from avatar_render.bench import BenchCase, run_bench

        try:
            secs = [float(d) for d in durations.split(",") if d.strip()]
            dims = [tuple(int(v) for v in s.lower().split("x")) for s in sizes.split(",") if s.strip()]
        except ValueError:
            raise AvatarRenderError("--durations takes numbers like 10,60 and --sizes takes sizes like 512x512,256x256.") from None
        if not secs or any(s <= 0 for s in secs) or any(len(d) != 2 for d in dims):
            raise AvatarRenderError("--durations takes positive numbers like 10,60 and --sizes takes sizes like 512x512.")
        for path in (ref, speech):
            if not path.is_file():
                raise AvatarRenderError(f"'{path}' does not exist (run from the project folder, or pass --ref/--speech).")
        cases = [BenchCase(seconds=s, width=w, height=h) for (w, h) in dims for s in secs]
        table = Table("audio s", "size", "frames", "first frame s", "gen fps", "x real time", "peak RSS MB", "RSS first/last chunk MB")

        def show(case, row) -> None:
            out.info(f"{case.seconds:g} s at {case.width}x{case.height}: {row['generated_fps']:.1f} fps, peak {row['peak_rss_mb']:.0f} MB")
            table.add_row(f"{row['duration_s']:.1f}", f"{row['width']}x{row['height']}", str(row["frames"]),
                          f"{row['time_to_first_frame_s']:.3f}", f"{row['generated_fps']:.1f}", f"{row['realtime_factor']:.2f}",
                          f"{row['peak_rss_mb']:.0f}", f"{row['rss_mb_first_chunk']:.0f} / {row['rss_mb_last_chunk']:.0f}")

        results = run_bench(cases, reference=ref, speech=speech, overrides=tuple(overrides or ()), on_result=show)
        out.table(table)
        if json_out is not None:
            json_out.write_text(json.dumps(results, indent=2) + "\n")

    _guard(out, debug, run)


def main() -> None:
    app(prog_name="avatar-render")


if __name__ == "__main__":
    sys.exit(main())
