"""Dense face landmarks: MediaPipe's 468-point face mesh model (``face_landmark.tflite``, Apache-2.0)
run by OpenCV's own TFLite reader, on the CPU, from a local file.

The model is not shipped in this repository and never downloaded at run time: the install step
``python scripts/fetch_face_model.py`` takes it out of the ``mediapipe==0.10.21`` wheel on PyPI and
puts it in one of ``model_search_paths()``. Without it, callers place ``face.mesh.template_mesh`` on
the detector's boxes instead (``doctor`` says which one is in use).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.face.detect import IsFace
from avatar_render.face.layout import Box
from avatar_render.face.mesh import LEFT_EYE_UPPER, NUM_POINTS, RIGHT_EYE_UPPER, FaceMesh
from avatar_render.face.models import DNN_LOCK, GET_MODEL, TfliteModel, installed, model_folders, read_tflite

MODEL_FILE = "face_landmark.tflite"
MODEL_SHA256 = "1055cb9d4a9ca8b8c688902a3a5194311138ba256bcc94e336d8373a5f30c814"  # as in mediapipe 0.10.21
_INPUT = 192  # the model's square input, pixels
_ROI_SCALE = 1.5  # crop side / landmark extent, as MediaPipe's tracking crops
_MIN_SCORE = 0.5  # face presence probability below which the landmarks are rejected


def model_search_paths() -> list[Path]:
    """Where an installed model is looked for, first match wins (``face.models.model_folders``)."""
    return [folder / MODEL_FILE for folder in model_folders()]


def find_model(setting: str = "auto") -> Path | None:
    """The model file a ``face.landmarks`` setting names: ``auto`` (an installed one, or None), ``template``
    (None: the template mesh) or a path (which must exist)."""
    if setting == "template":
        return None
    if setting == "auto":
        return installed(MODEL_FILE)
    path = Path(setting).expanduser()
    if not path.is_file():
        what = f"is a folder, not the model's file ({MODEL_FILE})" if path.is_dir() else "does not exist"
        raise AvatarRenderError(
            f"The face landmark model '{path}' (face.landmarks) {what}; get it with {GET_MODEL}, or set "
            "face.landmarks=auto."
        )
    return path


@dataclass(frozen=True)
class Roi:
    """A square crop, rotated by ``angle`` radians (the eye line's tilt), in image pixels."""

    cx: float
    cy: float
    side: float
    angle: float

    def to_input(self) -> np.ndarray:
        """(2, 3) affine from image pixel-edge coordinates to model input coordinates."""
        s = _INPUT / self.side
        c, n = math.cos(self.angle) * s, math.sin(self.angle) * s
        # Rotate by -angle about the centre, scale, move the centre to the middle of the input.
        return np.array(
            [[c, n, _INPUT / 2 - c * self.cx - n * self.cy], [-n, c, _INPUT / 2 + n * self.cx - c * self.cy]],
            np.float64,
        )


class LandmarkModel(TfliteModel):
    name = "face_landmarks"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self._outputs: list[str] = []

    def _load(self) -> None:
        if not self.path.is_file():
            raise AvatarRenderError(f"The face landmark model '{self.path}' is missing; get it with {GET_MODEL}.")
        net, outs = read_tflite(self.path, _INPUT, "face landmark model")
        names = list(outs)
        sizes = [int(np.prod(o.shape)) for o in outs.values()]
        if sorted(sizes) != [1, NUM_POINTS * 3]:
            raise AvatarRenderError(f"The face landmark model '{self.path}' is not MediaPipe's 468-point face mesh.")
        self._outputs = [names[sizes.index(NUM_POINTS * 3)], names[sizes.index(1)]]
        self._net = net

    def from_box(self, image: np.ndarray, box: Box, roll: float = 0.0) -> FaceMesh | None:
        """Landmarks of the face in ``box`` (a detector's face box) of an (H, W, 3) uint8 RGB image, its eye line
        at ``roll`` radians; None if the model sees no face there. The crop is refined twice from the landmarks
        themselves."""
        roi, mesh = _first_roi(box, roll), None
        for _ in range(3):
            found = self.run(image, roi)
            if found is None:
                return mesh
            mesh, roi = found, roi_of(found)
        return mesh

    def finds_face(self, image: np.ndarray) -> IsFace:
        """Whether the model sees a face in a detector's box (and at its roll, radians) of an (H, W, 3) uint8 RGB
        image: the check ``face.detect.choose_face`` takes, which keeps a hand or a patterned shirt the cascade
        took for a face from being animated."""
        return lambda box, roll: self.run(image, _first_roi(box, roll)) is not None

    def track(self, image: np.ndarray, previous: FaceMesh) -> FaceMesh | None:
        """Landmarks in a frame near the previous frame's (one pass, crop from the previous landmarks)."""
        return self.run(image, roi_of(previous))

    def run(self, image: np.ndarray, roi: Roi) -> FaceMesh | None:
        self.load()
        assert self._net is not None
        to_input = roi.to_input()
        centred = to_input.copy()
        centred[:, 2] += to_input[:, :2].sum(axis=1) * 0.5 - 0.5  # cv2 samples at pixel centres
        crop = cv2.warpAffine(
            np.ascontiguousarray(image),
            centred,
            (_INPUT, _INPUT),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_CONSTANT,
        )  # (192, 192, 3) uint8
        with DNN_LOCK:
            self._net.setInput(cv2.dnn.blobFromImage(crop, scalefactor=1 / 255.0))  # RGB in [0, 1], as trained
            points, score = self._net.forward(self._outputs)
        if 1 / (1 + math.exp(-float(score.ravel()[0]))) < _MIN_SCORE:
            return None
        xy = points.reshape(NUM_POINTS, 3)[:, :2].astype(np.float64)  # input pixels
        back = cv2.invertAffineTransform(to_input)
        return FaceMesh(points=(xy @ back[:, :2].T + back[:, 2]).astype(np.float32), source="model")


def _first_roi(box: Box, roll: float) -> Roi:
    """The first crop of the face in a detector's box, its eye line at ``roll`` radians."""
    down = 0.08 * box.h
    return Roi(box.cx - down * math.sin(roll), box.cy + down * math.cos(roll), 1.7 * max(box.w, box.h), roll)


def roi_of(mesh: FaceMesh) -> Roi:
    """The crop MediaPipe tracks a face with: the landmarks' extent along the eye line, times 1.5, square."""
    a, b = mesh.points[LEFT_EYE_UPPER[0]], mesh.points[RIGHT_EYE_UPPER[-1]]  # outer eye corners
    angle = math.atan2(float(b[1] - a[1]), float(b[0] - a[0]))
    c, s = math.cos(angle), math.sin(angle)
    rot = np.array([[c, s], [-s, c]], np.float32)
    p = mesh.points @ rot.T
    lo, hi = p.min(axis=0), p.max(axis=0)
    centre = ((lo + hi) / 2) @ rot
    return Roi(float(centre[0]), float(centre[1]), float(max(hi - lo) * _ROI_SCALE), angle)
