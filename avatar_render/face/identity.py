"""A face crop's descriptor for identity comparisons by a classical proxy: the crop resampled to
96x96 grey, OpenCV's HOG (8x8-pixel cells, 9 orientations, 16x16 blocks), square-rooted and unit
length (cosine similarity = dot product). See ``metrics.identity`` for what it follows and what not."""

from __future__ import annotations

from functools import cache

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError

CROP = 96  # side of the resampled face crop


@cache
def _hog() -> cv2.HOGDescriptor:
    if not hasattr(cv2, "HOGDescriptor"):  # OpenCV 5 moved it out of its main modules
        raise AvatarRenderError(f"The face identity check needs OpenCV's HOG descriptor, which OpenCV "
                                f"{cv2.__version__} lacks: pip install 'opencv-python-headless>=4.8,<5'.")
    return cv2.HOGDescriptor((CROP, CROP), (16, 16), (8, 8), (8, 8), 9)


def face_descriptor(face: np.ndarray) -> np.ndarray:
    """(h, w) float32 grey face crop -> (4356,) unit-length HOG descriptor."""
    interpolation = cv2.INTER_AREA if face.shape[0] > CROP else cv2.INTER_LINEAR
    img = np.clip(cv2.resize(face, (CROP, CROP), interpolation=interpolation) + 0.5, 0, 255).astype(np.uint8)
    desc = np.sqrt(np.maximum(_hog().compute(img).ravel().astype(np.float64), 0.0))
    return desc / max(float(np.linalg.norm(desc)), 1e-12)
