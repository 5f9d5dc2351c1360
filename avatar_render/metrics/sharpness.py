"""Sharpness of the face region over time: the variance of the Laplacian of the grey face patch (moved
with the head), the classic focus measure (Pech-Pacheco et al. 2000). It grows with fine detail and
edge contrast and falls with blur; it depends on the frame size, so compare videos of one size, or
read ``relative``: the face's mean sharpness over the reference face's, fitted to the same size
(1 = as sharp as the reference, below 1 = softer)."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from avatar_render.face.patches import luma, patch
from avatar_render.metrics.regions import Reference
from avatar_render.metrics.series import OverTime, Track

METHOD = "variance of the Laplacian of the grey face patch"


def laplacian_variance(grey: np.ndarray) -> float:
    """(h, w) float32 grey levels 0..255 -> variance of their 3x3 Laplacian."""
    return float(cv2.Laplacian(grey, cv2.CV_32F, ksize=3).var())


@dataclass(frozen=True)
class SharpnessResult:
    method: str
    face: OverTime  # per frame; worst = the softest second
    reference: float  # the reference face's, at the video's size
    relative: float  # face.mean / reference


class FaceSharpness:
    def __init__(self, reference: Reference) -> None:
        self.box = reference.layout.face
        self.reference = laplacian_variance(patch(luma(reference.image), self.box))
        self.values = Track()

    def update(self, gray: np.ndarray, shift: tuple[float, float]) -> None:
        self.values.append(laplacian_variance(patch(gray, self.box, shift=shift)))

    def result(self, fps: float) -> SharpnessResult:
        face = OverTime.of(self.values.numpy(), fps, worst_is_max=False)
        return SharpnessResult(method=METHOD, face=face, reference=self.reference,
                               relative=face.mean / self.reference if self.reference > 0 else float("nan"))
