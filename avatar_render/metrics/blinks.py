"""Blinks: short excursions of the eye regions away from their open appearance in the reference.

Eye closure at frame t is how much brighter than in the reference the dark core of both eye regions
(moved with the head) is: the darkest quarter of each region's open pixels (lashes, iris, the eye's
slit), which a closing lid covers with skin. A blink is a run of frames where it rises well above its
running median (the open-eye level) for at most ``MAX_BLINK_S``. (The whole regions' mean absolute
change missed the blinks of narrow, smiling eyes, whose slit is a small part of the region: they rose
8-17 % of the regions' contrast, under the bar that kept head motion out.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avatar_render.face.patches import eye_regions, luma, patch
from avatar_render.metrics.regions import Reference
from avatar_render.metrics.series import Track, running_median

BASELINE_S = 2.0  # window of the running median that gives the open-eye level
MAX_BLINK_S = 0.8  # longer closures are not blinks (eyes shut, occlusion, a cut)
MERGE_S = 0.1  # runs closer than this are one blink
CORE = 25  # percentile of an open eye region's grey levels under which a pixel is its dark core
MIN_RISE = 0.08  # a blink brightens the core by at least this fraction of its depth under the region's median
NOISE_K = 6.0  # ... and this many robust noise deviations above the open-eye level


@dataclass(frozen=True)
class BlinkResult:
    count: int
    per_minute: float
    times_s: tuple[float, ...]  # start of each blink


class EyeClosure:
    def __init__(self, reference: Reference) -> None:
        gray = luma(reference.image)
        self.boxes = eye_regions(reference.layout)
        self.open = [patch(gray, b) for b in self.boxes]
        self.cores = [o <= np.percentile(o, CORE) for o in self.open]
        self.depth = float(np.mean([np.median(o) - o[c].mean() for o, c in zip(self.open, self.cores)]))
        self.values = Track()

    def update(self, gray: np.ndarray, shift: tuple[float, float]) -> None:
        self.values.append(float(np.mean([(patch(gray, b, shift=shift) - o)[c].mean()
                                          for b, o, c in zip(self.boxes, self.open, self.cores)])))

    def result(self, fps: float) -> BlinkResult:
        return count_blinks(self.values.numpy(), fps=fps, depth=self.depth)


def count_blinks(closure: np.ndarray, *, fps: float, depth: float) -> BlinkResult:
    """closure: (T,) per-frame brightening of the eyes' dark core, grey levels; depth: how far under the
    open regions' median grey level that core lies in the reference."""
    n = len(closure)
    if n == 0:
        return BlinkResult(0, 0.0, ())
    width = max(3, int(round(BASELINE_S * fps)) | 1)
    rise = closure - running_median(closure, width)
    steps = np.abs(np.diff(closure))
    noise = 1.4826 * float(np.median(steps)) / np.sqrt(2) if len(steps) else 0.0  # frame-to-frame noise, robust
    threshold = max(NOISE_K * noise, MIN_RISE * depth, 1.0)
    above = np.flatnonzero(rise > threshold)
    runs: list[list[int]] = []
    gap = max(1, int(round(MERGE_S * fps)))
    for f in above.tolist():
        if runs and f - runs[-1][1] <= gap:
            runs[-1][1] = f
        else:
            runs.append([f, f])
    blinks = [a for a, b in runs if (b - a + 1) <= MAX_BLINK_S * fps]
    minutes = n / fps / 60.0
    return BlinkResult(count=len(blinks), per_minute=len(blinks) / minutes,
                       times_s=tuple(round(a / fps, 3) for a in blinks))
