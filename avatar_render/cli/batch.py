"""``avatar-render batch``: many jobs, skipped, resumed, sharded or run on Ray."""

from __future__ import annotations

import dataclasses
import json
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
    ProgressEveryOpt,
    ProgressOpt,
    guard,
    read_config,
)
from avatar_render.cli.progress_view import progress_choice
from avatar_render.progress import Ticker, done_record


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
        jobs = sum(p.action != "unused" for p in plans)
        out.notice(f"Dry run: {len(to_run)} of {jobs} jobs to render ({frames} frames), "
                   f"{failing} would fail; nothing was written.")
    if failing:
        raise typer.Exit(1)



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

        read_config(out, config, overrides)  # its warnings, once
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

    guard(out, debug, run)

