"""Everything the preview renderer computes once from the reference: the triangulated face mesh, banks
of precomputed warps for the mouth and the eyelids, the reference's teeth split into upper and lower,
the mouth interior's colours, and the soft head mask the head moves with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import cv2
import numpy as np

from avatar_render.face import mesh as fm
from avatar_render.preview.backdrop import BAND, hug
from avatar_render.preview.chin import ChinSlide
from avatar_render.preview.eyelids import fit_lower_lids
from avatar_render.preview.interior import (
    LUMA,
    MouthInterior,
    build_interior,
    colour_spread,
    lip_colour,
    saturation,
)
from avatar_render.preview.rigid import confine, rigid_floor
from avatar_render.preview.shapes import EyeShape, MouthShape
from avatar_render.preview.warp import Rect, backward_map, delaunay

OPEN_LEVELS = (-1.0, -0.5, 0.0, 0.15, 0.3, 0.45, 0.6, 0.8, 1.0)
WIDTH_LEVELS = (-1.0, 0.0, 1.0)
BLINK_LEVELS = (0.0, 0.25, 0.5, 0.75, 1.0)
OPEN_LIPS = 0.05  # a reference's lips this far apart (in mouth widths) or more can show its teeth
MIN_MOUTH_PX = 8.0  # narrower mouths are not animated (only the head moves)
CELL = np.ones((2, 2), np.uint8)  # a map's 2x2 cell, as a structuring element (``Bank.spread``, render's folds)
_CHEEKS = (50, 101, 118, 205, 280, 330, 347, 425)  # landmarks on the cheeks, for the skin's colour
_MOUTH_RED = (1.1, 0.6, 0.56)  # the mouth's lining, relative to the skin's brightness
_RING = 1.35  # fixed vertices on the face outline scaled by this about its centre
_HEAD = 1.25  # the face outline scaled by this about its centre (the ears, the hair at the temples) moves whole
_MIN_BAND = 0.15  # face widths: the narrowest the band over which the head's motion fades into the background gets


Segment = Callable[[np.ndarray, tuple[int, int, int, int]], np.ndarray]  # (image, region) -> person 0..1


def _bracket(levels: tuple[float, ...], value: float) -> tuple[int, float]:
    """(i, t): value lies a fraction t of the way from levels[i] to levels[i + 1]."""
    v = min(max(value, levels[0]), levels[-1])
    i = min(int(np.searchsorted(levels, v, side="right")) - 1, len(levels) - 2)
    return i, (v - levels[i]) / (levels[i + 1] - levels[i])


@dataclass(frozen=True, eq=False)
class Warps:
    """The backward maps of a bank's grid nodes, each made when first asked for: a render's first chunk
    needs a few of them, and the set-up was waiting for all of them (0.2 s of the time to the first frame)."""

    vertices: np.ndarray  # (n, 2) float32 the reference's mesh
    shapes: dict  # grid node (one index per axis) -> (n, 2) float32 the mesh moved to that node's amounts
    triangles: np.ndarray  # (T, 3) int32 the triangles that move
    rect: Rect
    floor: np.ndarray | None = None  # (rect.w,) float32 where set, each column's rigid floor (``rigid.confine``)
    chin: ChinSlide | None = None  # where set, the chin comes down over what lies under it

    def __call__(self, node: tuple[int, ...]) -> np.ndarray:
        """(rect.h, rect.w, 2) float32 the displacements at ``node``."""
        p = self.shapes[node]
        if np.abs(p - self.vertices).max() > 1e-6:
            grid = backward_map(self.vertices, p, self.triangles, self.rect)
            if self.chin is not None:
                grid = self.chin.apply(grid, self.vertices, p)
        else:
            grid = np.zeros((self.rect.h, self.rect.w, 2), np.float32)
        return grid if self.floor is None else confine(grid, self.rect, self.floor)


@dataclass(frozen=True, eq=False)
class Bank:
    """Backward-map displacements on a grid of motion amounts, blended multilinearly; each node's map is
    made the first time a blend needs it (the same values whichever thread or order asks)."""

    rect: Rect  # where the maps apply, output pixels
    axes: tuple[tuple[float, ...], ...]  # amounts along each axis of the grid
    warps: Warps
    _made: dict = field(default_factory=dict, repr=False)  # node -> (rect.h, rect.w, 2) float32
    _spreads: dict = field(default_factory=dict, repr=False)  # node -> (rect.h, rect.w) float32 (``spread``)

    def grid(self, node: tuple[int, ...]) -> np.ndarray:
        """(rect.h, rect.w, 2) float32 the displacements at a grid node (an index per axis)."""
        made = self._made.get(node)
        if made is None:  # (two threads may both make it: the same array, one of them kept)
            made = self._made.setdefault(node, self.warps(node))
        return made

    def blend(self, *values: float) -> np.ndarray:
        """(rect.h, rect.w, 2) float32 displacements at the given amounts (one per axis)."""
        return self._blend(self.grid, values, (self.rect.h, self.rect.w, 2))

    def spread(self, *values: float) -> np.ndarray:
        """(rect.h, rect.w) float32 at the given amounts, for each 2x2 cell of the blended map (by its top-left
        pixel), how far apart its displacements are at most (the blend of the nodes' own spreads)."""
        return self._blend(self._spread, values, (self.rect.h, self.rect.w))

    def _spread(self, node: tuple[int, ...]) -> np.ndarray:
        made = self._spreads.get(node)
        if made is None:
            g = self.grid(node)
            spread = (cv2.dilate(g, CELL, anchor=(0, 0)) - cv2.erode(g, CELL, anchor=(0, 0))).max(axis=2)
            made = self._spreads.setdefault(node, spread)
        return made

    def _blend(self, of, values: tuple[float, ...], shape: tuple[int, ...]) -> np.ndarray:
        corners: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
        for axis, value in zip(self.axes, values):
            i, t = _bracket(axis, value)
            corners = [(idx + (i + k,), w * (t if k else 1 - t)) for idx, w in corners for k in (0, 1)]
        out = None
        for idx, w in corners:
            if w <= 1e-6:
                continue
            g = of(idx)
            out = cv2.multiply(g, (w, w, w, w)) if out is None else cv2.scaleAdd(g, w, out, dst=out)  # (in place)
        return out if out is not None else np.zeros(shape, np.float32)

    def confined(self, floor: np.ndarray) -> "Bank":
        """This bank with every map limited by ``rigid.confine`` to the columns' rigid ``floor``."""
        return Bank(rect=self.rect, axes=self.axes, warps=dataclasses.replace(self.warps, floor=floor))

    def sliding(self, chin: ChinSlide) -> "Bank":
        """This bank with every map's chin sliding over what lies under it (``chin.ChinSlide``)."""
        return Bank(rect=self.rect, axes=self.axes, warps=dataclasses.replace(self.warps, chin=chin))


@dataclass(frozen=True, eq=False)
class Teeth:
    """The reference's visible teeth (what lies between the inner lip contours), split into an upper part
    that moves with the upper lip and a lower part that moves with the jaw; masks over the mouth bank's rect."""

    upper: np.ndarray  # (h, w) float32 coverage
    lower: np.ndarray  # (h, w) float32
    split: float  # where upper meets lower, as a fraction of the gap from the upper lip
    lips: tuple[np.ndarray, np.ndarray]  # the reference's inner lip contours, upper and lower, (11, 2) pixels
    visible: bool  # the reference shows teeth at all
    colour: np.ndarray  # (3,) float32 RGB: its teeth (their lit half), or without any, an off-white from the skin


@dataclass(frozen=True, eq=False)
class HeadMask:
    """How much each pixel moves with the head: 1 on the head, fading to 0 over the background.

    Sampled at every other pixel of ``rect`` (even-sized), the head's warp is made at that resolution
    and resized up: exact where the weight is constant (the warp is affine there), smooth elsewhere.
    """

    rect: Rect
    xs: np.ndarray  # (h/2, w/2) float32 pixel-centre x of the samples
    ys: np.ndarray
    weight: np.ndarray  # (h/2, w/2) float32
    wx: np.ndarray  # weight * xs
    wy: np.ndarray  # weight * ys
    pivot: tuple[float, float]  # the neck, pixels
    face_width: float  # pixels (head travel is in face widths)


@dataclass(frozen=True, eq=False)
class FaceRig:
    image: np.ndarray  # (H, W, 3) uint8, the fitted reference
    mesh: fm.FaceMesh  # in output pixels
    # (3,) float32 RGB each: the shadow under the teeth, the mouth's dark, the tongue
    interior: tuple[np.ndarray, np.ndarray, np.ndarray]
    head: HeadMask
    mouth: MouthShape | None = None  # None: the face is too small to animate its mouth and eyes
    eyes: EyeShape | None = None
    mouth_bank: Bank | None = None
    eye_bank: Bank | None = None
    teeth: Teeth | None = None
    synth: MouthInterior | None = None  # a generated interior, where the reference shows no teeth of its own


def build_rig(image: np.ndarray, mesh: fm.FaceMesh, *, person: Segment | None = None, motion: float = 1.0) -> FaceRig:
    """person: how far each pixel of a region (x0, y0, x1, y1) of the image is the person's (``face.segment``), or
    None: the background around the head then moves with it, as far as the head's ellipse reaches. motion: how far the
    head moves (``preview.head_motion``): the band of background moving with it widens with it."""
    height, width = image.shape[:2]
    skin = _median_colour(image, mesh.at(_CHEEKS))
    colour = colour_spread(image)
    interior = _interior(skin, lip_colour(image, mesh, fallback=skin), colour)
    if mesh.mouth_width() < MIN_MOUTH_PX:
        head = _kept_off(image, mesh, _head_mask(mesh, width, height), person, motion)
        return FaceRig(image=image, mesh=mesh, interior=interior, head=head)
    mesh = fit_lower_lids(image, mesh)
    vertices = mesh_vertices(mesh)
    # (whether it shows teeth, read on the lips' own box before the warp bank sets the final one)
    lips = Rect.around(mesh.at(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER), width, height, margin=4.0)
    mouth = MouthShape.build(mesh, vertices, closed=not _teeth(image, mesh, lips, skin=skin).visible)
    eyes = EyeShape.build(mesh, vertices)
    triangles = _triangulate(vertices, mouth, mesh)
    mouth_bank = _bank(vertices, triangles, [OPEN_LEVELS, WIDTH_LEVELS], lambda o, w: mouth.moved(o, w), width, height)
    eye_bank = _bank(vertices, triangles, [BLINK_LEVELS], lambda b: eyes.moved(b), width, height)
    down = np.max([(p - vertices) @ mesh.axes()[1] for p in mouth_bank.warps.shapes.values()], axis=0)
    chin = ChinSlide.build(mesh, vertices, down, mouth_bank.rect, face_coords)
    if chin is not None:  # the chin comes down over what lies under it
        mouth_bank = mouth_bank.sliding(chin)
    floor = rigid_floor(image, mesh, eye_bank.rect)  # spectacle frames, brows: a blink does not bend them
    if np.isfinite(floor).any():
        eye_bank = eye_bank.confined(floor)
    head = _kept_off(image, mesh, _head_mask(mesh, width, height, include=mouth_bank.rect.union(eye_bank.rect)),
                     person, motion)
    teeth = _teeth(image, mesh, mouth_bank.rect, skin=skin)
    return FaceRig(
        image=image,
        mesh=mesh,
        mouth=mouth,
        eyes=eyes,
        mouth_bank=mouth_bank,
        eye_bank=eye_bank,
        teeth=teeth,
        synth=None if teeth.visible else build_interior(image, mesh, mouth_bank.rect, skin=skin, colour=colour),
        interior=interior,
        head=head,
    )


def _kept_off(image: np.ndarray, mesh: fm.FaceMesh, head: HeadMask, person: Segment | None, motion: float) -> HeadMask:
    """The head's mask kept off the background (``preview.backdrop``), where the person is known."""
    r = head.rect
    if person is None or r.empty:
        return head
    band = BAND * max(motion, 1.0) * head.face_width
    weight = hug(head.weight, r, person(image, (r.x0, r.y0, r.x1, r.y1)), mesh.at(fm.FACE_OVAL), band)
    if weight is None:
        return head
    return dataclasses.replace(head, weight=weight, wx=weight * head.xs, wy=weight * head.ys)


def still_rig(image: np.ndarray, mesh: fm.FaceMesh) -> FaceRig:
    """A picture in which no face was found: shown as it is in every frame (a mouth drawn where a face is only
    assumed lands on whatever is there: a tie, a wall)."""
    nothing = np.zeros((0, 0), np.float32)
    head = HeadMask(rect=Rect(0, 0, 0, 0), xs=nothing, ys=nothing, weight=nothing, wx=nothing, wy=nothing,
                    pivot=(0.0, 0.0), face_width=1.0)
    skin = _median_colour(image, mesh.at(_CHEEKS))
    return FaceRig(image=image, mesh=mesh, interior=_interior(skin, skin, 1.0), head=head)


def _interior(skin: np.ndarray, lips: np.ndarray, colour: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # The inside of the mouth is the dark red of its lining, in shadow, whatever the lips' colour; as red as the
    # photo is coloured: in a black-and-white (or toned) photo, as bright, in the lips' own tint.
    red = np.array(_MOUTH_RED, np.float32)
    bright = float(red @ LUMA)
    own = lips / max(float(lips @ LUMA), 1.0)  # the lips' tint, at a brightness of 1
    amount = np.float32(min(max(saturation(skin), saturation(lips)), colour))
    red = float(skin @ LUMA) * bright * (own + (red / bright - own) * amount)
    return red * np.float32(0.2), red * np.float32(0.38), red * np.float32(0.7)


def mesh_vertices(mesh: fm.FaceMesh) -> np.ndarray:
    """The landmarks, then a fixed ring around the face outline (the warp fades out inside it)."""
    oval = mesh.at(fm.FACE_OVAL)
    centre = oval.mean(axis=0)
    ring = centre + (oval - centre) * _RING
    return np.concatenate([mesh.points, ring]).astype(np.float32)


def _triangulate(vertices: np.ndarray, mouth: MouthShape, mesh: fm.FaceMesh) -> np.ndarray:
    """Delaunay triangles of the mesh with the mouth half open, so that none crosses from one lip to the other.

    Landmarks inside the lips (between their outer and inner contours) and inside the eye openings are
    left out: the model places them close to the contours, sometimes across them, and a triangle that
    spans a contour folds when the lips press together or a lid comes down.
    """
    inner = set(
        fm.LIPS_OUTER_UPPER
        + fm.LIPS_OUTER_LOWER
        + fm.LIPS_INNER_UPPER
        + fm.LIPS_INNER_LOWER
        + fm.LEFT_EYE_UPPER
        + fm.LEFT_EYE_LOWER
        + fm.RIGHT_EYE_UPPER
        + fm.RIGHT_EYE_LOWER
    )
    drop = np.zeros(len(vertices), bool)
    for outline in (
        fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER[::-1],
        fm.LEFT_EYE_UPPER + fm.LEFT_EYE_LOWER[::-1],
        fm.RIGHT_EYE_UPPER + fm.RIGHT_EYE_LOWER[::-1],
    ):
        poly = mesh.at(outline).astype(np.float32)
        for i in range(fm.NUM_POINTS):
            if (
                i not in inner
                and cv2.pointPolygonTest(poly, (float(vertices[i, 0]), float(vertices[i, 1])), True) > -0.5
            ):
                drop[i] = True
    keep = np.flatnonzero(~drop)
    opened = (vertices + mouth.jaw * 0.6)[keep]
    # Coinciding vertices (a template's closed lips) are nudged apart; Subdiv2D keeps only one of each.
    _, first = np.unique(np.round(opened, 3), axis=0, return_index=True)
    dup = np.setdiff1d(np.arange(len(opened)), first)
    opened[dup] += 1e-2 * (1 + np.arange(len(dup)))[:, None]
    return keep[delaunay(opened)].astype(np.int32)


def _bank(vertices, triangles, axes, moved, width: int, height: int) -> Bank:
    nodes = [()]
    for axis in axes:
        nodes = [n + (i,) for n in nodes for i in range(len(axis))]
    shapes = {n: moved(*(axes[k][i] for k, i in enumerate(n))) for n in nodes}
    moving = np.zeros(len(vertices), bool)
    for p in shapes.values():
        moving |= np.abs(p - vertices).max(axis=1) > 1e-3
    touched = triangles[moving[triangles].any(axis=1)]
    pts = (
        np.concatenate([vertices[touched.ravel()]] + [p[touched.ravel()] for p in shapes.values()])
        if len(touched)
        else vertices
    )
    rect = Rect.around(pts, width, height, margin=2.0)
    return Bank(rect=rect, axes=tuple(tuple(a) for a in axes),
                warps=Warps(vertices=vertices, shapes=shapes, triangles=touched, rect=rect))


def face_coords(xs: np.ndarray, ys: np.ndarray, mesh: fm.FaceMesh) -> tuple[np.ndarray, np.ndarray]:
    """Pixel-edge coordinates -> (s, t): along the eye line and down the face, pixels, from the lip corners' middle."""
    ex, ey = mesh.axes()
    c = (mesh.points[61] + mesh.points[291]) / 2
    dx, dy = xs - c[0], ys - c[1]
    return dx * ex[0] + dy * ex[1], dx * ey[0] + dy * ey[1]


def from_face(s: np.ndarray, t: np.ndarray, mesh: fm.FaceMesh) -> tuple[np.ndarray, np.ndarray]:
    """Face coordinates (s, t) -> pixel-centre coordinates (OpenCV's convention) x, y, each float32."""
    ex, ey = mesh.axes()
    c = (mesh.points[61] + mesh.points[291]) / 2 - 0.5
    return (c[0] + s * ex[0] + t * ey[0]).astype(np.float32), (c[1] + s * ex[1] + t * ey[1]).astype(np.float32)


def contour_t(s: np.ndarray, contour: np.ndarray, mesh: fm.FaceMesh) -> np.ndarray:
    """Where a contour ((n, 2) pixels, corner to corner) lies down the face at each s."""
    cs, ct = face_coords(contour[:, 0], contour[:, 1], mesh)
    return np.interp(s, cs, ct)


def between(
    s: np.ndarray,
    t: np.ndarray,
    upper: np.ndarray,
    lower: np.ndarray,
    mesh: fm.FaceMesh,
    *,
    grow: float = 0.0,
    min_gap: float = 1.0,
    feather: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Antialiased coverage of the band between two contours (each (n, 2) pixels, corner to corner) at face
    coordinates (s, t), grown by ``grow`` pixels each way with edges ``feather`` pixels soft, and where each
    point lies across it (0 at the upper contour, 1 at the lower). Where the band is thinner than
    ``min_gap`` it fades out."""
    us, _ = face_coords(upper[:, 0], upper[:, 1], mesh)
    ls, _ = face_coords(lower[:, 0], lower[:, 1], mesh)
    tu, tl = contour_t(s, upper, mesh), contour_t(s, lower, mesh)
    gap = tl - tu
    k = 1.0 / feather
    inside = np.clip((t - (tu - grow)) * k + 0.5, 0, 1) * np.clip(((tl + grow) - t) * k + 0.5, 0, 1)
    inside *= np.clip((s - min(us[0], ls[0])) * k + 0.5, 0, 1) * np.clip((max(us[-1], ls[-1]) - s) * k + 0.5, 0, 1)
    inside *= np.clip((gap - min_gap) / 1.5, 0, 1)
    across = (t - tu) / np.maximum(gap, 1e-3)
    return inside.astype(np.float32), across.astype(np.float32)


def _teeth(image: np.ndarray, mesh: fm.FaceMesh, rect: Rect, *, skin: np.ndarray) -> Teeth:
    xs, ys = rect.grid()
    s, t = face_coords(xs + 0.5, ys + 0.5, mesh)
    upper, lower = mesh.at(fm.LIPS_INNER_UPPER), mesh.at(fm.LIPS_INNER_LOWER)
    inside, across = between(s, t, upper, lower, mesh, grow=1.5, min_gap=1.0)
    patch = image[rect.slices].astype(np.float32)
    split = _split(patch, s, inside, across, mesh.mouth_width())
    up = inside * np.clip((split - across) * 8 + 0.5, 0, 1)
    # Teeth are what is bright and unsaturated between the lips (the dark corners and the tongue are not).
    luma = patch @ np.array([0.299, 0.587, 0.114], np.float32)
    chroma = patch.max(axis=2) - patch.min(axis=2)
    skin_luma = float(skin @ np.array([0.299, 0.587, 0.114], np.float32))
    # Closed lips show none (on a closed smile the band between the contours is lip and its highlights).
    lips = float(lip_colour(image, mesh, fallback=skin) @ np.array([0.299, 0.587, 0.114], np.float32))
    tooth = (inside > 0.9) & (luma > 0.8 * skin_luma) & (luma > lips + 25) & (chroma < 0.5 * np.maximum(luma, 1))
    visible = (
        int(tooth.sum()) >= max(12, round(0.002 * mesh.mouth_width() ** 2))
        and mesh.lip_gap() >= OPEN_LIPS * mesh.mouth_width()
    )
    if visible:
        colour = np.median(patch[tooth & (luma >= np.median(luma[tooth]))], axis=0)
    else:
        grey = np.full(3, skin_luma, np.float32)
        colour = np.clip(0.35 * skin + 0.65 * grey * 1.05, 0, 255)
    return Teeth(
        upper=up.astype(np.float32),
        lower=(inside - up).astype(np.float32),
        split=split,
        lips=(upper, lower),
        visible=visible,
        colour=colour.astype(np.float32),
    )


def _split(patch: np.ndarray, s: np.ndarray, inside: np.ndarray, across: np.ndarray, mouth_width: float) -> float:
    """Where the upper teeth meet the lower ones, as a fraction of the lip gap from the upper lip: a dark line
    with bright teeth above and below it across the middle of the mouth. Without one, the visible teeth are
    one row, taken as the upper teeth (1.0): smiles show those."""
    luma = patch.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    sel = (inside > 0.99) & (np.abs(s) < 0.25 * mouth_width)
    if sel.sum() < 20:
        return 1.0
    bins = np.clip((across[sel] * 10).astype(int), 0, 9)
    sums, counts = np.bincount(bins, luma[sel], 10), np.bincount(bins, None, 10)
    means = np.where(counts >= 2, sums / np.maximum(counts, 1), np.nan)
    bright = np.nanmax(means) if np.isfinite(means).any() else 0.0
    for k in np.argsort(np.nan_to_num(means, nan=np.inf)):
        if not 2 <= k <= 8 or not np.isfinite(means[k]) or means[k] > bright - 30:
            continue
        if np.nanmax(means[:k]) > bright - 15 and np.nanmax(means[k + 1 :]) > bright - 15:
            return float((k + 0.5) / 10)
    return 1.0


def _median_colour(image: np.ndarray, points: np.ndarray) -> np.ndarray:
    h, w = image.shape[:2]
    xs = np.clip(points[:, 0].astype(int), 0, w - 1)
    ys = np.clip(points[:, 1].astype(int), 0, h - 1)
    return np.median(image[ys, xs].astype(np.float32), axis=0).astype(np.float32)


def _head_mask(mesh: fm.FaceMesh, width: int, height: int, include: Rect | None = None) -> HeadMask:
    ex, ey = mesh.axes()
    oval = mesh.at(fm.FACE_OVAL)
    top, chin = mesh.points[10], mesh.points[fm.CHIN]
    face_h = float(np.linalg.norm(chin - top)) * 1.15
    face_w = float((oval @ ex).max() - (oval @ ex).min())
    centre = (top + chin) / 2 - 0.08 * face_h * ey
    a, b = 0.62 * face_w, 0.62 * face_h
    band = 0.3 * face_w
    # A wide face reaches past that ellipse on its sides: it widens to take them in, and its band narrows as much
    # (the rectangle gets no wider, and the remap no dearer).
    c = oval.mean(axis=0)
    s_, t_ = ((c + (oval - c) * _HEAD - centre) @ np.stack([ex, ey]).T).T
    side = np.abs(t_) < 0.9 * b
    if side.any():
        wide = min(float((np.abs(s_[side]) / np.sqrt(1 - (t_[side] / b) ** 2)).max()), a + band - _MIN_BAND * face_w)
        if wide > a:
            a, band = wide, band - (wide - a)
    reach = np.array([[a + band, b + band]], np.float32)
    corners = centre + np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float32) * reach @ np.stack([ex, ey])
    rect = Rect.around(corners, width, height)
    if include is not None and not include.empty:
        rect = rect.union(include)
    rect = Rect(rect.x0, rect.y0, rect.x0 + rect.w // 2 * 2, rect.y0 + rect.h // 2 * 2)
    # Samples at full-resolution pixel centres x0 + 2i + 0.5: a bilinear 2x resize puts them back exactly.
    xs = np.broadcast_to(
        rect.x0 + 0.5 + 2 * np.arange(rect.w // 2, dtype=np.float32), (rect.h // 2, rect.w // 2)
    ).copy()
    ys = np.broadcast_to(
        (rect.y0 + 0.5 + 2 * np.arange(rect.h // 2, dtype=np.float32))[:, None], (rect.h // 2, rect.w // 2)
    ).copy()
    dx, dy = xs + 0.5 - centre[0], ys + 0.5 - centre[1]
    s, t = dx * ex[0] + dy * ex[1], dx * ey[0] + dy * ey[1]
    r = np.sqrt((s / a) ** 2 + (t / b) ** 2)
    k = np.clip((r - 1) / (band / np.sqrt(a * b)), 0, 1)
    w = (1 - k * k * (3 - 2 * k)).astype(np.float32)
    pivot = chin + 0.35 * face_h * ey
    return HeadMask(
        rect=rect,
        xs=xs,
        ys=ys,
        weight=w,
        wx=w * xs,
        wy=w * ys,
        pivot=(float(pivot[0]), float(pivot[1])),
        face_width=max(face_w, 1.0),
    )
