"""Sub-pixel crops of frames and the face's moving parts (mouth, eyes), in continuous pixel coordinates:
shared by the metrics and the backends' face guards."""

from __future__ import annotations

import cv2
import numpy as np

from avatar_render.face.layout import Box, FaceLayout

MIN_PATCH = 8  # smallest side of a crop, in pixels


def mouth_region(layout: FaceLayout) -> Box:
    """Lips plus the travel of the lower lip and jaw when the mouth opens."""
    m = layout.mouth
    top, bottom = m.cy - 0.9 * m.h, m.cy + 0.6 * m.w
    return Box(m.cx - 0.7 * m.w, top, 1.4 * m.w, bottom - top)


def eye_regions(layout: FaceLayout) -> tuple[Box, Box]:
    """Each eye with its lid and some skin around it."""
    return tuple(Box.around(e.cx, e.cy, 1.3 * e.w, 1.6 * e.h) for e in (layout.left_eye, layout.right_eye))  # type: ignore[return-value]


def patch(image: np.ndarray, box: Box, *, shift: tuple[float, float] = (0.0, 0.0), grow: float = 1.0) -> np.ndarray:
    """The box (grown about its centre, moved by ``shift`` pixels) cut from ``image`` with sub-pixel
    accuracy; pixels outside the image repeat its border. (H, W[, C]) -> (h, w[, C]), same dtype."""
    w = max(MIN_PATCH, int(round(box.w * grow)))
    h = max(MIN_PATCH, int(round(box.h * grow)))
    # getRectSubPix takes the centre in pixel-centre coordinates; boxes use pixel edges.
    centre = (float(box.cx + shift[0] - 0.5), float(box.cy + shift[1] - 0.5))
    return cv2.getRectSubPix(np.ascontiguousarray(image), (w, h), centre)


def luma(frame: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (H, W) float32 grey levels 0..255."""
    return cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY).astype(np.float32)
