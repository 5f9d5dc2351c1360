"""The mouth read from face landmarks found in every frame: the inner-lip opening (the distance between
the inner lip contours, in the reference's eye distances). Where the face is small or the camera moves,
this follows the lips where motion in a box around the mouth reads the head, the jaw and the light."""

from __future__ import annotations

import numpy as np

from avatar_render.face.detect import FaceDetector
from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.face.mesh import FaceMesh
from avatar_render.metrics.regions import Reference
from avatar_render.metrics.series import Track

MEASURE = "inner-lip opening from face landmarks"
MIN_FOUND = 0.9  # the share of frames the landmarks must be found in for the opening to be used


class LipOpening:
    """Per frame: the inner-lip opening (NaN where no face is found)."""

    def __init__(self, model: LandmarkModel, reference: Reference) -> None:
        mesh = model.from_box(reference.image, reference.layout.face, reference.layout.roll)
        if mesh is None:
            raise ValueError("no landmarks on the reference")
        self.model, self.scale = model, mesh.eye_distance
        self.detector = FaceDetector()
        self.last: FaceMesh | None = None
        self.values = Track()

    def update(self, frame: np.ndarray) -> None:
        """One pass of the landmark model, from the previous frame's landmarks (from a detection when lost)."""
        mesh = self.model.track(frame, self.last) if self.last is not None else None
        if mesh is None:
            layout = self.detector.detect(frame)
            mesh = self.model.from_box(frame, layout.face) if layout is not None else None
        self.last = mesh
        self.values.append(np.nan if mesh is None else mesh.lip_gap() / self.scale)

    def series(self) -> np.ndarray | None:
        """(T,) the opening, gaps filled from their neighbours; None when too few frames had a face."""
        values = self.values.numpy()
        found = np.isfinite(values)
        if len(values) == 0 or found.mean() < MIN_FOUND:
            return None
        index = np.arange(len(values))
        return np.interp(index, index[found], values[found])


def lip_opening(reference: Reference) -> LipOpening | None:
    """The lip reader, when the landmark model is installed and finds the reference's face; else None."""
    path = find_model("auto")
    if path is None or not reference.face_found:
        return None
    try:
        return LipOpening(LandmarkModel(path), reference)
    except ValueError:
        return None
