"""Piecewise-affine warps on a triangle mesh, as backward maps for ``cv2.remap``.

Coordinates are continuous pixel-edge coordinates (pixel (i, j) spans [i, i + 1) x [j, j + 1));
maps hold displacements ``source - destination``, which are the same in OpenCV's pixel-centre
convention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

_SHIFT = 4  # sub-pixel bits when rasterising triangles


@dataclass(frozen=True)
class Rect:
    """Pixels [x0, x1) x [y0, y1) of an image."""

    x0: int
    y0: int
    x1: int
    y1: int

    @staticmethod
    def around(points: np.ndarray, width: int, height: int, *, margin: float = 0.0) -> "Rect":
        """The pixels covering ``points`` (n, 2) plus a margin, clipped to a (height, width) image."""
        lo, hi = points.min(axis=0) - margin, points.max(axis=0) + margin
        return Rect(
            max(0, int(math.floor(lo[0]))),
            max(0, int(math.floor(lo[1]))),
            min(width, int(math.ceil(hi[0]))),
            min(height, int(math.ceil(hi[1]))),
        )

    @property
    def w(self) -> int:
        return max(0, self.x1 - self.x0)

    @property
    def h(self) -> int:
        return max(0, self.y1 - self.y0)

    @property
    def empty(self) -> bool:
        return self.w < 2 or self.h < 2

    @property
    def slices(self) -> tuple[slice, slice]:
        return slice(self.y0, self.y1), slice(self.x0, self.x1)

    def union(self, other: "Rect") -> "Rect":
        return Rect(min(self.x0, other.x0), min(self.y0, other.y0), max(self.x1, other.x1), max(self.y1, other.y1))

    def grid(self) -> tuple[np.ndarray, np.ndarray]:
        """Pixel-centre coordinates (OpenCV's convention) of the rectangle, each (h, w) float32."""
        xs = np.arange(self.x0, self.x1, dtype=np.float32)
        ys = np.arange(self.y0, self.y1, dtype=np.float32)
        return np.broadcast_to(xs, (self.h, self.w)).copy(), np.broadcast_to(ys[:, None], (self.h, self.w)).copy()


def delaunay(points: np.ndarray) -> np.ndarray:
    """Delaunay triangles of distinct points (n, 2) -> (T, 3) int32 vertex indices."""
    pts = points.astype(np.float32)
    lo, hi = pts.min(axis=0) - 10, pts.max(axis=0) + 10
    subdiv = cv2.Subdiv2D((float(lo[0]), float(lo[1]), float(hi[0] - lo[0]) + 1, float(hi[1] - lo[1]) + 1))
    subdiv.insert([(float(x), float(y)) for x, y in pts])
    ids = {(float(x), float(y)): i for i, (x, y) in enumerate(pts)}
    tris = []
    for t in subdiv.getTriangleList().reshape(-1, 3, 2):
        idx = [ids.get((float(v[0]), float(v[1])), -1) for v in t]
        if min(idx) >= 0:  # (triangles reaching Subdiv2D's outer helper vertices are dropped)
            tris.append(idx)
    return np.array(tris, np.int32).reshape(-1, 3)


def backward_map(ref: np.ndarray, moved: np.ndarray, triangles: np.ndarray, rect: Rect) -> np.ndarray:
    """Displacements (rect.h, rect.w, 2) float32 taking each pixel of the moved mesh back to the reference:
    inside moved triangle t, ``source = A_t(destination)`` with A_t the affine map of the moved corners onto
    the reference corners; zero where no moved triangle covers a pixel. ref, moved: (n, 2) vertices."""
    out = np.zeros((rect.h, rect.w, 2), np.float32)
    if rect.empty or len(triangles) == 0:
        return out
    d = moved[triangles].astype(np.float64)  # (T, 3, 2)
    r = ref[triangles].astype(np.float64)
    # Solve A [x y 1]^T = ref for each triangle from its three corners.
    m = np.concatenate([d, np.ones((len(d), 3, 1))], axis=2)  # (T, 3, 3)
    det = np.linalg.det(m)  # twice the moved triangle's signed area
    ref_det = np.linalg.det(np.concatenate([r, np.ones((len(r), 3, 1))], axis=2))
    # A triangle squeezed to a sliver (lips pressed together close the one between them) or folded over
    # maps its few pixels to far-off sources: it is left out, and its pixels take a neighbour's map.
    ok = (np.abs(det) > 1e-6) & (det * ref_det > 0) & (np.abs(det) > 0.05 * np.abs(ref_det))
    lo, hi = d.min(axis=1), d.max(axis=1)
    ok &= (hi[:, 0] >= rect.x0) & (lo[:, 0] <= rect.x1) & (hi[:, 1] >= rect.y0) & (lo[:, 1] <= rect.y1)
    if not ok.any():
        return out
    affine = np.zeros((len(d), 2, 3))
    affine[ok] = np.linalg.solve(m[ok], r[ok]).transpose(0, 2, 1)  # (T, 2, 3): source = affine @ [x, y, 1]
    labels = np.full((rect.h, rect.w), -1, np.int32)
    # Vertices in OpenCV's pixel-centre coordinates, relative to the rectangle: (T, 3, 2) fixed point.
    corners = np.round((d - 0.5 - (rect.x0, rect.y0)) * (1 << _SHIFT)).astype(np.int32)
    # Where moved triangles overlap, the one that moved most is drawn over the others: what moves comes over what
    # stays (a lid coming down over the eye's white at its inner corner, where the lower lid's own triangles,
    # drawn after it, had left a speck of the white showing through the shut eye).
    travel = np.abs(d - r).sum(axis=(1, 2))
    drawn = np.flatnonzero(ok)
    for t in drawn[np.argsort(travel[drawn], kind="stable")].tolist():
        cv2.fillConvexPoly(labels, corners[t], t, lineType=cv2.LINE_8, shift=_SHIFT)
    # Neighbouring triangles share edges, but rasterising each on its own can leave a crack of pixels
    # between them, and a triangle left out leaves its pixels: those take a neighbour's map (the two agree
    # along the edge). Pixels beyond all the triangles keep no displacement: given a neighbour's map, they took
    # it on past its triangle's edge (a fixed edge's compression turned into a stretch beyond it).
    covered = np.zeros((rect.h, rect.w), np.uint8)
    for t in np.flatnonzero(~ok & (np.abs(det) > 0)).tolist():
        cv2.fillConvexPoly(covered, corners[t], 1, lineType=cv2.LINE_8, shift=_SHIFT)
    covered = cv2.morphologyEx(covered | (labels >= 0).astype(np.uint8), cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8))
    for _ in range(2):
        holes = (labels < 0) & (covered > 0)
        if not holes.any():
            break
        grown = cv2.dilate(labels.astype(np.float32), np.ones((3, 3), np.uint8))  # (exact for these ids)
        labels[holes] = grown[holes].astype(np.int32)
    ys, xs = np.nonzero(labels >= 0)
    # Affine maps relative to the rectangle's corner keep float32 exact enough.
    local = affine.copy()
    local[:, :, 2] += (
        local[:, :, 0] * (rect.x0 + 0.5) + local[:, :, 1] * (rect.y0 + 0.5) - (rect.x0 + 0.5, rect.y0 + 0.5)
    )
    c = local.reshape(-1, 6).astype(np.float32)[labels[ys, xs]]  # (N, 6)
    px, py = xs.astype(np.float32), ys.astype(np.float32)
    out[ys, xs, 0] = c[:, 0] * px + c[:, 1] * py + c[:, 2] - px
    out[ys, xs, 1] = c[:, 3] * px + c[:, 4] * py + c[:, 5] - py
    return out


def polygon_mask(polygon: np.ndarray, rect: Rect) -> np.ndarray:
    """Antialiased coverage (rect.h, rect.w) float32 in [0, 1] of a polygon (n, 2) in edge coordinates."""
    mask = np.zeros((rect.h, rect.w), np.uint8)
    if rect.empty or len(polygon) < 3:
        return mask.astype(np.float32)
    scale = 1 << _SHIFT
    v = np.round((polygon - 0.5 - (rect.x0, rect.y0)) * scale).astype(np.int32)
    cv2.fillPoly(mask, [v], 255, lineType=cv2.LINE_AA, shift=_SHIFT)
    return mask.astype(np.float32) * (1 / 255.0)
