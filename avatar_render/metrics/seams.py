"""Seam ratio: the frame-to-frame change at chunk boundaries against the median change inside chunks.

A render's ``--report`` JSON holds its chunk settings and backend, from which the chunk plan is rebuilt.
N chunks meet at each later N chunk's first frame ("seams": multiples of ``chunk.chunk_frames`` after
the first chunk's ``chunk.first_frames`` and the backend's lead frames); with I chunks, the frames
around each seam come from the I chunk, which meets the N chunks at its own two edges ("edges"). The change at
frame t is the mean absolute difference of luma between frames t-1 and t. A ratio of 1.0 means the
boundaries change no more than a typical frame inside a chunk: the seams are invisible.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from avatar_render.backends import BACKENDS
from avatar_render.errors import AvatarRenderError
from avatar_render.face.patches import luma
from avatar_render.files.read import read_json
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
    report = read_json(path, what="report", give="the JSON file 'avatar-render render --report' wrote")
    chunk = report.get("config", {}).get("chunk") if isinstance(report, dict) else None
    if not isinstance(chunk, dict) or not isinstance(chunk.get("chunk_frames"), int) or chunk["chunk_frames"] < 1:
        raise AvatarRenderError(f"The report '{path}' has no chunk plan (config.chunk.chunk_frames); write it with "
                                "'avatar-render render --report'.")
    return report


def chunk_boundaries(report: dict[str, Any], frames: int) -> tuple[Boundary, ...]:
    """Where the frames of one chunk meet those of the next, in a video of ``frames`` frames.

    The plan is rebuilt from the report's config (its chunk settings and backend: the same schedule
    the renderer ran, a short first chunk included): N chunks meet at each later N chunk's first frame
    ("seams"); with I chunks the frames around each seam come from the I chunk, which meets the N
    chunks at its published range's two ends ("edges"). The report's records are not used: a chunk
    may publish in pieces (the first frame early) and one record may hold another chunk's frames.
    """
    config = report["config"]
    chunk = config["chunk"]
    size, transition = int(chunk["chunk_frames"]), int(chunk.get("transition_frames", 0))
    first = int(chunk.get("first_frames", 0) or 0) or size
    plans = plan_for(frames, chunk_frames=size, transition_frames=transition,
                     context_frames=int(chunk.get("context_frames", 0)),
                     lead_frames=_lead_frames(config.get("backend")), first_frames=first) if frames else []
    seams = {p.start for p in plans if p.kind == "N" and p.start > 0}
    edges = {f for p in plans if p.kind == "I" for f in (p.publish_start, p.publish_end) if 0 < f < frames} - seams
    return tuple(sorted([Boundary(f, "seam") for f in seams] + [Boundary(f, "edge") for f in edges],
                        key=lambda b: b.frame))


def _lead_frames(name: Any) -> int:
    """Frames N0 of the report's backend generates before its chunk_frames (0 for a backend not known here)."""
    return BACKENDS[name].lead_frames if name in BACKENDS else 0


class FrameChange:
    """Per frame: mean absolute luma difference to the previous frame (NaN for the first)."""

    def __init__(self) -> None:
        self.values = Track()
        self._prev: np.ndarray | None = None

    def update(self, gray: np.ndarray) -> None:
        self.values.append(np.nan if self._prev is None else cv2.norm(gray, self._prev, cv2.NORM_L1) / gray.size)
        self._prev = gray


def seam_stats(change: np.ndarray, boundaries: tuple[Boundary, ...], *, chunk_frames: int,
               transition_frames: int) -> SeamResult:
    """change: (T,) per-frame change (NaN at frame 0)."""
    at = [b for b in boundaries if 0 < b.frame < len(change)]
    inside = np.ones(len(change), bool)
    inside[0] = False
    inside[[b.frame for b in at]] = False
    median = float(np.median(change[inside])) if inside.any() else float("nan")

    def ratio(values: list[float]) -> float | None:
        return (float(np.mean(values)) + STILL) / (median + STILL) if values and np.isfinite(median) else None

    readings = tuple(SeamReading(b.frame, b.kind, round(float(change[b.frame]), 4),
                                 round(ratio([change[b.frame]]) or 1.0, 4)) for b in at)
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
