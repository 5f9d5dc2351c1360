"""Seam ratio: the frame-to-frame change at chunk boundaries against the median change inside chunks.

A render's ``--report`` JSON holds its chunk settings and one record per published chunk. N chunks
meet at multiples of ``chunk.chunk_frames`` ("seams"); with I chunks, the frames around each seam
come from the I chunk, which meets the N chunks at its own two edges ("edges"). The change at
frame t is the mean absolute difference of luma between frames t-1 and t. A ratio of 1.0 means the
boundaries change no more than a typical frame inside a chunk: the seams are invisible.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.metrics.regions import luma
from avatar_render.metrics.series import Track
from avatar_render.metrics.video import iter_frames
from avatar_render.pipeline.schedule import plan_for

STILL = 0.05  # grey levels of mean change below which two frames count as identical (keeps 0/0 at 1.0)


@dataclass(frozen=True)
class Boundary:
    frame: int  # first frame after the boundary
    kind: str  # "seam": N chunk meets N chunk; "edge": an I chunk meets an N chunk


@dataclass(frozen=True)
class SeamReading:
    frame: int
    kind: str
    change: float  # grey levels
    ratio: float  # change / median change inside chunks


@dataclass(frozen=True)
class SeamResult:
    ratio: float  # mean change at all boundaries / median change inside chunks
    seam_ratio: float | None  # at N seams only (the same frames with or without I chunks)
    edge_ratio: float | None  # at I-chunk edges only; None without I chunks
    worst: SeamReading | None
    inside_median: float  # grey levels
    boundaries: tuple[SeamReading, ...]
    chunk_frames: int
    transition_frames: int


def load_report(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise AvatarRenderError(f"The report '{path}' does not exist.")
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise AvatarRenderError(f"The report '{path}' is not a JSON file written by 'avatar-render render --report'.") from None
    chunk = report.get("config", {}).get("chunk") if isinstance(report, dict) else None
    if not isinstance(chunk, dict) or not isinstance(chunk.get("chunk_frames"), int) or chunk["chunk_frames"] < 1:
        raise AvatarRenderError(f"The report '{path}' has no chunk plan (config.chunk.chunk_frames); write it with 'avatar-render render --report'.")
    return report


def chunk_boundaries(report: dict[str, Any], frames: int) -> tuple[Boundary, ...]:
    """Where the frames of one chunk meet those of the next, in a video of ``frames`` frames.

    The plan is rebuilt from the report's chunk settings (the same schedule the renderer ran) and
    checked against its per-chunk records; if they disagree (an older or edited report), the
    boundaries are the multiples of ``chunk_frames`` plus the edges of the published records.
    """
    chunk = report["config"]["chunk"]
    size, transition = int(chunk["chunk_frames"]), int(chunk.get("transition_frames", 0))
    seams = {f for f in range(size, frames, size)}
    plans = [p for p in plan_for(frames, chunk_frames=size, transition_frames=transition,
                                 context_frames=int(chunk.get("context_frames", 0)))
             if p.publish_end > p.publish_start]
    records = [(int(r["start"]), int(r["end"])) for r in report.get("chunks", []) if "start" in r and "end" in r]
    if records and records != [(p.publish_start, p.publish_end) for p in plans]:
        starts = {s for s, _ in records if 0 < s < frames}
    else:
        # A published range ends where the frames' source changes (an I chunk publishes the seam region).
        starts = {p.publish_start for p in plans if p.publish_start > 0}
    edges = starts - seams
    return tuple(sorted([Boundary(f, "seam") for f in seams] + [Boundary(f, "edge") for f in edges], key=lambda b: b.frame))


class FrameChange:
    """Per frame: mean absolute luma difference to the previous frame (NaN for the first)."""

    def __init__(self) -> None:
        self.values = Track()
        self._prev: np.ndarray | None = None

    def update(self, gray: np.ndarray) -> None:
        self.values.append(np.nan if self._prev is None else cv2.norm(gray, self._prev, cv2.NORM_L1) / gray.size)
        self._prev = gray


def seam_stats(change: np.ndarray, boundaries: tuple[Boundary, ...], *, chunk_frames: int, transition_frames: int) -> SeamResult:
    """change: (T,) per-frame change (NaN at frame 0)."""
    at = [b for b in boundaries if 0 < b.frame < len(change)]
    inside = np.ones(len(change), bool)
    inside[0] = False
    inside[[b.frame for b in at]] = False
    median = float(np.median(change[inside])) if inside.any() else float("nan")

    def ratio(values: list[float]) -> float | None:
        return (float(np.mean(values)) + STILL) / (median + STILL) if values and np.isfinite(median) else None

    readings = tuple(SeamReading(b.frame, b.kind, round(float(change[b.frame]), 4), round(ratio([change[b.frame]]) or 1.0, 4)) for b in at)
    overall = ratio([r.change for r in readings])
    return SeamResult(
        ratio=1.0 if overall is None else overall,
        seam_ratio=ratio([r.change for r in readings if r.kind == "seam"]),
        edge_ratio=ratio([r.change for r in readings if r.kind == "edge"]),
        worst=max(readings, key=lambda r: r.ratio) if readings else None,
        inside_median=median,
        boundaries=readings,
        chunk_frames=chunk_frames,
        transition_frames=transition_frames,
    )


def measure_seams(video: str | Path, report: str | Path | dict[str, Any]) -> SeamResult:
    """The seam ratio of a rendered MP4, with its chunk plan from the render's ``--report`` JSON."""
    rep = report if isinstance(report, dict) else load_report(report)
    change = FrameChange()
    for frame in iter_frames(video):
        change.update(luma(frame))
    return seam_result(change.values.numpy(), rep)


def seam_result(change: np.ndarray, report: dict[str, Any]) -> SeamResult:
    """Seam statistics of a per-frame change series given the render's report."""
    chunk = report["config"]["chunk"]
    return seam_stats(change, chunk_boundaries(report, len(change)),
                      chunk_frames=int(chunk["chunk_frames"]), transition_frames=int(chunk.get("transition_frames", 0)))
