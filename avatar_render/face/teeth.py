"""The template mesh on a face that shows its teeth: the template's lips are closed, and placed on a smile
their line runs across the teeth (a render then splits the teeth and cannot close the mouth). Where the
picture shows teeth inside the template's mouth, its lips are opened around them.

Teeth: pixels about as bright as the cheeks (0.85 of their grey level or more) and far greyer than them, their
largest connected patch, in the middle of the template's mouth and up to its own height above and below it
(the template's mouth is found 0.1-0.2 eye distances off on smiles). Closed-mouth portraits have none there.
"""

from __future__ import annotations

import cv2
import numpy as np

from avatar_render.face import mesh as fm

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
CHEEKS = (50, 101, 118, 205, 280, 330, 347, 425)  # landmarks on the cheeks, for the skin's brightness
MIN_SHARE = 0.1  # teeth must cover this much of the searched region (closed mouths: none)
# The lips are opened this far (mouth widths) beyond the teeth found: the teeth's darker edges (by the gums, in
# the lips' shadow) are not found, and lips pressed shut must cover them (at 1 px, a line of them stayed between
# the shut lips: obama's silence/speech 0.13-0.15; at 0.035, 0.05 and 0.07: 0.096-0.103, 0.072-0.080, 0.031-0.037)
OVER = 0.07
WIDEN_REACH = 1.5  # how far out (the template mouth's widths) the mouth's opening is looked for to widen it
DARK = 0.5  # the mouth's dark: under this share of the cheeks' grey level
# The most the template's mouth is widened on a side, and where (in its own half-widths and half-heights) the
# widening has faded out: a point's shift along the eye line, s (g - 1) w(r), keeps the points' order while
# (g - 1) FALLOFF / (FALLOFF - 1) < 1.
MAX_WIDEN = 1.45
WIDEN_FALLOFF = 2.2


def teeth_patch(image: np.ndarray, mesh: fm.FaceMesh, *, wide: bool = False) -> np.ndarray | None:
    """(H, W) bool: the teeth a picture shows in and around the mesh's mouth, or None where it shows none.
    Searched: the middle 80 % of the mouth's width, the mouth's own height above and below it. ``wide``: the
    mouth's opening (its teeth and its dark, the corners' shadows) in a box WIDEN_REACH times the mouth's width,
    its parts that take in the teeth of the narrow search."""
    h, w = image.shape[:2]
    outline = mesh.at(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER[::-1])
    c = outline.mean(axis=0)
    ex, ey = mesh.axes()
    rel = outline - c
    u, v = rel @ ex, rel @ ey
    if wide:
        box_u, box_v = np.array([u.min(), u.max(), u.max(), u.min()]), np.array([v.min(), v.min(), v.max(), v.max()])
        region = c + np.outer(WIDEN_REACH * box_u, ex) + np.outer(1.8 * box_v, ey)
    else:
        region = c + np.outer(0.8 * u, ex) + np.outer(1.8 * v, ey)
    mask = np.zeros((h, w), np.uint8)
    cv2.fillPoly(mask, [np.round(region * 16).astype(np.int32)], 1, cv2.LINE_8, 4)
    if mask.sum() < 30:
        return None
    px = image.astype(np.float32)
    luma = px @ LUMA
    chroma = px.max(axis=2) - px.min(axis=2)
    cheeks = np.clip(np.round(mesh.at(CHEEKS)).astype(int), 0, (w - 1, h - 1))
    skin = float(np.median(luma[cheeks[:, 1], cheeks[:, 0]]))
    tint = float(np.median(chroma[cheeks[:, 1], cheeks[:, 0]])) / max(skin, 1.0)
    # Teeth are about as bright as the cheeks or brighter, and far greyer (their chroma over luma 0.04-0.17 on
    # smiles, the skin's 0.29-0.61); a grey picture cannot tell them from skin and shows none.
    bright = (luma > 0.85 * skin) & (chroma < min(0.2, 0.6 * tint) * luma) & (mask > 0)
    if wide:
        teeth = teeth_patch(image, mesh)
        if teeth is None:
            return None
        opening = cv2.morphologyEx((bright | (luma < DARK * skin)).astype(np.uint8), cv2.MORPH_CLOSE,
                                   np.ones((3, 3), np.uint8)) & mask
        n, labels = cv2.connectedComponents(opening, connectivity=8)
        return np.isin(labels, np.setdiff1d(np.unique(labels[teeth & (opening > 0)]), [0]))
    if bright.sum() < MIN_SHARE * mask.sum():
        return None
    bright = cv2.morphologyEx(bright.astype(np.uint8), cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8))
    n, labels, stats, _ = cv2.connectedComponentsWithStats(bright & mask, connectivity=8)
    if n < 2:
        return None
    best = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    return labels == best


def open_to_teeth(image: np.ndarray, mesh: fm.FaceMesh) -> fm.FaceMesh:
    """The template mesh widened to the teeth the picture shows (``widen_to_teeth``), its inner lips opened around
    them (each lip moved whole, the skin beyond them left), or the mesh itself where it shows none."""
    return _opened(image, widen_to_teeth(image, mesh))


def widen_to_teeth(image: np.ndarray, mesh: fm.FaceMesh) -> fm.FaceMesh:
    """The template mesh with its mouth's corners moved out to OVER beyond the teeth the picture shows, where
    they reach past them (a smile is wider than the template's mouth: the teeth beyond its corners stayed in
    view with the lips shut), or the mesh itself. The lips move with their corners; the face around them less
    the further it is (a smooth falloff that keeps every point in its order along the eye line)."""
    teeth = teeth_patch(image, mesh, wide=True)
    if teeth is None or not teeth.any():
        return mesh
    ex, ey = mesh.axes()
    c = mesh.mouth_centre
    ys, xs = np.nonzero(teeth)
    s = np.stack([xs + 0.5 - c[0], ys + 0.5 - c[1]], axis=1) @ ex
    rel = mesh.points - c
    ps, pt = rel @ ex, rel @ ey
    over = max(1.0, OVER * mesh.mouth_width())
    left, right = float(ps[61]), float(ps[291])  # (the corners: left < 0 < right)
    grow_left = min(max((float(s.min()) - over) / left, 1.0), MAX_WIDEN)
    grow_right = min(max((float(s.max()) + over) / right, 1.0), MAX_WIDEN)
    if grow_left == 1.0 and grow_right == 1.0:
        return mesh
    lips = list(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER)
    half_height = max(float(np.abs(pt[lips]).max()), 1.0)
    side = np.where(ps < 0, left, right)
    r = np.hypot(ps / side, pt / half_height)  # about 1 on the lips' outline
    weight = np.clip((WIDEN_FALLOFF - r) / (WIDEN_FALLOFF - 1.0), 0.0, 1.0)
    outline = mesh.at(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER[::-1]).astype(np.float32)
    lips_all = [i for i in range(fm.NUM_POINTS)
                if cv2.pointPolygonTest(outline, tuple(map(float, mesh.points[i])), True) >= -0.5]
    weight[lips_all] = 1.0  # (the lips and what lies between them move whole)
    grow = np.where(ps < 0, grow_left, grow_right)
    p = mesh.points + np.outer(ps * (grow - 1.0) * weight, ex)
    return fm.FaceMesh(points=p.astype(np.float32), source=mesh.source)


def _opened(image: np.ndarray, mesh: fm.FaceMesh) -> fm.FaceMesh:
    teeth = teeth_patch(image, mesh)
    if teeth is None:
        return mesh
    ex, ey = mesh.axes()
    c = mesh.mouth_centre
    ys, xs = np.nonzero(teeth)
    rel = np.stack([xs + 0.5 - c[0], ys + 0.5 - c[1]], axis=1)
    s, t = rel @ ex, rel @ ey
    p = mesh.points.copy()
    rel_p = p - c
    ps, pt = rel_p @ ex, rel_p @ ey
    upper_in, lower_in = list(fm.LIPS_INNER_UPPER), list(fm.LIPS_INNER_LOWER)
    up_shift = np.zeros(len(upper_in), np.float32)
    low_shift = np.zeros(len(lower_in), np.float32)
    half = max(1.0, 0.03 * mesh.mouth_width())
    over = max(1.0, OVER * mesh.mouth_width())
    for k in range(1, len(upper_in) - 1):
        col = np.abs(s - ps[upper_in[k]]) <= half
        if col.sum() < 2:
            continue
        top, bottom = np.quantile(t[col], [0.05, 0.95])  # (a highlight on a lip joined to the teeth: left out)
        up_shift[k] = min(float(top) - over - pt[upper_in[k]], 0.0)
        low_shift[k] = max(float(bottom) + over - pt[lower_in[k]], 0.0)
    # (and one point's reach beyond both its neighbours' taken back to the larger of theirs)
    for shift in (up_shift, low_shift):
        inner = shift[1:-1].copy()
        for k in range(1, len(shift) - 1):
            shift[k] = np.median([inner[max(k - 2, 0)], inner[k - 1], inner[min(k, len(inner) - 1)]])
    if not (up_shift < 0).any() and not (low_shift > 0).any():
        return mesh
    # Every point of each lip (between its outer contour and the lips' line) moves with it.
    line_s, line_t = ps[upper_in], pt[upper_in]
    outer_up = pt[list(fm.LIPS_OUTER_UPPER)]
    outer_low = pt[list(fm.LIPS_OUTER_LOWER)]
    span = (ps[list(fm.LIPS_OUTER_UPPER)][0], ps[list(fm.LIPS_OUTER_UPPER)][-1])
    for i in range(fm.NUM_POINTS):
        if not span[0] < ps[i] < span[1]:
            continue
        line = float(np.interp(ps[i], line_s, line_t))
        top = float(np.interp(ps[i], ps[list(fm.LIPS_OUTER_UPPER)], outer_up))
        bottom = float(np.interp(ps[i], ps[list(fm.LIPS_OUTER_LOWER)], outer_low))
        if top - 0.5 <= pt[i] <= line + 1e-3 and i not in lower_in:
            p[i] += float(np.interp(ps[i], line_s, up_shift)) * ey
        elif line - 1e-3 <= pt[i] <= bottom + 0.5 and i not in upper_in:
            p[i] += float(np.interp(ps[i], line_s, low_shift)) * ey
    return fm.FaceMesh(points=p.astype(np.float32), source=mesh.source)
