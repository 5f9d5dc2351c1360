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


def teeth_patch(image: np.ndarray, mesh: fm.FaceMesh) -> np.ndarray | None:
    """(H, W) bool: the teeth a picture shows in and around the mesh's mouth, or None where it shows none."""
    h, w = image.shape[:2]
    outline = mesh.at(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER[::-1])
    c = outline.mean(axis=0)
    ex, ey = mesh.axes()
    rel = outline - c
    u, v = rel @ ex, rel @ ey
    # The middle 80 % of the mouth's width, the mouth's own height above and below it.
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
    if bright.sum() < MIN_SHARE * mask.sum():
        return None
    bright = cv2.morphologyEx(bright.astype(np.uint8), cv2.MORPH_CLOSE, np.ones((3, 3), np.uint8))
    n, labels, stats, _ = cv2.connectedComponentsWithStats(bright & mask, connectivity=8)
    if n < 2:
        return None
    best = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
    return labels == best


def open_to_teeth(image: np.ndarray, mesh: fm.FaceMesh) -> fm.FaceMesh:
    """The template mesh with its inner lips opened around the teeth the picture shows (each lip moved whole,
    the skin beyond them left), or the mesh itself where it shows none."""
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
