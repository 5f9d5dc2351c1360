"""Where the face, eyes and mouth are: boxes in continuous pixel coordinates (a pixel spans [i, i + 1)),
placed from a face box by the proportions of a frontal face when nothing finer is known."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avatar_render.face.fit import Fit

# Proportions of a frontal face in a detector-style face box (brows to just under the mouth, cheek to
# cheek), measured on frontal portraits; sizes of eyes and lips are fractions of the eye distance.
EYE_Y = 0.36  # eye centres, from the top of the box / box height
EYE_GAP = 0.40  # distance between the eye centres / box width
MOUTH_Y = 0.80  # lips centre, from the top of the box / box height
_MOUTH_DOWN = 1.05  # lips centre below the eye midpoint / eye distance
_EYE_W, _EYE_H = 0.46, 0.24  # eye box / eye distance
_MOUTH_W, _MOUTH_H = 0.90, 0.30  # lips box (closed mouth) / eye distance
_TILT_DEAD_ZONE = np.radians(5)  # eye-line tilts below this are detector noise, not head roll


@dataclass(frozen=True)
class Box:
    x: float
    y: float
    w: float
    h: float

    @property
    def cx(self) -> float:
        return self.x + self.w / 2

    @property
    def cy(self) -> float:
        return self.y + self.h / 2

    @classmethod
    def around(cls, cx: float, cy: float, w: float, h: float) -> Box:
        return cls(float(cx - w / 2), float(cy - h / 2), float(w), float(h))

    def scaled(self, fit: Fit) -> Box:
        """Reference pixels -> output pixels."""
        s = fit.scale
        return Box(self.x * s - fit.offset_x, self.y * s - fit.offset_y, self.w * s, self.h * s)


@dataclass(frozen=True)
class FaceLayout:
    face: Box
    left_eye: Box  # eye on the image's left side
    right_eye: Box
    mouth: Box  # the lips region, closed mouth
    detected: bool  # False when it came from the fallback or a configured box
    roll: float = 0.0  # radians, the eye line's angle where the face was found in a turned copy of the picture

    def mapped(self, fit: Fit) -> FaceLayout:
        """Into output pixel coordinates."""
        return FaceLayout(
            face=self.face.scaled(fit),
            left_eye=self.left_eye.scaled(fit),
            right_eye=self.right_eye.scaled(fit),
            mouth=self.mouth.scaled(fit),
            detected=self.detected,
            roll=self.roll,
        )


def layout_from_box(box: Box, *, detected: bool = False) -> FaceLayout:
    """Eyes and lips placed by the proportions of a typical frontal face inside ``box``.

    The box is expected framed like a frontal-face detector's: from the brows to just under the
    mouth, cheek to cheek.
    """
    d = EYE_GAP * box.w
    eye_y = box.y + EYE_Y * box.h
    return FaceLayout(
        face=box,
        left_eye=Box.around(box.cx - d / 2, eye_y, _EYE_W * d, _EYE_H * d),
        right_eye=Box.around(box.cx + d / 2, eye_y, _EYE_W * d, _EYE_H * d),
        mouth=Box.around(box.cx, box.y + MOUTH_Y * box.h, _MOUTH_W * d, _MOUTH_H * d),
        detected=detected,
    )


def fallback_layout(width: int, height: int) -> FaceLayout:
    """No face found: a plausible face box in the middle-upper part of a (height, width) image."""
    side = 0.42 * min(width, height)
    return layout_from_box(Box.around(width / 2, 0.4 * height, side, side))


def layout_with_eyes(face: Box, left: tuple[float, float], right: tuple[float, float]) -> FaceLayout:
    """Layout from a detected face box and eye centres (image-left eye first).

    Eye detections are precise on sharp portraits but noisy on soft ones, while the face box is
    steady; the lips are placed half way between the estimates from each.
    """
    prior = layout_from_box(face, detected=True)
    ex, ey = right[0] - left[0], right[1] - left[1]
    d = float(np.hypot(ex, ey))
    tilt = float(np.arctan2(ey, ex))
    tilt = float(np.sign(tilt)) * max(0.0, abs(tilt) - _TILT_DEAD_ZONE)
    # The lips lie along the face's own vertical, perpendicular to the (tilted) eye line.
    mid_x, mid_y = (left[0] + right[0]) / 2, (left[1] + right[1]) / 2
    lips_x = mid_x - _MOUTH_DOWN * d * np.sin(tilt)
    lips_y = mid_y + _MOUTH_DOWN * d * np.cos(tilt)
    size = (d + EYE_GAP * face.w) / 2  # eye distance, steadied by the box's
    return FaceLayout(
        face=face,
        left_eye=Box.around(*left, _EYE_W * size, _EYE_H * size),
        right_eye=Box.around(*right, _EYE_W * size, _EYE_H * size),
        mouth=Box.around(
            (lips_x + prior.mouth.cx) / 2, (lips_y + prior.mouth.cy) / 2, _MOUTH_W * size, _MOUTH_H * size
        ),
        detected=True,
    )
