"""The piecewise-affine warp's backward maps (preview/warp.py)."""

from __future__ import annotations

import numpy as np

from avatar_render.preview.warp import Rect, backward_map


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
