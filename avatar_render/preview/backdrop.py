"""What lies behind the head stays where it is while the head moves.

The head's soft warp (``preview.render``) moves everything inside an ellipse around the face and fades out over a
band around it: a mirror, a bookshelf or a flag beside the head went along with every nod, and bent where the band
crossed it. Where a person segmentation is known (``face.segment``), the warp's weight is kept on the person and
falls off within a narrow band around their outline instead: the background beyond it stays still, the background
in it stretches as the head moves by (the band is wider than the head's travel, so it never folds over). It is
done once, on the weight: no cost per frame.
"""

from __future__ import annotations

import cv2
import numpy as np

from avatar_render.preview.warp import Rect

PERSON = 0.5  # a pixel this much the person's or more moves with the head as the ellipse says
# face widths, at the head's usual motion (preview.head_motion 1, whose largest travel at the top of the head is about
# 0.11 face widths): the background this near the person's outline moves with it, less the further it lies
BAND = 0.2
ALL_PERSON = 0.99  # a rectangle whose every pixel is the person's this much has no background to keep still
FACE_SEEN = 0.9  # the share of the face the segmentation must see as the person's for it to be used


def hug(weight: np.ndarray, rect: Rect, person: np.ndarray, face: np.ndarray, band: float) -> np.ndarray | None:
    """The head's weight (at the centres of every other pixel of ``rect``, (rect.h // 2, rect.w // 2) float32) kept on
    the person (``person``: (rect.h, rect.w) float32 0..1) and falling to 0 over ``band`` pixels beyond their
    outline. None where the rectangle is all the person's (nothing to keep still), or where the segmentation does
    not see the face (``face``: its outline, (n, 2) pixels) as the person's: a drawing, a statue, a face it missed."""
    if float(person.min()) >= ALL_PERSON:
        return None
    inside = np.zeros(person.shape, np.uint8)
    cv2.fillPoly(inside, [np.round((face - [rect.x0, rect.y0]) * 16).astype(np.int32)], 1, cv2.LINE_8, 4)
    if not inside.any() or float((person[inside > 0] >= PERSON).mean()) < FACE_SEEN:
        return None
    outside = ((person < PERSON) & (inside == 0)).astype(np.uint8)
    away = cv2.distanceTransform(outside, cv2.DIST_L2, 5)  # (rect.h, rect.w) px to the person's outline, 0 on them
    u = np.clip(1 - away / max(band, 2.0), 0, 1)
    near = u * u * (3 - 2 * u)  # 1 on the person, easing to 0 at the band's far edge
    # (the lesser of the two, not their product: no steeper than either, so no fold the ellipse has not)
    return np.minimum(weight, near[: 2 * weight.shape[0] : 2, : 2 * weight.shape[1] : 2]).astype(np.float32)
