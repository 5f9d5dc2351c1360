"""A second look for the faces of a reference: MediaPipe's short-range BlazeFace detector
(``face_detection_short_range.tflite``, Apache-2.0), read by OpenCV's TFLite reader and installed beside the
landmark model by ``avatar-render setup``.

OpenCV's frontal-face cascade misses faces turned a little, lit from one side or speaking: in a photo of Einstein at
a lectern (1024 px tall, his face about 100 px wide) it found only the man seated behind him, who was then animated.
``face.detect.FaceDetector.faces`` adds the faces this finds that are larger than any the cascade found, where the
landmark model confirms them.

The model looks at a 128-px square. A picture is searched in overlapping square tiles (each padded to a square
with black), their side halving from the picture's longer side down to where a face of a given size is still
found whole.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.face.layout import EYE_GAP, EYE_Y, MOUTH_Y, Box
from avatar_render.face.models import DNN_LOCK, TfliteModel, installed, read_tflite

MODEL_FILE = "face_detection_short_range.tflite"
MODEL_SHA256 = "bbff11cebd1eb27a1e004cae0b0e63ec8c551cbf34a4451148b4908b8db3eca8"  # as in mediapipe 0.10.21
_INPUT = 128
_MIN_SCORE = 0.75  # face probability below which a detection is dropped (a real face reads 0.8-0.96)
_SAME = 0.3  # intersection over union above which two detections are one face
_SMALLEST_TILE = 64  # pixels
_TILE_PER_FACE = 2.0  # a face of side F is looked for in tiles of side 2F and more ...
TILES_DOWN = 8  # ... and of at least 1/8 of the picture's longer side (a reference's; a video's frames ask less)


def _anchors() -> np.ndarray:
    """(896, 2) anchor centres in input units: a 16x16 grid with 2 anchors a cell (stride 8), then an 8x8 grid with
    6 (three layers of stride 16), as MediaPipe's face detection graph sets them."""
    centres = []
    for grid, per_cell in ((16, 2), (8, 6)):
        cells = (np.stack(np.meshgrid(np.arange(grid), np.arange(grid)), -1).reshape(-1, 2) + 0.5) / grid
        centres.append(np.repeat(cells, per_cell, axis=0))
    return np.concatenate(centres).astype(np.float32)


_ANCHORS = _anchors()


def find_model() -> Path | None:
    return installed(MODEL_FILE)


class FaceFinder(TfliteModel):
    name = "face_finder"

    def _load(self) -> None:
        net, outs = read_tflite(self.path, _INPUT, "face detection model")
        shapes = tuple(getattr(outs.get(name), "shape", None) for name in ("classificators", "regressors"))
        if shapes != ((1, len(_ANCHORS), 1), (1, len(_ANCHORS), 16)):
            raise AvatarRenderError(f"The face detection model '{self.path}' is not MediaPipe's short-range BlazeFace.")
        self._net = net

    def faces(self, image: np.ndarray, *, larger_than: float = 0.0, tiles_down: float = TILES_DOWN) -> list[Box]:
        """The faces wider than ``larger_than`` pixels in an (H, W, 3) uint8 RGB image, each as a box framed the way
        the cascade frames a face (``face.layout``: placed and sized from the eyes and the mouth the model finds),
        the likeliest first; in tiles down to 1/``tiles_down`` of its longer side."""
        self.load()
        height, width = image.shape[:2]
        longest = max(height, width)
        smallest = max(_SMALLEST_TILE, longest / tiles_down, _TILE_PER_FACE * larger_than)
        found: list[tuple[float, Box]] = []
        side = longest
        while side >= smallest or side == longest:
            for y0 in _starts(height, side):
                for x0 in _starts(width, side):
                    part = image[y0 : y0 + side, x0 : x0 + side]
                    h, w = (max(1, round(n * _INPUT / side)) for n in part.shape[:2])
                    small = np.zeros((_INPUT, _INPUT, 3), np.uint8)  # (the tile padded with black, at 128 px)
                    small[:h, :w] = cv2.resize(part, (w, h), interpolation=cv2.INTER_AREA)
                    for score, points in zip(*self._look(small)):
                        box = _framed(points * side + (x0, y0))
                        if box.w > larger_than:
                            found.append((score, box))
            side //= 2
        kept: list[tuple[float, Box]] = []
        for score, box in sorted(found, key=lambda f: -f[0]):
            if not any(same_face(box, k) for _, k in kept):
                kept.append((score, box))
        return [box for _, box in kept]

    def _look(self, small: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The detections in a (128, 128, 3) uint8 RGB square: scores (N,) and keypoints (N, 6, 2) in its units
        (eyes, nose tip, mouth, ears; the eye on the image's left first)."""
        assert self._net is not None
        blob = (small.astype(np.float32) / 127.5 - 1.0).transpose(2, 0, 1)[None]  # (1, 3, 128, 128) in [-1, 1]
        with DNN_LOCK:
            self._net.setInput(blob)
            logits, raw = self._net.forward(["classificators", "regressors"])
        scores = 1 / (1 + np.exp(-np.clip(logits[0, :, 0], -80, 80)))
        keep = scores >= _MIN_SCORE
        points = raw[0, keep, 4:16].reshape(-1, 6, 2) / _INPUT + _ANCHORS[keep, None, :]
        return scores[keep], points


def _starts(length: int, side: int) -> list[int]:
    """Where the tiles of ``side`` start along an axis of ``length``: half a tile apart, the last at the end."""
    if length <= side:
        return [0]
    starts = list(range(0, length - side, side // 2))
    return starts + [length - side]


def _framed(points: np.ndarray) -> Box:
    """The cascade's box of a face from its (6, 2) keypoints in image pixels: as wide as its eyes' distance asks
    (``EYE_GAP``) or as tall as its eyes' height over the mouth (``EYE_Y`` to ``MOUTH_Y``), whichever is more (a
    face turned aside has its eyes closer together), its eye line at ``EYE_Y``."""
    left, right, mouth = points[0], points[1], points[3]
    middle = (left + right) / 2
    side = max(float(np.hypot(*(right - left))) / EYE_GAP, float(np.hypot(*(mouth - middle))) / (MOUTH_Y - EYE_Y))
    return Box(float(middle[0]) - side / 2, float(middle[1]) - EYE_Y * side, side, side)


def same_face(a: Box, b: Box) -> bool:
    """Whether two boxes frame one face: they overlap by more than ``_SAME`` of their union, or one's centre lies
    in the other (one much larger than the other)."""
    w = min(a.x + a.w, b.x + b.w) - max(a.x, b.x)
    h = min(a.y + a.h, b.y + b.h) - max(a.y, b.y)
    inter = max(0.0, w) * max(0.0, h)

    def inside(p: Box, q: Box) -> bool:
        return q.x <= p.cx <= q.x + q.w and q.y <= p.cy <= q.y + q.h

    return inter > _SAME * (a.w * a.h + b.w * b.h - inter) or inside(a, b) or inside(b, a)
