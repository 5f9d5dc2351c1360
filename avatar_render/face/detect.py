"""Face detection with OpenCV's bundled Haar cascades: the largest frontal face, its eyes and lips (and, in a
reference, the faces a second detector finds that the cascade missed: ``face.finder``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.face import finder
from avatar_render.face.layout import (
    EYE_GAP,
    EYE_Y,
    Box,
    FaceLayout,
    layout_from_box,
    layout_with_eyes,
)
from avatar_render.pipeline.module import Module

_FACE_CASCADE = "haarcascade_frontalface_alt2.xml"
_EYE_CASCADES = ("haarcascade_eye.xml", "haarcascade_eye_tree_eyeglasses.xml")
_DETECT_SIDE = 640  # longest side of the copy the face is searched in
_SMALL_FACE_SIDE = 1600  # ... and of the one searched again, for smaller faces, when it has none
_EYE_FACE_WIDTH = 240  # the face is resampled to this width for the eye search
# Heads tilted further than the cascade sees (about 15-20 degrees): searched for in copies of the picture turned
# by these angles, when it shows no upright face
_ROLLS = (25.0, -25.0, 45.0, -45.0)
# ... and, where a closer look (``IsFace``) tells faces from what the cascade fires on, by these: a picture lying on
# its side or upside down (a photo whose orientation tag was lost), animated as it lies. Without that look they are
# not searched: the cascade fires on an upside-down face, whose layout would put a mouth on its forehead.
_TURNS = (90.0, -90.0, 180.0)
_LYING = 60.0  # a face turned further than this (degrees) is named in the render's output

# A closer look at a box the cascade found (and the eye line's roll, radians): whether it holds a face. The cascade
# also fires on hands and fabric; the landmark model, where installed, tells them apart (``LandmarkModel.finds_face``).
IsFace = Callable[[Box, float], bool]


class FaceDetector(Module):
    """Largest frontal face, its eyes and lips, with OpenCV's bundled Haar cascades."""

    name = "face_detector"

    def __init__(self, *, index: int | None = None) -> None:
        super().__init__()
        self.index = index  # which face: the index-th from the left (from 1); None: the largest
        self._face: cv2.CascadeClassifier | None = None
        self._eyes: list[cv2.CascadeClassifier] = []
        self._finder: finder.FaceFinder | None = None

    def weight_files(self) -> list[Path]:
        root = Path(cv2.data.haarcascades)
        return [root / _FACE_CASCADE, *(root / name for name in _EYE_CASCADES)]

    def _load(self) -> None:
        classifiers = []
        for path in self.weight_files():
            if not path.is_file():
                raise AvatarRenderError(
                    f"The face detector file '{path}' is missing; reinstall opencv-python-headless."
                )
            classifier = cv2.CascadeClassifier()
            try:
                loaded = classifier.load(str(path)) and not classifier.empty()
            except (cv2.error, SystemError):
                loaded = False
            if not loaded:
                raise AvatarRenderError(
                    f"The face detector file '{path}' could not be loaded; reinstall opencv-python-headless."
                )
            classifiers.append(classifier)
        self._face, *self._eyes = classifiers

    def detect(self, image: np.ndarray) -> FaceLayout | None:
        """Layout of the chosen frontal face (``index``, else the largest) in an (H, W, 3) uint8 RGB image, in
        its pixels; None if there is no such face."""
        faces = self.faces(image)
        chosen = self.choose(faces)
        return None if chosen is None else self.layout(image, faces[chosen])

    def faces(self, image: np.ndarray, *, thorough: bool = False, is_face: IsFace | None = None) -> tuple[Box, ...]:
        """Every frontal face in an (H, W, 3) uint8 RGB image, left to right, in its pixels. Searched in a copy
        of at most _DETECT_SIDE pixels, faces down to 5 % of its shorter side; ``thorough`` (a reference, looked
        at once; not a video's frames): where there is none, again in a larger one, down to the cascade's
        smallest (a face of 90 px in a 3000-px photo). Only the boxes ``is_face`` keeps count, when given; with it,
        a thorough search also adds the faces larger than all of those that ``face.finder`` finds, where installed."""

        def search(side: int, **kwargs) -> list[Box]:
            boxes = self._search(image, side, **kwargs)
            return boxes if is_face is None else [b for b in boxes if is_face(b, 0.0)]

        boxes = search(_DETECT_SIDE, small_faces=False)
        # (and without the histogram's equalisation, which a large plain backdrop skews: a portrait on a flat grey
        # taking a tenth of the picture is not found with it)
        for equalize in (True, False) if thorough else ():
            if not boxes:
                boxes = search(_SMALL_FACE_SIDE, small_faces=True, equalize=equalize)
        if thorough and is_face is not None:
            boxes += self.missed(image, boxes, is_face)
        return tuple(sorted(boxes, key=lambda b: (b.x, b.y)))

    def missed(self, image: np.ndarray, boxes: list[Box], is_face: IsFace, *,
               tiles_down: float = finder.TILES_DOWN) -> list[Box]:
        """The faces ``face.finder`` finds (none where its model is not installed; in tiles down to 1/``tiles_down``
        of the picture) that are larger than all of ``boxes`` and frame none of their faces, where ``is_face`` sees
        a face."""
        path = finder.find_model()
        if path is None:
            return []
        if self._finder is None or self._finder.path != path:
            self._finder = finder.FaceFinder(path)
        found: list[Box] = []
        for box in self._finder.faces(image, larger_than=max((b.w for b in boxes), default=0.0), tiles_down=tiles_down):
            if not any(finder.same_face(box, b) for b in boxes + found) and is_face(box, 0.0):
                found.append(box)
        return found

    def _search(self, image: np.ndarray, side: int, *, small_faces: bool, equalize: bool = True) -> list[Box]:
        self.load()
        assert self._face is not None
        height, width = image.shape[:2]
        scale = min(1.0, side / max(height, width))
        small = image
        if scale < 1.0:
            small = cv2.resize(image, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA)
        small = cv2.cvtColor(np.ascontiguousarray(small), cv2.COLOR_RGB2GRAY)  # (h, w)
        if equalize:
            small = cv2.equalizeHist(small)
        min_side = 24 if small_faces else max(24, round(0.05 * min(small.shape)))
        found = self._face.detectMultiScale(small, scaleFactor=1.1, minNeighbors=5, minSize=(min_side, min_side))
        return [Box(x / scale, y / scale, w / scale, h / scale)
                for x, y, w, h in (found.tolist() if len(found) else [])]

    def tilted(self, image: np.ndarray, *, is_face: IsFace | None = None) -> FaceLayout | None:
        """The layout of the largest face found in a copy of an (H, W, 3) uint8 RGB image turned by one of
        ``_ROLLS`` (or ``_TURNS``, with ``is_face``), mapped back (its eyes along the tilted eye line, ``roll``
        set); None if there is none (or ``is_face``, when given, keeps none of them)."""
        height, width = image.shape[:2]
        scale = min(1.0, _DETECT_SIDE / max(height, width))
        small = image if scale == 1.0 else cv2.resize(
            image, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA)
        h, w = small.shape[:2]
        for degrees in _ROLLS + (_TURNS if is_face is not None else ()):
            # (turned about the middle, on a canvas that holds all of it)
            turn = cv2.getRotationMatrix2D((w / 2, h / 2), degrees, 1.0)
            c, s = abs(turn[0, 0]), abs(turn[0, 1])
            size = (int(np.ceil(w * c + h * s)), int(np.ceil(w * s + h * c)))
            turn[:, 2] += (size[0] - w) / 2, (size[1] - h) / 2
            turned = cv2.warpAffine(small, turn, size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
            faces = self._search(turned, max(size), small_faces=False)
            if not faces:
                continue
            found = self.layout(turned, max(faces, key=lambda b: b.w * b.h))
            back = cv2.invertAffineTransform(turn) / scale  # turned pixels -> the image's

            def undo(box: Box) -> Box:
                x, y = back[:, :2] @ (box.cx, box.cy) + back[:, 2]
                return Box.around(float(x), float(y), box.w / scale, box.h / scale)

            face, left, right = undo(found.face), undo(found.left_eye), undo(found.right_eye)
            roll = float(np.arctan2(right.cy - left.cy, right.cx - left.cx))
            if is_face is not None and not is_face(face, roll):
                continue
            return FaceLayout(face=face, left_eye=left, right_eye=right, mouth=undo(found.mouth), detected=True,
                              roll=roll)
        return None

    def choose(self, faces: tuple[Box, ...]) -> int | None:
        """Which of ``faces`` (left to right) is rendered: the index-th, else the largest; None if none is."""
        if self.index is not None:
            return self.index - 1 if self.index <= len(faces) else None
        return max(range(len(faces)), key=lambda i: faces[i].w * faces[i].h) if faces else None

    def layout(self, image: np.ndarray, face: Box) -> FaceLayout:
        """The layout of a face the detector found in ``image``, with its eyes where they are found."""
        eyes = self._find_eyes(image, face)
        if eyes is None:
            return layout_from_box(face, detected=True)
        return layout_with_eyes(face, *eyes)

    def _find_eyes(self, image: np.ndarray, face: Box) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """Eye centres (image-left first) in the upper half of the face box of an RGB image, or None."""
        x0, x1 = max(0, int(face.x)), min(image.shape[1], int(np.ceil(face.x + face.w)))
        y0, y1 = max(0, int(face.y + 0.12 * face.h)), min(image.shape[0], int(np.ceil(face.y + 0.62 * face.h)))
        if x1 - x0 < 8 or y1 - y0 < 8:
            return None
        zoom = _EYE_FACE_WIDTH / face.w
        roi = cv2.cvtColor(np.ascontiguousarray(image[y0:y1, x0:x1]), cv2.COLOR_RGB2GRAY)  # (h, w)
        interpolation = cv2.INTER_AREA if zoom < 1 else cv2.INTER_CUBIC
        # No histogram equalisation here: it washes out eyes behind glasses or under a hat's shadow.
        roi = cv2.resize(roi, (round(roi.shape[1] * zoom), round(roi.shape[0] * zoom)), interpolation=interpolation)
        lo, hi = round(0.09 * _EYE_FACE_WIDTH), round(0.35 * _EYE_FACE_WIDTH)
        for cascade in self._eyes:
            found = cascade.detectMultiScale(roi, scaleFactor=1.05, minNeighbors=3, minSize=(lo, lo), maxSize=(hi, hi))
            # Candidates as (u, v, size): centre and width in fractions of the face box.
            candidates = [
                (
                    (x0 + (ex + ew / 2) / zoom - face.x) / face.w,
                    (y0 + (ey + eh / 2) / zoom - face.y) / face.h,
                    ew / zoom / face.w,
                )
                for ex, ey, ew, eh in (found.tolist() if len(found) else [])
            ]
            pair = _best_pair(candidates)
            if pair is not None:
                (lu, lv, _), (ru, rv, _) = pair
                return (face.x + lu * face.w, face.y + lv * face.h), (face.x + ru * face.w, face.y + rv * face.h)
        return None


_Candidate = tuple[float, float, float]  # eye centre u, v and width, in fractions of the face box


def _best_pair(candidates: list[_Candidate]) -> tuple[_Candidate, _Candidate] | None:
    """The most face-like (image-left, image-right) pair of eye candidates."""
    plausible = [c for c in candidates if 0.2 <= c[1] <= 0.55 and 0.09 <= c[2] <= 0.35]
    best, best_cost = None, np.inf
    for left in plausible:
        for right in plausible:
            gap = right[0] - left[0]
            if not (left[0] < 0.5 < right[0] and 0.28 <= gap <= 0.55):
                continue
            if abs(left[1] - right[1]) > 0.12 or not 0.6 <= left[2] / right[2] <= 1 / 0.6:
                continue
            cost = (
                abs(left[1] - right[1])
                + abs((left[0] + right[0]) / 2 - 0.5)
                + 0.5 * abs(gap - EYE_GAP)
                + 0.5 * abs((left[1] + right[1]) / 2 - EYE_Y)
            )
            if cost < best_cost:
                best, best_cost = (left, right), cost
    return best


def find_face(image: np.ndarray, detector: FaceDetector, face_box: list[int] | None) -> FaceLayout | None:
    """The face layout of a reference: from the user's ``face_box`` when given (the detector is then
    never loaded), else from the detector; None when no face is found."""
    return choose_face(image, detector, face_box)[0]


def choose_face(image: np.ndarray, detector: FaceDetector, face_box: list[int] | None, *,
                is_face: IsFace | None = None) -> tuple[FaceLayout | None, str]:
    """The face layout of a reference image as ``find_face`` gives it, and what a user should know when
    it shows several faces (which one is rendered, how to pick another); a ``face.index`` beyond the faces
    found is refused. With ``is_face``, only the boxes it keeps are faces (``face.index`` counts those)."""
    if face_box:
        return _placed(face_box, image.shape[1], image.shape[0]), ""
    faces = detector.faces(image, thorough=True, is_face=is_face)
    chosen = detector.choose(faces)
    if detector.index is not None and chosen is None:
        raise AvatarRenderError(f"face.index={detector.index} asks for the face {_ordinal(detector.index)} from the "
                                f"left, but {_count(len(faces))} found in the reference.")
    if chosen is None:
        found = detector.tilted(image, is_face=is_face) if detector.index is None else None
        return found, (_lying(found.roll) if found is not None else "")
    note = ""
    if len(faces) > 1:
        f = faces[chosen]
        which = "the largest" if detector.index is None else f"face.index={detector.index}"
        note = (f"{_count(len(faces))} found in the reference; rendering {which}, the {_ordinal(chosen + 1)} from "
                f"the left ({f.w:.0f}x{f.h:.0f} px at x={f.x:.0f}, y={f.y:.0f}). face.index=1..{len(faces)} picks "
                "another (counted from the left); face.box=[x,y,w,h] places one by hand.")
    return detector.layout(image, faces[chosen]), note


def _placed(face_box: list[int], width: int, height: int) -> FaceLayout:
    """The layout of the user's ``face_box`` in a (height, width) picture; refused where it puts an eye or the mouth
    outside the picture (nothing there to animate)."""
    layout = layout_from_box(Box(*map(float, face_box)))
    if not all(0 <= b.cx < width and 0 <= b.cy < height for b in (layout.left_eye, layout.right_eye, layout.mouth)):
        raise AvatarRenderError(f"face.box={list(face_box)} puts the eyes or the mouth outside the reference, which "
                                f"is {width}x{height} pixels; give the box of the face inside it, as [x, y, width, "
                                "height].")
    return layout


def _lying(roll: float) -> str:
    """What a user should know of a face found turned by ``roll`` (radians, the eye line's): nothing unless it lies
    on its side or upside down."""
    degrees = float(np.degrees(roll))
    if abs(degrees) <= _LYING:
        return ""
    how = "upside down" if abs(degrees) > 180 - _LYING else "on its side, turned a quarter " + (
        "clockwise" if degrees > 0 else "counter-clockwise")
    return (f"the face lies {how} in the reference, and is animated as it lies; if the picture has lost its "
            "orientation, turn it upright and render again.")


def _count(n: int) -> str:
    return "no face was" if n == 0 else "1 face was" if n == 1 else f"{n} faces were"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
