"""Head motion: where the face region moved (phase correlation against the reference), and how smoothly."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avatar_render.face.patches import luma, patch
from avatar_render.face.track import TRACK_GROW, PhaseCorrelator
from avatar_render.metrics.regions import Reference
from avatar_render.metrics.series import Track


@dataclass(frozen=True)
class HeadMotionResult:
    face_width_px: float
    speed_mean: float  # face widths per second, mean of |velocity|
    jerk_rms: float  # face widths per second cubed, RMS of the third difference of position
    jitter: float  # RMS frame-to-frame change of velocity / RMS velocity (0 = smooth glide, ~2 = noise)
    travel_max: float  # face widths, largest distance from the reference position
    tracking_peak: float  # mean correlation peak, 1 = the face patch matched perfectly


class HeadTracker:
    """Per frame: where the face moved against the reference (dx, dy in pixels)."""

    def __init__(self, reference: Reference) -> None:
        self.box = reference.layout.face
        self.correlator = PhaseCorrelator(patch(luma(reference.image), self.box, grow=TRACK_GROW))
        self.x, self.y, self.peak = Track(), Track(), Track()

    def update(self, gray: np.ndarray) -> tuple[float, float]:
        """gray: (H, W) float32 -> the face's shift (dx, dy) in pixels."""
        dx, dy, peak = self.correlator.shift(patch(gray, self.box, grow=TRACK_GROW))
        self.x.append(dx)
        self.y.append(dy)
        self.peak.append(peak)
        return dx, dy

    def positions(self) -> np.ndarray:
        """(T, 2) face shift per frame, pixels."""
        return np.stack([self.x.numpy(), self.y.numpy()], axis=1) if len(self.x) else np.zeros((0, 2))

    def result(self, fps: float) -> HeadMotionResult:
        return head_motion_stats(self.positions(), fps=fps, face_width_px=self.box.w, peaks=self.peak.numpy())


def head_motion_stats(pos: np.ndarray, *, fps: float, face_width_px: float,
                      peaks: np.ndarray | None = None) -> HeadMotionResult:
    """Smoothness of a (T, 2) position track in pixels."""
    p = pos / max(face_width_px, 1e-9)
    v = np.diff(p, axis=0)  # face widths per frame
    a = np.diff(v, axis=0)
    j = np.diff(a, axis=0)

    def rms(x: np.ndarray) -> float:
        return float(np.sqrt((x**2).sum(axis=1).mean())) if len(x) else 0.0

    return HeadMotionResult(
        face_width_px=float(face_width_px),
        speed_mean=float(np.linalg.norm(v, axis=1).mean() * fps) if len(v) else 0.0,
        jerk_rms=rms(j) * fps**3,
        jitter=rms(a) / rms(v) if rms(v) > 1e-9 else 0.0,
        travel_max=float(np.linalg.norm(p, axis=1).max()) if len(p) else 0.0,
        tracking_peak=float(np.mean(peaks)) if peaks is not None and len(peaks) else float("nan"),
    )
