"""The reference frame the metrics compare against, where its face, eyes and mouth are, and sub-pixel crops."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avatar_render.face.detect import FaceDetector, choose_face, find_face
from avatar_render.face.fit import fit_to_frame
from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.face.layout import FaceLayout, fallback_layout
from avatar_render.io.reference import load_reference


@dataclass(frozen=True)
class Reference:
    image: np.ndarray  # (H, W, 3) uint8 RGB, in the video's pixels
    layout: FaceLayout  # in the video's pixels
    source: str  # "reference image" or "first frame"
    face_found: bool  # False when the face was assumed at the image centre


def fitted_reference(path: str | Path, width: int, height: int, *, face_box: list[float] | None = None,
                     face_index: int | None = None, landmarks: str = "auto") -> Reference:
    """The reference image fitted to the output frame exactly as the renderer fits it, around the face it
    chose.

    ``face_box`` is [x, y, w, h] in reference pixels (the renderer's ``face.box``); None = detect: the
    largest face, or the ``face_index``-th from the left (``face.index``), among the detector's boxes the
    landmark model ``landmarks`` (``face.landmarks``) sees a face in, as the renderer counts them.
    """
    image = load_reference(path)
    model = None if face_box else find_model(landmarks)
    is_face = None if model is None else LandmarkModel(model).finds_face(image)
    layout, _ = choose_face(image, FaceDetector(index=face_index), face_box, is_face=is_face)
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
