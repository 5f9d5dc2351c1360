"""The mouth warp under the chin: the chin comes down over what lies under it.

The face mesh alone fades the jaw's motion out over the triangles between the face outline and a fixed ring
some 0.4 mouth widths beyond it: everything under the chin (the neck, a shirt collar, a hand) was stretched
down and back with every syllable (a drawn shirt collar by 2-3 px at 512x512, a real one visibly). Seen from
the front, a real chin comes down in front of what lies under it. Here, under the chin, the mesh's map is
replaced column by column: the pixels down to ``EDGE_PX`` below the moved chin outline move with it, below
that the motion fades out smoothly over a band of ``BAND`` times the chin's largest travel there (what lies in
it is covered by the chin as it comes down), and beyond the band nothing moves. Beside the chin, where the
outline turns up towards the ears, the mesh's own map is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avatar_render.face.mesh import FACE_OVAL, FaceMesh
from avatar_render.preview.warp import Rect

FACING = 0.6  # outline points whose outward normal has at least this much of the face's downward axis
MIN_TRAVEL_PX = 0.5  # and that the jaw moves by more than this are under the chin
EDGE_PX = 1.0  # the chin's edge (its soft pixels) moves whole with it
BAND = 1.0  # the fade below it spans this share of the chin's largest travel there
BAND_MIN_PX = 2.0
END_FADE = 0.15  # of the chin's span: over this much at each end the mesh's own map takes over


@dataclass(frozen=True, eq=False)
class ChinSlide:
    chain: np.ndarray  # (k,) int the face outline's vertices under the chin, in order along the eye line
    s: np.ndarray  # (k,) float32 their positions along the eye line, px
    t: np.ndarray  # (k,) down the face
    band: np.ndarray  # (k,) px over which the motion fades out below the chin's edge
    ps: np.ndarray  # (h, w) float32 the rectangle's pixels along the eye line (``rig.face_coords``)
    pt: np.ndarray  # (h, w) down the face
    down: np.ndarray  # (2,) the face's downward axis

    @staticmethod
    def build(mesh: FaceMesh, vertices: np.ndarray, travel: np.ndarray, rect: Rect, coords) -> "ChinSlide | None":
        """vertices: (n, 2) the warp's, the landmarks first; travel: (n,) each one's largest downward travel over
        the warp bank's shapes; coords: ``rig.face_coords``. None where the jaw moves no part of the outline down."""
        ey = mesh.axes()[1]
        oval = np.array(FACE_OVAL)
        pts = vertices[oval]
        tangent = np.roll(pts, -1, axis=0) - np.roll(pts, 1, axis=0)
        normal = np.stack([tangent[:, 1], -tangent[:, 0]], axis=1)
        normal /= np.maximum(np.linalg.norm(normal, axis=1, keepdims=True), 1e-6)
        normal *= np.sign(((pts - pts.mean(axis=0)) * normal).sum(axis=1, keepdims=True))  # (outwards)
        under = (normal @ ey > FACING) & (travel[oval] > MIN_TRAVEL_PX)
        if under.sum() < 3 or rect.empty:
            return None
        s, t = coords(pts[under, 0], pts[under, 1], mesh)
        order = np.argsort(s)
        xs, ys = rect.grid()
        ps, pt = coords(xs + 0.5, ys + 0.5, mesh)
        f32 = np.float32
        return ChinSlide(
            chain=oval[under][order],
            s=s[order].astype(f32),
            t=t[order].astype(f32),
            band=np.maximum(BAND * travel[oval[under][order]], BAND_MIN_PX).astype(f32),
            ps=ps.astype(f32),
            pt=pt.astype(f32),
            down=np.asarray(ey, f32),
        )

    def apply(self, grid: np.ndarray, vertices: np.ndarray, moved: np.ndarray) -> np.ndarray:
        """grid: (h, w, 2) the mesh's backward map of ``vertices`` moved to ``moved`` -> (h, w, 2) float32 the
        map with the chin sliding over what lies under it."""
        d = (moved - vertices)[self.chain]  # (k, 2)

        def along(v: np.ndarray) -> np.ndarray:  # (k,) values on the chain -> (h, w) at each pixel's column
            return np.interp(self.ps, self.s, v).astype(np.float32)

        below = self.pt - along(self.t + d @ self.down)  # px below the moved outline
        u = np.clip((below - EDGE_PX) / along(self.band), 0, 1)
        follow = 1 - u * u * (3 - 2 * u)  # 1 on the chin and its edge, 0 beyond the band
        span = max(END_FADE * float(self.s[-1] - self.s[0]), 1.0)
        ends = np.clip((self.ps - self.s[0]) / span, 0, 1) * np.clip((self.s[-1] - self.ps) / span, 0, 1)
        w = (np.clip(below + 0.5, 0, 1) * ends)[..., None]  # (only below the moved outline)
        # (backward map: a pixel the chin has come down to takes its colour from as far up)
        slide = -follow[..., None] * np.stack([along(d[:, 0]), along(d[:, 1])], axis=-1)
        return (grid * (1 - w) + slide * w).astype(np.float32)
