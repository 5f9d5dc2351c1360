"""Identity similarity to the reference over time, by a classical proxy.

No face-recognition embedding whose weights ship inside an installed package is available, so this
compares histograms of oriented gradients (HOG, Dalal and Triggs 2005) of the face crop: the face
(moved with the head) is resampled to 96x96 grey, described by OpenCV's HOG (8x8-pixel cells,
9 orientations, 16x16 blocks), square-rooted, and compared by cosine similarity. It follows the
shape of the face (outline, eyes, nose, mouth) and shrugs off codec noise and brightness changes,
so a different, smeared or deformed face lowers it; it is not a face-recognition score, and an
open mouth or closed eyes lower it a little too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avatar_render.face.identity import face_descriptor
from avatar_render.face.patches import luma, patch
from avatar_render.metrics.regions import Reference
from avatar_render.metrics.series import OverTime, Track

METHOD = "proxy: HOG cosine of the face crop (not a face-recognition embedding)"


@dataclass(frozen=True)
class IdentityResult:
    method: str
    similarity: OverTime  # 1 = same as the reference; worst = lowest second


class IdentityTracker:
    def __init__(self, reference: Reference) -> None:
        self.box = reference.layout.face
        self.ref = face_descriptor(patch(luma(reference.image), self.box))
        self.values = Track()

    def update(self, gray: np.ndarray, shift: tuple[float, float], *, against: np.ndarray | None = None) -> None:
        """against: (H, W) grey of the source frame at the same time (a video reference), compared instead."""
        ref = self.ref if against is None else face_descriptor(patch(against, self.box, shift=shift))
        self.values.append(float(face_descriptor(patch(gray, self.box, shift=shift)) @ ref))

    def result(self, fps: float) -> IdentityResult:
        return IdentityResult(method=METHOD, similarity=OverTime.of(self.values.numpy(), fps, worst_is_max=False))
