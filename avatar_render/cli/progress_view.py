"""What a command shows while it works: a rich bar on a terminal, else plain or JSON lines."""

from __future__ import annotations

from typing import Optional

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from avatar_render.cli.app import Out
from avatar_render.progress import Figures, Ticker


def progress_choice(choice: str, *, quiet: bool, terminal: bool) -> Optional[str]:
    """bar, lines, json, or None for no progress; auto: a bar on a terminal, else lines."""
    if choice not in ("auto", "bar", "lines", "json", "none"):
        raise typer.BadParameter(f"'{choice}' is not one of auto, bar, lines, json, none.", param_hint="--progress")
    if choice == "none" or (quiet and choice == "auto"):
        return None
    if choice == "auto":
        return "bar" if terminal else "lines"
    return choice


class RenderProgress:
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


class CountProgress:
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
