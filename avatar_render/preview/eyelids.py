"""The lower eyelids where the reference shows them, not where the landmark model guessed them.

Behind spectacle rims, and on narrow or shadowed eyes, the model's lower lid contour can lie a few pixels
down on the cheek. A blink brings the upper lid down to that contour: over skin that was never part of
the eye, dragging the lashes' dark band into a thick wedge. Each lower lid point (corners left where
they are) is moved up to where the colours along the face's vertical change from the eye's to the skin
below it, never down and never past half the eye's opening.
"""

from __future__ import annotations

import cv2
import numpy as np

from avatar_render.face import mesh as fm

SKIN_BAND = (0.15, 0.25)  # where below the lower lid its skin colour is read, in eye widths
REACH_OUT = 0.12  # how far below the contour the edge is looked for, in eye widths
MAX_UP = 0.5  # at most this share of the eye's opening
STEP = 0.5  # px between samples along the vertical
MIN_FALL = 4.0  # weakest edge taken (fall of the colour distance to the skin per pixel, CIELAB units)
_WEIGHT = np.array([1.0, 1.5, 1.5], np.float32)  # chroma counts more than lightness (shadows under the eye)


def fit_lower_lids(image: np.ndarray, mesh: fm.FaceMesh) -> fm.FaceMesh:
    """The mesh with each eye's lower lid moved up to the eye's visible lower edge (an (H, W, 3) uint8 RGB image)."""
    ex, ey = mesh.axes()
    points = mesh.points.copy()
    moved = False
    for upper, lower in fm.EYES:
        width = float(np.linalg.norm(points[upper[-1]] - points[upper[0]]))
        lids = list(lower[1:-1])
        opening = (points[lids] - points[list(upper[1:-1])]) @ ey  # (K,)
        if width < 8 or opening.mean() <= 2 * STEP:
            continue
        # (only the eye's surroundings are converted: the whole frame cost 40 ms at 1080p before the first frame)
        x0, y0 = np.maximum(np.floor(points[list(upper + lower)].min(axis=0) - 0.4 * width - 2), 0).astype(int)
        x1, y1 = np.ceil(points[list(upper + lower)].max(axis=0) + 0.4 * width + 2).astype(int)
        lab = cv2.cvtColor(image[y0:y1, x0:x1].astype(np.float32) / 255, cv2.COLOR_RGB2LAB)
        at = points[lids] - np.array([x0, y0], np.float32)
        skin = np.median(_samples(lab, at, ey, ex, np.linspace(*SKIN_BAND, 5) * width).reshape(-1, 3), axis=0)
        offsets = np.arange(-MAX_UP * opening.mean(), REACH_OUT * width + 1e-6, STEP, dtype=np.float32)
        far = np.linalg.norm((_samples(lab, at, ey, ex, offsets) - skin) * _WEIGHT, axis=-1)  # (K, n)
        fall = -np.gradient(far, STEP, axis=1)
        best = fall.argmax(axis=1)
        up = np.where(fall[np.arange(len(lids)), best] >= MIN_FALL, -np.minimum(offsets[best], 0.0), 0.0)
        up = np.minimum(np.convolve(np.pad(up, 1, mode="edge"), np.ones(3) / 3, mode="valid"), MAX_UP * opening)
        along = np.arange(1, len(lids) + 1) / (len(lids) + 1)
        up *= np.minimum(1.0, 4 * np.minimum(along, 1 - along))  # (the contour meets its fixed corners smoothly)
        points[lids] -= up[:, None].astype(np.float32) * ey
        moved = moved or bool(up.max() > 0)
    return fm.FaceMesh(points=points, source=mesh.source) if moved else mesh


def _samples(lab: np.ndarray, at: np.ndarray, down: np.ndarray, across: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(K, len(offsets), 3) CIELAB colours at ``offsets`` px down from each of the (K, 2) points, each the mean of
    three samples a pixel apart across."""
    out = 0.0
    for side in (-1.0, 0.0, 1.0):
        q = at[:, None, :] + offsets[None, :, None] * down + side * across
        x, y = (q[..., 0] - 0.5).astype(np.float32), (q[..., 1] - 0.5).astype(np.float32)
        out = out + cv2.remap(lab, x, y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return out / 3
