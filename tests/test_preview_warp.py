"""The piecewise-affine warp's backward maps (preview/warp.py)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from avatar_render.face import mesh as fm
from avatar_render.preview.render import head_inverse, render_frame
from avatar_render.preview.warp import Rect, backward_map
from tests.test_preview import rig_for, row


def test_a_warp_leaves_what_lies_beyond_its_triangles_where_it_is():
    # A square of two triangles, its top right corner moved up by 4 px, in a rectangle 10 px larger all round.
    ref = np.array([[10, 10], [30, 10], [30, 30], [10, 30]], np.float32)
    moved = ref + np.array([[0, 0], [0, -4], [0, 0], [0, 0]], np.float32)
    tris = np.array([[0, 1, 3], [1, 2, 3]], np.int32)  # (both with the moved corner)
    rect = Rect(0, 0, 40, 40)
    d = backward_map(ref, moved, tris, rect)
    ys, xs = np.mgrid[0:40, 0:40] + 0.5
    inside = (xs > 11) & (xs < 29) & (ys > 11) & (ys < 29)
    assert (np.abs(d[inside]).max(axis=-1) > 0).mean() > 0.95  # moved within (no crack left between the two)
    # Two pixels or more beyond the moved square's outline, nothing moves (a neighbour's map carried on past its
    # edge moved them by as much as the square's corner).
    top = 10 - 4 * (xs - 10) / 20  # the moved square's upper edge
    beyond = (xs < 8) | (xs > 32) | (ys > 32) | (ys < top - 2)
    assert np.abs(d[beyond]).max() == 0


def test_where_moved_triangles_overlap_the_one_that_moved_comes_over():
    # A still triangle and one moved 9 px right over it; whichever order they come in, the overlap takes the
    # moved one's map (a lid coming down over the eye, not the still lower lid's triangles over the lid).
    ref = np.array([[10, 10], [20, 10], [10, 20], [0, 10], [4, 10], [0, 20]], np.float32)
    moved = ref.copy()
    moved[3:] += (9, 0)  # the second triangle, moved whole
    rect = Rect(0, 0, 32, 32)
    for tris in ([[0, 1, 2], [3, 4, 5]], [[3, 4, 5], [0, 1, 2]]):
        d = backward_map(ref, moved, np.array(tris, np.int32), rect)
        assert np.allclose(d[11, 10], (-9, 0)), tris  # (pixel centre (10.5, 11.5): inside both)


def _grey(frame: np.ndarray) -> np.ndarray:
    return frame.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)


def _box(frame: np.ndarray, pts: np.ndarray) -> np.ndarray:
    x0, y0 = np.floor(pts.min(axis=0)).astype(int) - 1
    x1, y1 = np.ceil(pts.max(axis=0)).astype(int) + 2
    return frame[y0:y1, x0:x1]


def test_a_full_blink_shows_no_speck_of_the_eyes_white():
    rig = rig_for(512, 512).rig
    frame = _grey(render_frame(rig, row(blink=1.0)))
    for upper, lower in fm.EYES:
        box = _box(frame, rig.mesh.at(upper + lower))
        local = cv2.medianBlur(np.clip(box, 0, 255).astype(np.uint8), 5).astype(np.float32)
        # (the white left between the lower lid's own triangles at the inner corner stood 53-66 levels above)
        assert (box - local).max() < 40, upper[0]


@pytest.mark.parametrize(
    "shape, points",
    [
        ({"blink": 1.0}, fm.EYES[0][0] + fm.EYES[0][1] + fm.EYES[1][0] + fm.EYES[1][1]),
        ({"open_": -1.0, "width": 0.2}, fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER),
    ],
)
def test_a_fold_moved_by_a_fraction_of_a_pixel_looks_like_the_still_one_moved(shape, points):
    """Eyes shut, lips pressed together: where the map folds, a displacement sampled between pixels blended the
    upper lid's (lip's) with the lower one's and pointed into what lies between them: the eye's white showed
    under the closed line, the teeth along the lips' seam, whenever the head had moved by a fraction of a pixel
    (the example's frame 341: 108 and 114 grey levels off the still frame moved by the head's motion)."""
    rig = rig_for(512, 512).rig
    still = render_frame(rig, row(**shape))
    p = row(**shape, dx=0.0064, dy=-0.0007, roll=-0.2, zoom=0.0038)
    moved = render_frame(rig, p)
    fwd = cv2.invertAffineTransform(head_inverse(rig, p))
    size = (still.shape[1], still.shape[0])
    expected = cv2.warpAffine(still, fwd, size, flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE)
    off = np.abs(_grey(moved) - _grey(expected))
    assert _box(off, rig.mesh.at(points)).max() < 50  # (32 now: resampling the still's sharp lash line)
