"""Colour drift: CIEDE2000 between the mean CIELAB colour of a region and the same region of the reference.

Comparing region means (rather than pixel by pixel) measures a colour cast or a brightness change
and ignores motion: a mouth that opens or a head that sways moves pixels, not the region's mean colour.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from avatar_render.face.layout import FaceLayout
from avatar_render.face.patches import eye_regions, mouth_region, patch
from avatar_render.metrics.regions import Reference
from avatar_render.metrics.series import OverTime, Track

NOTICEABLE_DE = 2.0  # CIEDE2000 difference an attentive viewer notices side by side
_WORK_SIDE = 160  # frames are area-averaged to at most this side before the colour conversion


def rgb_to_lab(rgb: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 sRGB -> (..., 3) float32 CIELAB (D65): L in 0..100, a and b about -128..127."""
    flat = np.ascontiguousarray(rgb, dtype=np.float32).reshape(-1, 1, 3) / 255.0
    return cv2.cvtColor(flat, cv2.COLOR_RGB2Lab).reshape(rgb.shape)


def mean_lab(rgb: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (3,) mean CIELAB colour of its pixels (those where the (H, W) bool mask is set)."""
    h, w = rgb.shape[:2]
    scale = _WORK_SIDE / max(h, w)
    if scale < 1:
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        rgb = cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)
        if mask is not None:
            mask = cv2.resize(mask.astype(np.uint8), size, interpolation=cv2.INTER_NEAREST).astype(bool)
    lab = rgb_to_lab(rgb).reshape(-1, 3)
    if mask is not None and mask.any():
        lab = lab[mask.ravel()]
    return lab.mean(axis=0, dtype=np.float64)


def skin_mask(layout: FaceLayout) -> np.ndarray:
    """(h, w) bool over the face box's patch: True outside the eye and mouth regions, which move."""
    face = layout.face
    h, w = patch(np.zeros((1, 1), np.uint8), face).shape
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    xs = face.cx - w / 2 + xs + 0.5  # pixel centres in video coordinates
    ys = face.cy - h / 2 + ys + 0.5
    keep = np.ones((h, w), bool)
    for box in (mouth_region(layout), *eye_regions(layout)):
        keep &= ~((xs >= box.x) & (xs < box.x + box.w) & (ys >= box.y) & (ys < box.y + box.h))
    return keep


def ciede2000(lab1: np.ndarray, lab2: np.ndarray) -> np.ndarray:
    """CIEDE2000 colour difference (kL = kC = kH = 1) of (..., 3) CIELAB arrays (Sharma, Wu, Dalal 2005)."""
    L1, a1, b1 = np.moveaxis(np.asarray(lab1, np.float64), -1, 0)
    L2, a2, b2 = np.moveaxis(np.asarray(lab2, np.float64), -1, 0)
    c_bar7 = ((np.hypot(a1, b1) + np.hypot(a2, b2)) / 2) ** 7
    g = 0.5 * (1 - np.sqrt(c_bar7 / (c_bar7 + 25.0**7)))
    a1p, a2p = (1 + g) * a1, (1 + g) * a2
    c1p, c2p = np.hypot(a1p, b1), np.hypot(a2p, b2)
    h1p = np.degrees(np.arctan2(b1, a1p)) % 360
    h2p = np.degrees(np.arctan2(b2, a2p)) % 360
    dLp, dCp = L2 - L1, c2p - c1p
    dh = h2p - h1p
    dh = np.where(dh > 180, dh - 360, np.where(dh < -180, dh + 360, dh))
    dh = np.where(c1p * c2p == 0, 0.0, dh)
    dHp = 2 * np.sqrt(c1p * c2p) * np.sin(np.radians(dh / 2))
    Lp_bar, Cp_bar = (L1 + L2) / 2, (c1p + c2p) / 2
    h_sum = h1p + h2p
    hp_bar = np.where(
        c1p * c2p == 0, h_sum,
        np.where(np.abs(h1p - h2p) <= 180, h_sum / 2, np.where(h_sum < 360, (h_sum + 360) / 2, (h_sum - 360) / 2)),
    )
    t = (1 - 0.17 * np.cos(np.radians(hp_bar - 30)) + 0.24 * np.cos(np.radians(2 * hp_bar))
         + 0.32 * np.cos(np.radians(3 * hp_bar + 6)) - 0.20 * np.cos(np.radians(4 * hp_bar - 63)))
    d_theta = 30 * np.exp(-(((hp_bar - 275) / 25) ** 2))
    cp_bar7 = Cp_bar**7
    r_c = 2 * np.sqrt(cp_bar7 / (cp_bar7 + 25.0**7))
    s_l = 1 + 0.015 * (Lp_bar - 50) ** 2 / np.sqrt(20 + (Lp_bar - 50) ** 2)
    s_c = 1 + 0.045 * Cp_bar
    s_h = 1 + 0.015 * Cp_bar * t
    r_t = -np.sin(np.radians(2 * d_theta)) * r_c
    return np.sqrt((dLp / s_l) ** 2 + (dCp / s_c) ** 2 + (dHp / s_h) ** 2 + r_t * (dCp / s_c) * (dHp / s_h))


@dataclass(frozen=True)
class ColourDriftResult:
    face: OverTime  # CIEDE2000 of the face's mean skin colour (eyes and mouth left out) against the reference's
    frame: OverTime  # the same for the whole frame
    first_noticeable_s: float | None  # start of the first second whose face or frame drift reaches NOTICEABLE_DE


class ColourDrift:
    """Per frame: CIEDE2000 of the mean colour of the face's skin and of the whole frame against the reference."""

    def __init__(self, reference: Reference) -> None:
        self.face_box = reference.layout.face
        self.mask = skin_mask(reference.layout)
        self.ref_face = mean_lab(patch(reference.image, self.face_box), self.mask)
        self.ref_frame = mean_lab(reference.image)
        self.face, self.frame = Track(), Track()

    def update(self, frame: np.ndarray, shift: tuple[float, float], *, against: np.ndarray | None = None) -> None:
        """frame: (H, W, 3) uint8 RGB; shift: where the face moved, in pixels; against: the source frame at the
        same time (a video reference), whose face moved with it, compared instead of the reference."""
        ref_face, ref_frame = self.ref_face, self.ref_frame
        if against is not None:
            ref_face = mean_lab(patch(against, self.face_box, shift=shift), self.mask)
            ref_frame = mean_lab(against)
        self.face.append(ciede2000(mean_lab(patch(frame, self.face_box, shift=shift), self.mask), ref_face))
        self.frame.append(ciede2000(mean_lab(frame), ref_frame))

    def result(self, fps: float) -> ColourDriftResult:
        face, frame = OverTime.of(self.face.numpy(), fps), OverTime.of(self.frame.numpy(), fps)
        worst = np.fmax(np.array(face.per_second), np.array(frame.per_second))
        over = np.flatnonzero(worst >= NOTICEABLE_DE)
        return ColourDriftResult(face=face, frame=frame, first_noticeable_s=float(over[0]) if len(over) else None)
