"""Preview rendering: one RGB frame from the reference and a row of motion parameters.

Everything that depends only on the reference is computed once in ``FaceRig``; a frame costs two small
remaps (jaw, eyelids) and one affine warp (head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from avatar_render.face.layout import Box, FaceLayout
from avatar_render.preview.motion import DX, DY, EYES, MOUTH, ROLL, ZOOM

INTERIOR = np.array([58, 22, 28], np.float32)  # mouth interior, RGB
INTERIOR_DEEP = np.array([24, 8, 12], np.float32)
TEETH = np.array([226, 220, 208], np.float32)


@dataclass(frozen=True)
class Roi:
    x0: int
    y0: int
    x1: int
    y1: int

    @staticmethod
    def around(x0: float, y0: float, x1: float, y1: float, width: int, height: int) -> "Roi":
        return Roi(max(0, int(x0)), max(0, int(y0)), min(width, int(math.ceil(x1))), min(height, int(math.ceil(y1))))

    @property
    def empty(self) -> bool:
        return self.x1 - self.x0 < 2 or self.y1 - self.y0 < 2

    def grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Pixel coordinates of the region, each (h, w) float32."""
        ys, xs = np.mgrid[self.y0 : self.y1, self.x0 : self.x1].astype(np.float32)
        return xs, ys


@dataclass(frozen=True)
class FaceRig:
    image: np.ndarray  # (H, W, 3) uint8, the fitted reference
    layout: FaceLayout  # in output pixels
    mouth_roi: Roi
    eye_rois: tuple[Roi, Roi]
    lid_colour: tuple[np.ndarray, np.ndarray]  # (3,) float32 skin tone above each eye

    @staticmethod
    def build(image: np.ndarray, layout: FaceLayout) -> "FaceRig":
        h, w = image.shape[:2]
        m, f = layout.mouth, layout.face
        mouth_roi = Roi.around(m.cx - 0.9 * m.w, m.cy - 0.8 * m.h, m.cx + 0.9 * m.w, min(f.y + 1.1 * f.h, m.cy + 1.6 * m.w), w, h)
        eye_rois, lids = [], []
        for e in (layout.left_eye, layout.right_eye):
            eye_rois.append(Roi.around(e.x - 0.15 * e.w, e.y - 0.35 * e.h, e.x + 1.15 * e.w, e.y + 1.15 * e.h, w, h))
            strip = Roi.around(e.x + 0.25 * e.w, e.y - 0.35 * e.h, e.x + 0.75 * e.w, e.y - 0.05 * e.h, w, h)
            patch = image[strip.y0 : max(strip.y1, strip.y0 + 1), strip.x0 : max(strip.x1, strip.x0 + 1)]
            lids.append(patch.reshape(-1, 3).astype(np.float32).mean(axis=0) if patch.size else np.full(3, 160, np.float32))
        return FaceRig(image=image, layout=layout, mouth_roi=mouth_roi, eye_rois=(eye_rois[0], eye_rois[1]), lid_colour=(lids[0], lids[1]))


def render_frame(rig: FaceRig, p: np.ndarray) -> np.ndarray:
    """p: (len(PARAMS),) motion row -> (H, W, 3) uint8."""
    work = rig.image
    if p[MOUTH] > 0.01 or p[EYES] > 0.01:
        work = rig.image.copy()
        if p[MOUTH] > 0.01 and not rig.mouth_roi.empty:
            _open_mouth(work, rig.image, rig.mouth_roi, rig.layout.mouth, float(p[MOUTH]))
        if p[EYES] > 0.01:
            for roi, eye, lid in zip(rig.eye_rois, (rig.layout.left_eye, rig.layout.right_eye), rig.lid_colour):
                if not roi.empty:
                    _close_eye(work, rig.image, roi, eye, lid, float(p[EYES]))
    if not np.any(p[[DX, DY, ROLL, ZOOM]]):
        return work
    f = rig.layout.face
    pivot = (f.cx, f.y + 1.25 * f.h)  # roughly the neck
    m = cv2.getRotationMatrix2D(pivot, float(p[ROLL]), 1.0 + float(p[ZOOM]))
    m[0, 2] += float(p[DX]) * f.w
    m[1, 2] += float(p[DY]) * f.w
    h, w = work.shape[:2]
    return cv2.warpAffine(work, m, (w, h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def _window(u: np.ndarray) -> np.ndarray:
    """Raised cosine: 1 at u = 0, 0 at |u| >= 1."""
    return 0.5 * (1.0 + np.cos(math.pi * np.clip(u, -1.0, 1.0)))


def _open_mouth(dst: np.ndarray, src: np.ndarray, roi: Roi, mouth: Box, amount: float) -> None:
    xs, ys = roi.grid()
    lip = mouth.cy
    drop = 0.42 * mouth.w * amount  # lower lip travel
    lift = 0.1 * drop  # upper lip travel
    wx = _window((xs - mouth.cx) / (0.85 * mouth.w))
    below = ys >= lip
    chin = roi.y1 - lip
    fy_below = np.clip(1.0 - (ys - lip - 0.45 * chin) / (0.55 * chin), 0.0, 1.0)
    fy_above = np.clip(1.0 - (lip - ys) / (0.8 * mouth.h), 0.0, 1.0)
    shift = np.where(below, -drop * wx * fy_below, lift * wx * fy_above)
    region = cv2.remap(src, xs, ys + shift, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE).astype(np.float32)
    # The gap between the lips: a dark interior, teeth showing at the top when wide open.
    top, bottom = lip - lift, lip + drop
    half_w = 0.42 * mouth.w * (0.8 + 0.2 * amount)
    u = (xs - mouth.cx) / half_w
    v = (ys - top) / max(bottom - top, 1e-3)
    inside = np.clip((1.0 - u**2 - (2 * v - 1) ** 2) * max(bottom - top, 1.0) * 0.5, 0.0, 1.0)[..., None]
    depth = np.clip(v, 0, 1)[..., None]
    colour = INTERIOR * (1 - depth) + INTERIOR_DEEP * depth
    teeth = (np.clip(1.0 - v / 0.28, 0, 1) * min(1.0, max(0.0, (amount - 0.25) * 2.5)) * 0.85)[..., None]
    colour = colour * (1 - teeth) + TEETH * teeth
    region = region * (1 - inside) + colour * inside
    dst[roi.y0 : roi.y1, roi.x0 : roi.x1] = np.clip(region + 0.5, 0, 255).astype(np.uint8)


def _close_eye(dst: np.ndarray, src: np.ndarray, roi: Roi, eye: Box, lid: np.ndarray, amount: float) -> None:
    xs, ys = roi.grid()
    wx = _window((xs - eye.cx) / (0.62 * eye.w))
    top = eye.y + 0.05 * eye.h
    edge = top + amount * 0.8 * eye.h * wx  # the lid's lower edge, curved
    covered = np.clip(edge - ys + 0.5, 0.0, 1.0) * (ys >= top - 1) * np.clip(wx * 3.0, 0.0, 1.0)
    region = src[roi.y0 : roi.y1, roi.x0 : roi.x1].astype(np.float32)
    skin = cv2.remap(src, xs, np.minimum(ys, top - 0.1 * eye.h) - 0.15 * eye.h, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    skin = 0.5 * skin.astype(np.float32) + 0.5 * lid
    region = region * (1 - covered[..., None]) + skin * covered[..., None]
    lash = (np.clip(1.2 - np.abs(ys - edge), 0, 1) * (amount > 0.3) * np.clip(wx * 2.0, 0, 1) * 0.6)[..., None]
    region = region * (1 - lash) + 30.0 * lash
    dst[roi.y0 : roi.y1, roi.x0 : roi.x1] = np.clip(region + 0.5, 0, 255).astype(np.uint8)
