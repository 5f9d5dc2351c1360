"""What a person watching a batch sees: one progress bar for the batch (jobs done of total, frames,
ETA) with a line per running job, messages printed above it, and the final table."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table

from avatar_render.batch.events import Event, JobFinished, JobMessage, JobProgress, JobStarted, Planned, Stopping
from avatar_render.batch.jobs import Outcome

_STYLE = {
    "done": "green",
    "resumed": "green",
    "skipped": "dim",
    "failed": "red",
    "stopped": "yellow",
    "not run": "yellow",
}


class BatchView:
    """A context manager whose ``on_event`` drives the view; ``warn`` and ``info`` print a line."""

    def __init__(
        self, console: Console, *, warn: Callable[[str], None], info: Callable[[str], None], live: bool = True
    ) -> None:
        self.console, self.warn, self.info, self.live = console, warn, info, live
        self.bar: Optional[Progress] = None
        self.batch: Optional[TaskID] = None
        self.lines: dict[str, TaskID] = {}
        self.frames: dict[str, int] = {}  # per job, this run's frames
        self.total = 0

    def __enter__(self) -> BatchView:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None

    def on_event(self, event: Event) -> None:
        if isinstance(event, Planned):
            self._planned(event)
        elif isinstance(event, JobStarted) and self.bar is not None:
            self.lines[event.job.key] = self.bar.add_task(
                event.job.name, total=None, what=f"  {escape(event.job.name)}", frames="starting"
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
                else "stopping the running jobs at their next keyframe; press Ctrl-C again to stop at once."
            )

    def _planned(self, p: Planned) -> None:
        for path in p.unpaired:
            self.warn(f"not paired, not rendered: {path.name} (no partner of the same name, or more than one)")
        for o in p.refused:
            self.warn(f"{o.job.name}: {o.reason}")
        skipped = f", {len(p.skipped)} already done" if p.skipped else ""
        side_by_side = f", {p.workers} at a time" if p.workers and p.to_run else ""
        self.info(f"{len(p.to_run)} jobs to render{skipped}{side_by_side} on {p.where}.")
        self.total = len(p.to_run)
        if self.live and p.to_run:
            self.bar = Progress(
                TextColumn("{task.fields[what]}"),
                BarColumn(),
                TextColumn("{task.fields[frames]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.__enter__()
            self.batch = self.bar.add_task("batch", total=self.total, what="[bold]batch[/]", frames="")
            self._batch_line(0)

    def _batch_line(self, done: int) -> None:
        self.bar.update(
            self.batch, completed=done, frames=f"{done}/{self.total} jobs, {sum(self.frames.values())} frames"
        )

    def _progress(self, e: JobProgress) -> None:
        self.frames[e.job.key] = e.frames_done - e.frames_resumed
        if self.bar is None or e.job.key not in self.lines:
            return
        fps = (e.frames_done - e.frames_resumed) / max(e.elapsed_s, 1e-9)
        self.bar.update(
            self.lines[e.job.key],
            completed=e.frames_done,
            total=e.frames_total,
            frames=f"{e.frames_done}/{e.frames_total or '?'} frames, {fps:.0f} fps",
        )
        self._batch_line(self.bar.tasks[self.batch].completed)

    def _finished(self, o: Outcome) -> None:
        line = self.lines.pop(o.job.key, None)
        if self.bar is not None:
            if line is not None:
                self.bar.remove_task(line)
            self._batch_line(self.bar.tasks[self.batch].completed + 1)
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
        caption="duration: of the video; fps: frames generated per second; time: this run's wall time",
    )
    for o in outcomes:
        ran = o.status in ("done", "resumed")
        table.add_row(
            escape(o.job.name),
            f"[{_STYLE[o.status]}]{o.status}[/]",
            f"{o.duration_s:.1f} s" if o.frames else "",
            f"{o.generated_fps:.1f}" if ran else "",
            f"{o.wall_s:.1f} s" if ran or o.wall_s else "",
            escape(o.reason) if o.status != "skipped" else "",
        )
    return table
