"""How the reference is fitted to the output frame: a crop to the frame's aspect ratio around the face,
then a resize; ``Fit`` maps reference pixels to output pixels."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError

MIN_FACE = 0.12  # the face's side, as a fraction of the frame's shorter side, below which the crop comes closer
MAX_ZOOM = 2.0  # ... enlarging the crop at most this much


@dataclass(frozen=True)
class Fit:
    """How reference pixels map into the output frame (continuous pixel-edge coordinates)."""

    scale: float  # output pixels per reference pixel
    offset_x: float  # output x = reference x * scale - offset_x  (likewise y)
    offset_y: float


def fit_to_frame(
    image: np.ndarray,
    width: int,
    height: int,
    *,
    focus: tuple[float, float, float, float] | None = None,
) -> tuple[np.ndarray, Fit]:
    """Crop to the output aspect ratio (cover, no letterbox) and resize to (height, width, 3).

    Resizing uses cv2.INTER_AREA when shrinking and cubic interpolation when enlarging.

    With a focus box (x, y, w, h) in reference pixels (the face), the crop keeps the box inside and
    places its centre near the horizontal centre and a little above the vertical centre, clamped to
    the image; without one, centre crop. A face smaller than ``MIN_FACE`` of the frame's shorter side (a
    full-length or a group photo) is cropped closer, to that size, the crop enlarged at most ``MAX_ZOOM`` times.
    """
    if width < 1 or height < 1:
        raise AvatarRenderError(f"The output size must be positive, not {width}x{height}.")
    src_h, src_w = image.shape[:2]
    if src_w * height >= src_h * width:  # reference is wider than the frame: keep its full height
        crop_h, crop_w = src_h, min(src_w, max(1, round(src_h * width / height)))
    else:
        crop_w, crop_h = src_w, min(src_h, max(1, round(src_w * height / width)))
    if focus is None:
        x0, y0 = (src_w - crop_w) // 2, (src_h - crop_h) // 2
    else:
        fx, fy, fw, fh = focus
        closer = max(fw, fh) / (MIN_FACE * min(crop_w, crop_h))  # < 1: the face would be smaller than MIN_FACE
        closer = max(closer, width / (MAX_ZOOM * crop_w))
        if closer < 1:
            crop_w, crop_h = max(1, round(crop_w * closer)), max(1, round(crop_h * closer))
        x0 = _place(fx + fw / 2 - 0.5 * crop_w, fx, fw, crop_w, src_w)
        y0 = _place(fy + fh / 2 - 0.45 * crop_h, fy, fh, crop_h, src_h)
    crop = image[y0 : y0 + crop_h, x0 : x0 + crop_w]  # (crop_h, crop_w, 3)
    # The crop's aspect matches the frame's to within a pixel; one scale describes both axes.
    scale = (width / crop_w + height / crop_h) / 2
    if (crop_w, crop_h) == (width, height):
        out = np.ascontiguousarray(crop)
    else:
        interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
        out = cv2.resize(crop, (width, height), interpolation=interpolation)
    return out, Fit(scale=scale, offset_x=x0 * scale, offset_y=y0 * scale)


def _place(desired: float, start: float, size: float, crop: int, total: int) -> int:
    """Crop origin along one axis: ``desired``, moved to keep [start, start + size) inside, clamped to the image."""
    lo, hi = 0, total - crop
    keep_lo, keep_hi = int(np.ceil(start + size)) - crop, int(np.floor(start))
    if max(lo, keep_lo) <= min(hi, keep_hi):  # the box fits in the crop
        lo, hi = max(lo, keep_lo), min(hi, keep_hi)
    return int(min(max(round(desired), lo), hi))
