"""The tools around a render: ``doctor``, ``setup``, ``bench`` and ``inspect``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.markup import escape
from rich.table import Column, Table

from avatar_render.cli.app import (
    ConfigOpt,
    DebugOpt,
    Out,
    OverridesArg,
    guard,
    read_config,
)
from avatar_render.cli.progress_view import CountProgress
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown


def doctor(overrides: OverridesArg = None, config: ConfigOpt = None, debug: DebugOpt = False) -> None:
    """What this machine can run: versions, codecs, devices, backends and (with model.root=...) the model's files."""
    out = Out()

    def run() -> None:
        from avatar_render.doctor import diagnose

        cfg = read_config(out, config, overrides) if (config or overrides) else None
        table = Table("group", "item", "ok", Column("detail", overflow="fold"))  # fold: long paths stay whole
        for c in diagnose(cfg):
            table.add_row(escape(c.group), escape(c.name), "[green]yes[/]" if c.ok else "[red]no[/]", escape(c.detail))
        out.table(table)

    guard(out, debug, run)


def setup(
    dest: Annotated[Optional[Path], typer.Option(
        "--dest", help="Folder for the .tflite models (default: beside the package, or the user's data).")] = None,
    debug: DebugOpt = False,
) -> None:
    """Install the face models the preview finds faces, places the mouth and eyes and tells the person from the
    background with (pip downloads them once)."""
    out = Out()

    def run() -> None:
        from avatar_render.face.install import WHAT, install_model

        target, fresh = install_model(dest)
        out.info(f"{target.parent}: {WHAT if fresh else 'already in place'}")

    guard(out, debug, run)


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
        from avatar_render.files.write import remove_empty_folder

        cases = parse_matrix(durations, sizes, backends)
        stray = next((item for item in overrides or () if "=" not in item), None)
        if stray is not None:  # (``--durations 10 60``: the 60 lands among the overrides)
            raise AvatarRenderError(f"{shown(stray)} is not a key=value override; --durations, --sizes and --backends "
                                    "take comma-separated lists (--durations 10,60,600).")
        read_config(out, config, overrides)  # a bad key or value refused before the first render
        for path in (ref, speech):
            if not os.path.lexists(path):
                raise AvatarRenderError(
                    f"'{path}' does not exist (run from the project folder, or pass --ref/--speech).")
        made = check_bench(cases, reference=ref, speech=speech, out_dir=out_dir, json_path=json_out, config=config,
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

        try:
            results = run_bench(cases, reference=ref, speech=speech, out_dir=out_dir,
                                overrides=tuple(overrides or ()), on_result=show, config=config, force=force)
        except BaseException:
            if made:  # (a failed first case leaves no folder of its own behind)
                remove_empty_folder(out_dir)
            raise
        out.table(table)
        for path in write_results(results, out_dir, json_path=json_out):
            out.info(f"Wrote {path}")

    guard(out, debug, run)


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
        with CountProgress(out, "inspecting") as on_progress:
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

    guard(out, debug, run)
