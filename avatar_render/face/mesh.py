"""The 468-point face mesh (MediaPipe's topology): named contours, a few measures, and a template for
when no landmark model is installed.

Points are (x, y) in continuous pixel-edge coordinates, like every box in ``face.layout``. "Left" and
"right" are the image's sides (the subject's right eye is on the image's left).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avatar_render.face.fit import Fit
from avatar_render.face.layout import Box, FaceLayout

NUM_POINTS = 468

# Contours, each from one corner to the other, image-left to image-right.
LIPS_OUTER_UPPER = (61, 185, 40, 39, 37, 0, 267, 269, 270, 409, 291)
LIPS_OUTER_LOWER = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291)
LIPS_INNER_UPPER = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308)
LIPS_INNER_LOWER = (78, 95, 88, 178, 87, 14, 317, 402, 318, 324, 308)
LEFT_EYE_UPPER = (33, 246, 161, 160, 159, 158, 157, 173, 133)
LEFT_EYE_LOWER = (33, 7, 163, 144, 145, 153, 154, 155, 133)
RIGHT_EYE_UPPER = (362, 398, 384, 385, 386, 387, 388, 466, 263)
RIGHT_EYE_LOWER = (362, 382, 381, 380, 374, 373, 390, 249, 263)
EYES = ((LEFT_EYE_UPPER, LEFT_EYE_LOWER), (RIGHT_EYE_UPPER, RIGHT_EYE_LOWER))  # each eye's (upper, lower) lid
FACE_OVAL = (
    10,
    338,
    297,
    332,
    284,
    251,
    389,
    356,
    454,
    323,
    361,
    288,
    397,
    365,
    379,
    378,
    400,
    377,
    152,
    148,
    176,
    149,
    150,
    136,
    172,
    58,
    132,
    93,
    234,
    127,
    162,
    21,
    54,
    103,
    67,
    109,
)  # closed loop
CHIN = 152
# Points that move with the skull only (no lips, jaw, lids): forehead, nose bridge and tip, eye corners, temples.
RIGID = (10, 151, 9, 8, 168, 6, 197, 195, 5, 4, 1, 33, 133, 362, 263, 127, 356, 234, 454, 70, 300, 105, 334)

_TEMPLATE = Path(__file__).with_name("mesh_template.npy")


@dataclass(frozen=True, eq=False)
class FaceMesh:
    points: np.ndarray  # (468, 2) float32, pixels
    source: str  # "model" (landmarks found in the image) or "template" (placed on the detector's boxes)

    def mapped(self, fit: Fit) -> FaceMesh:
        """Reference pixels -> output pixels."""
        p = self.points * np.float32(fit.scale) - np.array([fit.offset_x, fit.offset_y], np.float32)
        return FaceMesh(points=p.astype(np.float32), source=self.source)

    def at(self, idx) -> np.ndarray:
        return self.points[list(idx)]

    @property
    def left_eye_centre(self) -> np.ndarray:
        return self.at(LEFT_EYE_UPPER + LEFT_EYE_LOWER).mean(axis=0)

    @property
    def right_eye_centre(self) -> np.ndarray:
        return self.at(RIGHT_EYE_UPPER + RIGHT_EYE_LOWER).mean(axis=0)

    @property
    def eye_distance(self) -> float:
        return float(np.linalg.norm(self.right_eye_centre - self.left_eye_centre))

    @property
    def mouth_centre(self) -> np.ndarray:
        return self.at(LIPS_OUTER_UPPER + LIPS_OUTER_LOWER).mean(axis=0)

    def axes(self) -> tuple[np.ndarray, np.ndarray]:
        """Unit vectors of the face: along the eye line (to the image's right) and down the face (read-only:
        worked out once, the points never change; the preview's drawing asks a dozen times a frame)."""
        known = self.__dict__.get("_axes")
        if known is None:
            ex = self.right_eye_centre - self.left_eye_centre
            ex = ex / max(float(np.linalg.norm(ex)), 1e-6)
            known = (ex.astype(np.float32), np.array([-ex[1], ex[0]], np.float32))
            for v in known:
                v.flags.writeable = False
            object.__setattr__(self, "_axes", known)  # (a frozen dataclass)
        return known

    def mouth_width(self) -> float:
        """Corner to corner of the lips."""
        return float(np.linalg.norm(self.points[291] - self.points[61]))

    def lip_gap(self) -> float:
        """Mean distance between the inner lip contours (their middle five points), along the face's vertical."""
        _, ey = self.axes()
        up, low = self.at(LIPS_INNER_UPPER[3:8]), self.at(LIPS_INNER_LOWER[3:8])
        return float(max(0.0, ((low - up) @ ey).mean()))

    def eye_opening(self) -> float:
        """Mean lid distance of both eyes over their widths (about 0.25-0.35 open, under 0.1 closed)."""
        out = []
        for upper, lower in EYES:
            u, lo = self.at(upper[2:7]), self.at(lower[2:7])
            width = float(np.linalg.norm(self.points[upper[-1]] - self.points[upper[0]]))
            out.append(float(np.linalg.norm(lo - u, axis=1).mean()) / max(width, 1e-6))
        return float(np.mean(out))

    def layout(self, *, detected: bool) -> FaceLayout:
        """Boxes from the mesh: the face (detector-style framing, brows to under the lips), eyes and lips."""
        ex, ey = self.axes()
        d = self.eye_distance
        oval = self.at(FACE_OVAL)
        x0, x1 = float(oval[:, 0].min()), float(oval[:, 0].max())
        top = float(min(self.left_eye_centre[1], self.right_eye_centre[1])) - 0.36 * (x1 - x0)
        lips = self.at(LIPS_OUTER_UPPER + LIPS_OUTER_LOWER)
        bottom = float(lips[:, 1].max()) + 0.1 * d
        eyes = []
        for upper, lower in EYES:
            pts = self.at(upper + lower)
            c = pts.mean(axis=0)
            eyes.append(Box.around(c[0], c[1], 0.46 * d, 0.24 * d))
        lx0, ly0 = lips.min(axis=0)
        lx1, ly1 = lips.max(axis=0)
        return FaceLayout(
            face=Box(x0, top, x1 - x0, bottom - top),
            left_eye=eyes[0],
            right_eye=eyes[1],
            mouth=Box(float(lx0), float(ly0), float(lx1 - lx0), float(ly1 - ly0)),
            detected=detected,
        )


def template_mesh(layout: FaceLayout) -> FaceMesh:
    """The template face placed on a layout: its eye centres on the layout's eyes, its lips on the layout's lips.

    The template (``mesh_template.npy``, written by scripts/fixtures/make_mesh_template.py) has closed lips and
    is normalised to eye centres at (-0.5, 0) and (0.5, 0).
    """
    t = np.load(_TEMPLATE).astype(np.float32)  # (468, 2)
    lips = t[list(LIPS_OUTER_UPPER + LIPS_OUTER_LOWER)].mean(axis=0)
    src = np.array([[-0.5, 0.0], [0.5, 0.0], lips], np.float32)
    dst = np.array(
        [
            [layout.left_eye.cx, layout.left_eye.cy],
            [layout.right_eye.cx, layout.right_eye.cy],
            [layout.mouth.cx, layout.mouth.cy],
        ],
        np.float32,
    )
    a = _affine_from_3(src, dst)
    return FaceMesh(points=(t @ a[:, :2].T + a[:, 2]).astype(np.float32), source="template")


def normalise_template(points: np.ndarray) -> np.ndarray:
    """(468, 2) landmarks -> the template form: lips closed, eye centres at (-0.5, 0) and (0.5, 0)."""
    mesh = FaceMesh(points=points.astype(np.float32), source="model")
    left, right = mesh.left_eye_centre, mesh.right_eye_centre
    ex, ey = mesh.axes()
    d = mesh.eye_distance
    mid = (left + right) / 2
    out = np.stack([(points - mid) @ ex, (points - mid) @ ey], axis=1) / d
    up, low = list(LIPS_INNER_UPPER), list(LIPS_INNER_LOWER)
    closed = (out[up] + out[low]) / 2
    out[up], out[low] = closed, closed
    return out.astype(np.float32)


def _affine_from_3(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The (2, 3) affine map taking three points onto three points."""
    a = np.concatenate([src, np.ones((3, 1), np.float32)], axis=1)  # (3, 3)
    return np.linalg.solve(a, dst).T.astype(np.float32)
