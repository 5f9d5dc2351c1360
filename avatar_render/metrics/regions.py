"""The reference frame the metrics compare against, where its face, eyes and mouth are, and sub-pixel crops."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from avatar_render.face.detect import FaceDetector, find_face
from avatar_render.face.fit import fit_to_frame
from avatar_render.face.layout import Box, FaceLayout, fallback_layout
from avatar_render.io.reference import load_reference

MIN_PATCH = 8  # smallest side of a crop, in pixels


@dataclass(frozen=True)
class Reference:
    image: np.ndarray  # (H, W, 3) uint8 RGB, in the video's pixels
    layout: FaceLayout  # in the video's pixels
    source: str  # "reference image" or "first frame"
    face_found: bool  # False when the face was assumed at the image centre


def fitted_reference(path: str | Path, width: int, height: int, *, face_box: list[float] | None = None) -> Reference:
    """The reference image fitted to the output frame exactly as the renderer fits it.

    ``face_box`` is [x, y, w, h] in reference pixels (the renderer's ``preview.face_box``); None = detect.
    """
    image = load_reference(path)
    layout = find_face(image, FaceDetector(), face_box)
    focus = None if layout is None else (layout.face.x, layout.face.y, layout.face.w, layout.face.h)
    fitted, fit = fit_to_frame(image, width, height, focus=focus)
    found = layout is not None and (layout.detected or bool(face_box))
    layout = fallback_layout(width, height) if layout is None else layout.mapped(fit)
    return Reference(image=fitted, layout=layout, source="reference image", face_found=found)


def frame_reference(frame: np.ndarray, *, face_box: list[float] | None = None) -> Reference:
    """The first frame of the video as the reference; ``face_box`` is [x, y, w, h] in its pixels."""
    detected = find_face(frame, FaceDetector(), face_box)
    found = detected is not None
    layout = detected if detected is not None else fallback_layout(frame.shape[1], frame.shape[0])
    return Reference(image=frame.copy(), layout=layout, source="first frame", face_found=found)


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
