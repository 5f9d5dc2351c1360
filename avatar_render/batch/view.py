"""What a person watching a batch sees: one progress bar for the batch (jobs done of total, frames,
ETA) with a line per running job, messages printed above it, and the final table."""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn
from rich.table import Table

from avatar_render.batch.events import Event, JobFinished, JobMessage, JobProgress, JobStarted, Planned, Stopping
from avatar_render.batch.jobs import ELSEWHERE, Outcome
from avatar_render.batch.sources import TRANSCRIPT_SUFFIXES
from avatar_render.progress import Figures, Ticker, clock

_STYLE = {
    "done": "green",
    "resumed": "green",
    "skipped": "dim",
    "failed": "red",
    "stopped": "yellow",
    "not run": "yellow",
}


class BatchView:
    """A context manager whose ``on_event`` drives the view; ``warn`` and ``info`` print a line. ``live``: a
    rich bar; ``ticker``: progress lines (plain or JSON) for logs and scripts instead."""

    def __init__(
        self, console: Console, *, warn: Callable[[str], None], info: Callable[[str], None], live: bool = True,
        ticker: Optional[Ticker] = None,
    ) -> None:
        self.console, self.warn, self.info, self.live, self.ticker = console, warn, info, live, ticker
        self.bar: Optional[Progress] = None
        self.batch: Optional[TaskID] = None
        self.lines: dict[str, TaskID] = {}
        self.frames: dict[str, int] = {}  # per job, this run's frames
        self.done: dict[str, int] = {}  # per job, frames written (resumed ones included)
        self.totals: dict[str, Optional[int]] = {}  # per job, its frames (expected, then as the render knows them)
        self.total = 0
        self.finished = 0
        self.t0 = time.monotonic()

    def __enter__(self) -> BatchView:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
        if self.ticker is not None:
            self.ticker.close()

    def figures(self) -> Figures:
        totals = list(self.totals.values())
        return Figures("batch", frames_done=sum(self.done.values()),
                       frames_total=None if None in totals else sum(totals),
                       frames_this_run=sum(self.frames.values()), elapsed_s=time.monotonic() - self.t0, fps=0.0,
                       jobs_done=self.finished, jobs_total=self.total)

    def on_event(self, event: Event) -> None:
        if isinstance(event, Planned):
            self._planned(event)
        elif isinstance(event, JobStarted) and self.bar is not None:
            self.lines[event.job.key] = self.bar.add_task(
                event.job.name, total=None, what=f"  {escape(event.job.name)}", frames="starting", eta=clock(None)
            )
        elif isinstance(event, JobProgress):
            self._progress(event)
        elif isinstance(event, JobMessage):
            (self.warn if event.level == "warning" else self.info)(f"{event.job.name}: {event.text}")
        elif isinstance(event, JobFinished):
            self._finished(event.outcome)
        elif isinstance(event, Stopping):
            self.warn(
                "stopping at once."
                if event.at_once
                else "stopping the running jobs at their next keyframe; a second Ctrl-C (or SIGTERM) stops them at "
                     "once."
            )

    def _planned(self, p: Planned) -> None:
        for path in p.unpaired:
            if path.suffix.lower() in TRANSCRIPT_SUFFIXES:
                self.warn(f"not used: {path.name} (its job has more than one transcript and renders without)")
            else:
                self.warn(f"not paired, not rendered: {path.name} (no partner of the same name, or more than one)")
        for o in p.refused:
            self.warn(f"{o.job.name}: {o.reason}")
        elsewhere = sum(o.reason == ELSEWHERE for o in p.skipped)
        done = len(p.skipped) - elsewhere
        skipped = (f", {done} already done" if done else "") + (
            f", {elsewhere} being rendered by another batch into this folder" if elsewhere else "")
        side_by_side = f", {p.workers} at a time" if p.workers and p.to_run else ""
        self.info(f"{len(p.to_run)} jobs to render{skipped}{side_by_side} on {p.where}.")
        self.total = len(p.to_run)
        self.t0 = time.monotonic()
        expected = p.frames_expected or (None,) * len(p.to_run)
        self.totals = {job.key: frames for job, frames in zip(p.to_run, expected)}
        self.done = {job.key: 0 for job in p.to_run}
        if self.live and p.to_run:
            self.bar = Progress(
                TextColumn("{task.fields[what]}"),
                BarColumn(),
                TextColumn("{task.fields[frames]}"),
                TextColumn("ETA {task.fields[eta]}"),
                console=self.console,
                transient=True,
            )
            self.bar.__enter__()
            self.batch = self.bar.add_task("batch", total=None, what="[bold]batch[/]", frames="", eta=clock(None))
        self._batch_line()

    def _batch_line(self) -> None:
        f = self.figures()
        if self.ticker is not None and self.total:
            self.ticker.update(f)
        if self.bar is None:
            return
        frames = f"{f.frames_done}/{'?' if f.frames_total is None else f.frames_total} frames"
        self.bar.update(self.batch, completed=f.frames_done, total=f.frames_total, eta=clock(f.eta_s),
                        frames=f"{f.jobs_done}/{f.jobs_total} jobs, {frames}, {f.generated_fps:.0f} fps")

    def _progress(self, e: JobProgress) -> None:
        key = e.job.key
        self.frames[key] = e.frames_done - e.frames_resumed
        self.done[key] = e.frames_done
        self.totals[key] = e.frames_total if e.frames_total is not None else self.totals.get(key)
        if self.bar is not None and key in self.lines:
            job = Figures(e.job.name, frames_done=e.frames_done, frames_total=e.frames_total,
                          frames_this_run=e.frames_done - e.frames_resumed, elapsed_s=e.elapsed_s, fps=0.0)
            self.bar.update(
                self.lines[key],
                completed=e.frames_done,
                total=e.frames_total,
                frames=f"{e.frames_done}/{e.frames_total or '?'} frames, {job.generated_fps:.0f} fps",
                eta=clock(job.eta_s),
            )
        self._batch_line()

    def _finished(self, o: Outcome) -> None:
        line = self.lines.pop(o.job.key, None)
        if line is not None and self.bar is not None:
            self.bar.remove_task(line)
        if o.job.key in self.totals and o.status != "stopped":  # a job of this run, finished: its frames are final
            # (a failed one's never come; a stopped one is not finished, and its frames are still to render)
            self.done[o.job.key] = o.frames if o.status in ("done", "resumed") else self.done.get(o.job.key, 0)
            self.totals[o.job.key] = self.done[o.job.key]
            self.finished += 1
            self._batch_line()
        text = f"{o.job.name}: {o.status}" + (
            f" ({o.reason})" if o.reason else f", {o.duration_s:.1f} s in {o.wall_s:.1f} s"
        )
        (self.warn if o.status in ("failed", "stopped") else self.info)(text)


def outcome_table(outcomes: Sequence[Outcome]) -> Table:
    table = Table(
        "job",
        "status",
        "duration",
        "fps",
        "time",
        "reason",
        box=box.SIMPLE_HEAD,
        caption="duration: of the video; fps: frames generated per second; time: the render's wall time (a "
                "skipped job's figures are those of the run that rendered it)",
    )
    for o in outcomes:
        ran = o.status in ("done", "resumed") or bool(o.figures_from)
        table.add_row(
            escape(o.job.name),
            f"[{_STYLE[o.status]}]{o.status}[/]",
            f"{o.duration_s:.1f} s" if o.frames else "",
            f"{o.generated_fps:.1f}" if ran else "",
            f"{o.wall_s:.1f} s" if ran or o.wall_s else "",
            escape(o.reason if o.status != "skipped" else f"figures from {o.figures_from}" if o.figures_from else ""),
        )
    return table
