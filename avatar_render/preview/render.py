"""Preview rendering: one RGB frame from the rig and a row of motion parameters.

The frame is one remap of the reference: the head's soft warp, composed with the mouth and eyelid
warps blended from their banks. Then two kinds of gaps are filled, each inside the moved contours
and nowhere else: the mouth's inner contour shows the reference's own teeth (upper ones moved with
the upper lip, lower ones with the jaw) over a dark interior where the mouth has newly opened; the
eyes' lid contours show the reference's eyes where the lids have not yet covered them.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import cv2
import numpy as np

from avatar_render.face import mesh as fm
from avatar_render.preview.interior import paint
from avatar_render.preview.motion import BLINK, DX, DY, OPEN, ROLL, WIDTH, ZOOM
from avatar_render.preview.rig import CELL, Bank, FaceRig, between, contour_t, face_coords, from_face
from avatar_render.preview.warp import Rect

CUBIC_MAX_PX = 150_000  # heads up to this many pixels are resampled bicubically, larger ones bilinearly
FOLD_PX = 2.0  # a bank's neighbouring displacements further apart than this are a fold (``_Fold``)
_SCRATCH = threading.local()  # the head maps' buffers (see _maps)


def head_inverse(rig: FaceRig, p: np.ndarray) -> np.ndarray:
    """(2, 3) affine in pixel-centre coordinates: output pixel -> reference pixel, for the head at ``p``."""
    h = rig.head
    px, py = h.pivot[0] - 0.5, h.pivot[1] - 0.5
    fwd = cv2.getRotationMatrix2D((px, py), float(p[ROLL]), 1.0 + float(p[ZOOM]))
    fwd[0, 2] += float(p[DX]) * h.face_width
    fwd[1, 2] += float(p[DY]) * h.face_width
    return cv2.invertAffineTransform(fwd)


def render_frame(rig: FaceRig, p: np.ndarray, out: np.ndarray | None = None, *, background: bool = False) -> np.ndarray:
    """p: (len(PARAMS),) motion row -> (H, W, 3) uint8, written into ``out`` when given. ``background``:
    ``out`` holds the reference already outside the head's rectangle (only the rectangle is drawn)."""
    head = rig.head
    rect = head.rect
    if out is None:
        out = rig.image.copy()
    elif not background:
        out[:] = rig.image
    if rect.empty or not np.any(p):
        if background:
            out[rect.slices] = rig.image[rect.slices]
        return out
    inv = head_inverse(rig, p)
    hx, hy, mx, my = _maps(head.wx.shape, rect)
    # Head: source = x + weight * (inv(x) - x), the background still where the weight is 0.
    cv2.scaleAdd(head.wx, float(inv[0, 0] - 1), head.xs, dst=hx)
    cv2.scaleAdd(head.wy, float(inv[0, 1]), hx, dst=hx)
    cv2.scaleAdd(head.weight, float(inv[0, 2]), hx, dst=hx)
    cv2.scaleAdd(head.wx, float(inv[1, 0]), head.ys, dst=hy)
    cv2.scaleAdd(head.wy, float(inv[1, 1] - 1), hy, dst=hy)
    cv2.scaleAdd(head.weight, float(inv[1, 2]), hy, dst=hy)
    cv2.resize(hx, (rect.w, rect.h), dst=mx, interpolation=cv2.INTER_LINEAR)
    cv2.resize(hy, (rect.w, rect.h), dst=my, interpolation=cv2.INTER_LINEAR)
    _edges(mx, my, rect, head, inv)
    fwd = cv2.invertAffineTransform(inv)
    mouth_moves = rig.mouth_bank is not None and (p[OPEN] != 0 or p[WIDTH] != 0)
    folds = []
    if mouth_moves:
        folds.append(_compose(mx, my, rect, rig.mouth_bank, (float(p[OPEN]), float(p[WIDTH])), fwd))
    if rig.eye_bank is not None and p[BLINK] > 0:
        folds.append(_compose(mx, my, rect, rig.eye_bank, (float(p[BLINK]),), fwd))
    # Bicubic keeps the skin's fine texture through the head's sub-pixel motion (bilinear blurs it: SSIM to the
    # reference 0.95 against 0.96 on the example); on large heads it costs more than the frame's budget.
    interp = cv2.INTER_CUBIC if rect.w * rect.h <= CUBIC_MAX_PX else cv2.INTER_LINEAR
    cv2.remap(rig.image, mx, my, interp, dst=out[rect.slices], borderMode=cv2.BORDER_REPLICATE)
    for fold in folds:
        if fold is not None:
            fold.draw(out[rect.slices], rig.image)
    if mouth_moves:
        _mouth_gap(out, rig, p, inv, fwd)
        if p[OPEN] < 0:
            _lip_seam(out, rig, p, inv, fwd)
    if rig.eyes is not None and p[BLINK] > 0:
        _eye_gaps(out, rig, float(p[BLINK]), inv, fwd)
    return out


def _maps(half: tuple[int, ...], rect: Rect) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """This thread's float32 buffers for the head's maps: x and y at half resolution (``half``), then over ``rect``.
    Written afresh in every frame: new arrays each time cost more than the arithmetic (their pages faulted in)."""
    key = (half, rect.h, rect.w)
    if getattr(_SCRATCH, "key", None) != key:
        _SCRATCH.key = key
        _SCRATCH.maps = tuple(np.empty(shape, np.float32) for shape in (half, half, (rect.h, rect.w), (rect.h, rect.w)))
    return _SCRATCH.maps


def _edges(mx: np.ndarray, my: np.ndarray, rect: Rect, head, inv: np.ndarray) -> None:
    """The resize cannot reach the outermost rows and columns exactly (it clamps there): set them directly."""
    xs, ys, k, parts = _edge_points(rect, head)
    x = xs + k * (inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2] - xs)
    y = ys + k * (inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2] - ys)
    for sl, a, b in parts:  # (in this order: the columns' ends overwrite the rows' at the corners)
        mx[sl] = x[a:b]
        my[sl] = y[a:b]


def _edge_points(rect: Rect, head) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple]:
    """The rectangle's top row, bottom row, left and right columns one after another: x, y and the head's weight,
    each (2 * (w + h),) float32, and each part's (index into the maps, start, end) in them. Made once a head."""
    if getattr(_SCRATCH, "edge_head", None) is not head or _SCRATCH.edge_rect != rect:
        cols = np.arange(rect.x0, rect.x1, dtype=np.float32)
        rows = np.arange(rect.y0, rect.y1, dtype=np.float32)
        hw = head.weight
        edges = (
            ((0, slice(None)), cols, np.full_like(cols, rect.y0), np.repeat(hw[0], 2)[: rect.w]),
            ((-1, slice(None)), cols, np.full_like(cols, rect.y1 - 1), np.repeat(hw[-1], 2)[: rect.w]),
            ((slice(None), 0), np.full_like(rows, rect.x0), rows, np.repeat(hw[:, 0], 2)[: rect.h]),
            ((slice(None), -1), np.full_like(rows, rect.x1 - 1), rows, np.repeat(hw[:, -1], 2)[: rect.h]),
        )
        ends = np.cumsum([0] + [len(e[1]) for e in edges])
        parts = tuple((e[0], int(a), int(b)) for e, a, b in zip(edges, ends[:-1], ends[1:]))
        _SCRATCH.edge_head, _SCRATCH.edge_rect = head, rect  # (the head held: its weights cannot change under it)
        _SCRATCH.edges = tuple(np.concatenate([e[i] for e in edges]) for i in (1, 2, 3)) + (parts,)
    return _SCRATCH.edges


def _forward_rect(fwd: np.ndarray, pts: np.ndarray, within: Rect, margin: float) -> Rect:
    """Output pixels covering reference points (n, 2, edge coordinates) moved by the head, clipped to ``within``."""
    moved = (pts - 0.5) @ fwd[:, :2].T + fwd[:, 2] + 0.5
    r = Rect.around(moved, within.x1, within.y1, margin=margin)
    return Rect(max(r.x0, within.x0), max(r.y0, within.y0), r.x1, r.y1)


def _compose(
    mx: np.ndarray, my: np.ndarray, rect: Rect, bank: Bank, amounts: tuple[float, ...], fwd: np.ndarray
) -> "_Fold | None":
    """Add a bank's displacements at ``amounts``, sampled where the head map points, to the head map (in place);
    the pixels where they fold (``_Fold``), if any."""
    b = bank.rect
    corners = np.array([[b.x0, b.y0], [b.x1, b.y0], [b.x1, b.y1], [b.x0, b.y1]], np.float32)
    r = _forward_rect(fwd, corners, rect, 2.0)
    if r.empty:
        return None
    sl = (slice(r.y0 - rect.y0, r.y1 - rect.y0), slice(r.x0 - rect.x0, r.x1 - rect.x0))
    x, y = mx[sl] - b.x0, my[sl] - b.y0
    disp = bank.blend(*amounts)
    d = cv2.remap(disp, x, y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    folded = bank.spread(*amounts) > FOLD_PX
    fold = _Fold.find(disp, folded, x, y, (r.y0 - rect.y0, r.x0 - rect.x0), (b.x0, b.y0)) if folded.any() else None
    mx[sl] += d[..., 0]
    my[sl] += d[..., 1]
    return fold


@dataclass(frozen=True)
class _Fold:
    """Pixels where a bank's map folds: a lid shut over the eye (above the closed line the map points up to the
    lid, below it at the lower lid), the lips pressed together, the chin come down over the collar. A displacement
    blended between the two sides points into what lies between them (the eye's white showed under the closed
    line, the teeth along the lips' seam, whenever the head had moved by a fraction of a pixel); there the
    colours the four neighbouring displacements point at are blended instead."""

    rows: np.ndarray  # (n,) int, in the head's rectangle
    cols: np.ndarray  # (n,) int
    xs: np.ndarray  # (n, 4) float32 reference pixels each neighbour points at
    ys: np.ndarray  # (n, 4) float32
    weights: np.ndarray  # (n, 4) float32 bilinear

    @staticmethod
    def find(
        disp: np.ndarray, folded: np.ndarray, x: np.ndarray, y: np.ndarray, at: tuple[int, int], origin: tuple[int, int]
    ) -> "_Fold | None":
        """disp: (h, w, 2) a bank's map; folded: (h, w) its 2x2 cells (by the top-left pixel) that fold; x, y: (m, k)
        where the head map points, in the bank's pixels, for the head rectangle's pixels from row, column ``at``;
        ``origin``: the bank's top-left, reference pixels."""
        h, w = folded.shape
        # Candidates first, in one pass over the pixels: those sampling next to a corner of a folded cell (a
        # per-pixel floor over the whole rectangle cost 2.8 ms a frame at 1080p); then the exact cell of each.
        corner = cv2.dilate(folded.astype(np.uint8), CELL, anchor=(1, 1)).astype(np.float32)
        near = cv2.remap(corner, x, y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
        rows, cols = np.nonzero(near > 0)
        px, py = x[rows, cols], y[rows, cols]
        j, i = np.floor(px).astype(np.int32), np.floor(py).astype(np.int32)
        inside = (j >= 0) & (i >= 0) & (j < w - 1) & (i < h - 1)
        hit = np.zeros_like(inside)
        hit[inside] = folded[i[inside], j[inside]]
        if not hit.any():
            return None
        rows, cols, px, py, i, j = rows[hit], cols[hit], px[hit], py[hit], i[hit], j[hit]
        fx, fy = px - j, py - i
        d = np.stack([disp[i, j], disp[i, j + 1], disp[i + 1, j], disp[i + 1, j + 1]], axis=1)  # (n, 4, 2)
        weights = np.stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy], axis=1)
        xs = (px + origin[0])[:, None] + d[..., 0]
        ys = (py + origin[1])[:, None] + d[..., 1]
        f32 = np.float32
        return _Fold(rows + at[0], cols + at[1], xs.astype(f32), ys.astype(f32), weights.astype(f32))

    def draw(self, region: np.ndarray, image: np.ndarray) -> None:
        """Blend the colours into ``region`` (the head's rectangle of the frame) from ``image`` (the reference)."""
        flat = (self.xs.reshape(1, -1), self.ys.reshape(1, -1))
        got = cv2.remap(image, *flat, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE).astype(np.float32)
        mixed = (got.reshape(len(self.rows), 4, -1) * self.weights[..., None]).sum(axis=1)
        region[self.rows, self.cols] = np.clip(mixed + 0.5, 0, 255).astype(np.uint8)


def _sources(sub: Rect, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference pixel centres under the output pixels of ``sub`` (on the face, where the head moves rigidly)."""
    xs, ys = sub.grid()
    return (inv[0, 0] * xs + inv[0, 1] * ys + inv[0, 2]).astype(np.float32), (
        inv[1, 0] * xs + inv[1, 1] * ys + inv[1, 2]
    ).astype(np.float32)


def _mouth_gap(out: np.ndarray, rig: FaceRig, p: np.ndarray, inv: np.ndarray, fwd: np.ndarray) -> None:
    mouth, teeth, rect = rig.mouth, rig.teeth, rig.head.rect
    assert mouth is not None and teeth is not None and rig.mouth_bank is not None
    moved = mouth.moved(float(p[OPEN]), float(p[WIDTH]))
    upper, lower = moved[list(fm.LIPS_INNER_UPPER)], moved[list(fm.LIPS_INNER_LOWER)]
    sub = _forward_rect(fwd, np.concatenate([upper, lower]), rect, 2.0)
    if sub.empty:
        return
    sx, sy = _sources(sub, inv)
    s, t = face_coords(sx + 0.5, sy + 0.5, rig.mesh)
    feather = max(1.0, 0.015 * mouth.width_px, 1.2 * rig.synth.blur if rig.synth is not None else 0.0)
    inside, _ = between(s, t, upper, lower, rig.mesh, min_gap=1.0, feather=feather)
    if not inside.any():
        return
    if rig.synth is not None:
        content = paint(
            rig.synth,
            s,
            t,
            lip_up=contour_t(s, teeth.lips[0], rig.mesh),
            lip_low=contour_t(s, teeth.lips[1], rig.mesh),
            moved_up=contour_t(s, upper, rig.mesh),
            moved_low=contour_t(s, lower, rig.mesh),
            jaw=float(mouth.teeth(float(p[OPEN]), float(p[WIDTH]))[1] @ mouth.down),
            rounded=max(-float(p[WIDTH]), 0.0),
            sources=(sx, sy),
        )
        a = inside[..., None]
        region = out[sub.slices].astype(np.float32)
        out[sub.slices] = np.clip(a * content + (1 - a) * region + 0.5, 0, 255).astype(np.uint8)
        return
    d_up, d_low = mouth.teeth(float(p[OPEN]), float(p[WIDTH]))
    b = rig.mouth_bank.rect
    _, ey = rig.mesh.axes()
    ref_up, ref_low = teeth.lips
    edge = 0.5 + 0.02 * mouth.width_px  # how far inside the reference's lips its teeth are sampled at most

    lips = contour_t(s, ref_up, rig.mesh), contour_t(s, ref_low, rig.mesh)  # (the reference's, down the face)

    def layer(shift: np.ndarray, mask: np.ndarray, *, upper_row: bool) -> tuple[np.ndarray, np.ndarray]:
        # Where a lip has moved off the teeth (spread lips, the upper lip raised), more of the same teeth
        # shows, not the inside of the mouth: sources beyond the reference's lip line are taken from inside it.
        t_src = t - float(shift @ ey)
        if upper_row:
            limit = lips[0] + edge
            moved_by = np.maximum(limit - t_src, 0)
        else:
            limit = lips[1] - edge
            moved_by = np.minimum(limit - t_src, 0)
        x = (sx - float(shift[0]) + moved_by * float(ey[0])).astype(np.float32)
        y = (sy - float(shift[1]) + moved_by * float(ey[1])).astype(np.float32)
        px = cv2.remap(rig.image, x, y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE).astype(np.float32)
        m = cv2.remap(mask, x - b.x0, y - b.y0, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
        return px, m[..., None]

    up_px, up_m = layer(d_up, teeth.upper, upper_row=True)
    low_px, low_m = layer(d_low, teeth.lower, upper_row=False)
    inner = _interior(rig, s, t, lips, upper, d_up, d_low)
    content = up_m * up_px + (1 - up_m) * (low_m * low_px + (1 - low_m) * inner)
    a = inside[..., None]
    region = out[sub.slices].astype(np.float32)
    out[sub.slices] = np.clip(a * content + (1 - a) * region + 0.5, 0, 255).astype(np.uint8)


def _lip_seam(out: np.ndarray, rig: FaceRig, p: np.ndarray, inv: np.ndarray, fwd: np.ndarray) -> None:
    """Lips pressed together meet in a soft dark line (the reference's teeth gap closed by the warp leaves
    only lip against lip, which reads as one smear of lip without it)."""
    mouth, rect = rig.mouth, rig.head.rect
    assert mouth is not None
    closing = min(1.0, -float(p[OPEN]))
    moved = mouth.moved(float(p[OPEN]), float(p[WIDTH]))
    upper, lower = moved[list(fm.LIPS_INNER_UPPER)], moved[list(fm.LIPS_INNER_LOWER)]
    mid = (upper + lower) / 2
    sub = _forward_rect(fwd, mid, rect, 2.0 + 0.04 * mouth.width_px)
    if sub.empty:
        return
    sx, sy = _sources(sub, inv)
    s, t = face_coords(sx + 0.5, sy + 0.5, rig.mesh)
    gap = contour_t(s, lower, rig.mesh) - contour_t(s, upper, rig.mesh)
    met = np.clip(1 - gap / (0.03 * mouth.width_px), 0, 1)
    ends, _ = face_coords(mid[[0, -1], 0], mid[[0, -1], 1], rig.mesh)
    half = max(float(ends[1] - ends[0]) / 2, 1.0)
    r = np.clip(np.abs(s - ends.mean()) / half, 0, 1.2)
    along = np.clip((1.0 - r) / 0.3, 0, 1) * (1 - 0.5 * r * r)
    sigma = max(0.5, 0.006 * mouth.width_px)
    line = np.exp(-(((t - contour_t(s, mid, rig.mesh)) / sigma) ** 2)) * met * along * closing
    if not line.any():
        return
    region = out[sub.slices].astype(np.float32)
    out[sub.slices] = np.clip(region * (1 - 0.2 * line)[..., None] + 0.5, 0, 255).astype(np.uint8)


def _interior(
    rig: FaceRig,
    s: np.ndarray,
    t: np.ndarray,
    lips: tuple[np.ndarray, np.ndarray],
    upper: np.ndarray,
    d_up: np.ndarray,
    d_low: np.ndarray,
) -> np.ndarray:
    """The newly opened mouth, between where the upper teeth (or lip) end and the lower ones (or the lower lip)
    begin -> (h, w, 3) float32 RGB. Not a flat hole: deepest in the shadow under the upper teeth, the dark
    of the mouth below that, the tongue's top rising from behind the lower lip once the mouth is open
    enough, the lower lip's wet inner side at the bottom edge, all darker towards the corners; and the
    edges of teeth the reference does not show: the lower row (when it shows only the upper one), or a
    shaded upper row (when it shows none). lips: ``contour_t`` of the reference's inner lips (``Teeth.lips``) at s."""
    assert rig.teeth is not None and rig.mouth is not None
    teeth, width = rig.teeth, max(rig.mouth.width_px, 1.0)
    shadow, cavity, tongue = rig.interior
    t_up, t_low = lips  # the reference's inner lip contours at each s
    _, ey = rig.mesh.axes()
    split = t_up + teeth.split * (t_low - t_up)
    top, bottom = split + float(d_up @ ey), split + float(d_low @ ey)
    gap = np.maximum(bottom - top, 1e-3)
    q = np.clip((t - top) / gap, 0, 1)  # 0 at the teeth's (or lip's) edge, 1 at the lower lip
    ends, _ = face_coords(upper[[0, -1], 0], upper[[0, -1], 1], rig.mesh)
    r = np.clip(np.abs(2 * (s - ends.mean()) / max(float(ends[1] - ends[0]), 1.0)), 0, 1)  # 0 middle, 1 corners
    k = np.clip(q / 0.45, 0, 1)
    out = shadow + (cavity - shadow) * (k * k * (3 - 2 * k))[..., None]
    # The tongue shows once the gap is a few hundredths of the mouth's width.
    shown = np.clip((gap / width - 0.04) / 0.08, 0, 1)
    u = np.clip((q - (0.5 + 0.3 * r * r)) / 0.3, 0, 1)
    lit = (u * u * (3 - 2 * u)) * shown * (1 - r * r)
    out = out + (tongue * (0.8 + 0.2 * q)[..., None] - out) * lit[..., None]
    # The lower lip's wet inner side rolls in at the bottom edge: a soft, dark red rim instead of a cut.
    j = np.clip((q - 0.8) / 0.2, 0, 1)
    out = out + (0.5 * (cavity + tongue) - out) * (j * j)[..., None]
    feather = max(0.7, 0.012 * width)
    middle = np.sqrt(np.clip(1 - r * r, 0, 1))
    if teeth.visible and teeth.split >= 1.0:
        # The lower incisors' edges above the lower lip: the reference's upper row seen in a mirror, narrower
        # and in shadow (the lower row is behind the lower lip at rest, so the reference cannot show it).
        h = np.minimum(0.55 * gap, 0.035 * width) * middle  # (teeth nearly together show mostly teeth)
        edge = bottom - h
        depth = t - edge
        x, y = from_face(s * 1.12, split - 0.5 * feather - depth, rig.mesh)
        row = cv2.remap(rig.image, x, y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE).astype(np.float32)
        lit = 0.85 - 0.35 * np.clip(depth / np.maximum(h, 1e-3), 0, 1)  # their tops catch the light
        a = np.clip(depth / feather + 0.5, 0, 1) * np.clip((h - 0.5) / 1.5, 0, 1) * (1 - r**4)
        out = out + (row * lit[..., None] - out) * a[..., None]
    elif not teeth.visible:
        # The upper incisors' edges under the upper lip, lit from the front, in the lip's shadow above.
        h = np.minimum(0.35 * gap, 0.05 * width) * middle
        v = np.clip((t - top) / np.maximum(h, 1e-3), 0, 1)
        a = np.clip((top + h - t) / feather + 0.5, 0, 1) * np.clip((h - 0.5) / 1.5, 0, 1) * (1 - r**3)
        out = out + (teeth.colour * (0.45 + 0.4 * v)[..., None] - out) * a[..., None]
    return out * (1 - 0.6 * r**3)[..., None]


def _eye_gaps(out: np.ndarray, rig: FaceRig, amount: float, inv: np.ndarray, fwd: np.ndarray) -> None:
    eyes, rect = rig.eyes, rig.head.rect
    assert eyes is not None
    moved = eyes.moved(amount)
    for upper_idx, lower_idx in fm.EYES:
        upper, lower = moved[list(upper_idx)], moved[list(lower_idx)]
        sub = _forward_rect(fwd, np.concatenate([upper, lower]), rect, 2.0)
        if sub.empty:
            continue
        sx, sy = _sources(sub, inv)
        s, t = face_coords(sx + 0.5, sy + 0.5, rig.mesh)
        inside, _ = between(s, t, upper, lower, rig.mesh, min_gap=0.0)
        if not inside.any():
            continue
        eye = cv2.remap(rig.image, sx, sy, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE).astype(np.float32)
        a = inside[..., None]
        region = out[sub.slices].astype(np.float32)
        out[sub.slices] = np.clip(a * eye + (1 - a) * region + 0.5, 0, 255).astype(np.uint8)
