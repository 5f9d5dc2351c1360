"""Rigid things above the eyes (spectacle frames, the brows' dark hair) that a blink must not bend.

A blink's warp pulls the skin above the lashes down with the lid. Across a spectacle rim that bent the
rim down into the eye. Here the rig finds long, thin, dark structures above each eye (a black-hat of
the grey levels, 35 levels or more, spanning most of the eye's width, above the lashes' band, its core under
half as bright as the skin around) and
limits the blink's displacements below them so that no output pixel takes its colour from the rim or
anything above it: the rim stays where it is and the skin between it and the lid takes the stretch.
"""

from __future__ import annotations

import cv2
import numpy as np

from avatar_render.face import mesh as fm
from avatar_render.preview.warp import Rect

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
CONTRAST = 35.0  # how much darker than its surroundings a structure must be, grey levels
SPAN = 0.6  # of the eye's width it must cover
DARK = 0.45  # and darker than this share of the skin around the eyes (frames, black brows; not light hair)
BAND = (0.15, 0.9)  # where above the lid it must lie, in eye widths (below: the lashes)
LID_BAND = 0.06  # what lies closer to the lid than this (eye widths) is the lid's own edge
# How much of the room under a rigid structure a pixel may reach up into: the skin there is stretched at most
# fourfold. (At half, a brow low over a deep-set eye left the lid short of the lower lid: the iris showed.)
REACH = 0.75


def rigid_floor(image: np.ndarray, mesh: fm.FaceMesh, rect: Rect) -> np.ndarray:
    """(rect.w,) float32: per column of ``rect``, the lowest row (pixel centre, image coordinates) of a rigid
    structure above an eye; -inf where there is none."""
    floor = np.full(rect.w, -np.inf, np.float32)
    if rect.empty:
        return floor
    gray = image[rect.slices].astype(np.float32) @ LUMA
    size = max(3, int(round(0.2 * mesh.eye_distance)) | 1)
    kernel = cv2.getStructuringElement(cv2.MORPH_ELLIPSE, (size, size))
    dark = cv2.morphologyEx(gray, cv2.MORPH_BLACKHAT, kernel) >= CONTRAST
    skin = float(np.median(gray))
    xs = np.arange(rect.w, dtype=np.float32) + rect.x0 + 0.5
    rows = np.arange(rect.h, dtype=np.float32)[:, None] + rect.y0 + 0.5
    for upper in (fm.LEFT_EYE_UPPER, fm.RIGHT_EYE_UPPER):
        lid = mesh.at(upper)
        order = np.argsort(lid[:, 0])
        width = float(lid[:, 0].max() - lid[:, 0].min())
        if width < 4:
            continue
        lid_y = np.interp(xs, lid[order, 0], lid[order, 1], left=np.nan, right=np.nan)
        above = lid_y[None] - rows  # pixels above the lid, per column (NaN beside the eye: not looked at)
        # A structure qualifies by what of it lies above the lashes' band; all of it above the lid's own edge
        # is kept rigid (a rim's ends come down towards the lashes).
        near = dark & (above >= LID_BAND * width) & (above <= BAND[1] * width)
        band = above >= BAND[0] * width
        count, labels = cv2.connectedComponents(near.astype(np.uint8), connectivity=8)
        rigid = np.zeros(near.shape, np.uint8)
        for k in range(1, count):
            ys, cols = np.nonzero(labels == k)
            inside = band[ys, cols]
            if not inside.any() or np.ptp(cols[inside]) + 1 < SPAN * width:
                continue
            keep = _dark_part(gray[ys, cols], cols, above[ys, cols], dark_below=DARK * skin,
                              above_lid=BAND[0] * width, inside=inside)
            if keep is None:
                continue
            ys, cols = ys[keep], cols[keep]
            if _on_the_lid(ys, cols, dark, above, xs, lid, width):
                continue
            rigid[ys, cols] = 1
        # (grown by two pixels: its soft edges and its ends, where it fades under the threshold, are of it too)
        rigid = cv2.dilate(rigid, np.ones((5, 5), np.uint8)) & (above >= LID_BAND * width)
        ys, cols = np.nonzero(rigid)
        np.maximum.at(floor, cols, ys.astype(np.float32) + rect.y0 + 0.5)
    return _smooth(floor)


def _dark_part(values: np.ndarray, cols: np.ndarray, heights: np.ndarray, *, dark_below: float, above_lid: float,
               inside: np.ndarray) -> np.ndarray | None:
    """Which pixels of a structure (the grey levels, columns and heights above the lid of its pixels) are a rim or a
    black brow, or None for a light brow (hair over skin that moves): all of them where its pixels in the band above
    the lashes are under ``dark_below`` on average; else, where its core (each column's darkest pixel) is that dark
    at the median and lies in that band (over ``above_lid``), not at the lashes, its pixels that dark in that band.
    (The mean
    alone took in the shadow and the crease between a thick rim and the lid, which the black-hat finds too: a black
    rim low over the eye read as a grey brow, and bent down into the eye with the blink.)"""
    if values[inside].mean() <= dark_below:
        return np.ones(len(values), bool)
    order = np.lexsort((values, cols))
    first = np.r_[True, cols[order][1:] != cols[order][:-1]]  # (each column's darkest pixel)
    core, at = values[order][first], heights[order][first]
    if float(np.median(core)) > dark_below or float(np.median(at)) < above_lid:
        return None
    return (values <= dark_below) & (heights >= above_lid)


def _on_the_lid(ys: np.ndarray, cols: np.ndarray, dark: np.ndarray, above: np.ndarray, xs: np.ndarray,
                lid: np.ndarray, width: float) -> bool:
    """Whether a dark structure (its pixels' rows and columns in ``dark``, the black-hat mask) is the lid's own lashes
    and liner: across the middle half of the eye, in most columns, all of it lies in one dark run that starts at the
    lid (a heavily lined or foreshortened eye's lashes reach up past the lid's own edge: Lenna's far eye, whose
    blink they held open). A rim or a brow, however close, leaves skin between the lashes and itself."""
    middle = np.abs(xs - float(lid[:, 0].mean())) < 0.25 * width
    votes = []
    for c in np.unique(cols[middle[cols]]):
        ahead = np.nonzero(above[:, c] >= 0)[0]  # rows above the lid, the lowest last
        if len(ahead) == 0:
            continue
        row = ahead[-1] + 1  # from a pixel under the lid's line ...
        reach = row - int(np.ceil(LID_BAND * width)) - 1  # ... the lashes' dark must start by here
        while row >= max(reach, 0) and not dark[row, c]:
            row -= 1
        if row < max(reach, 0):
            votes.append(False)
            continue
        while row > 0 and dark[row - 1, c]:
            row -= 1  # (the run's top)
        votes.append(bool(ys[cols == c].min() >= row))
    return bool(votes) and float(np.mean(votes)) > 0.5


def _smooth(floor: np.ndarray, half: int = 2) -> np.ndarray:
    """Each column's floor lowered to the lowest within ``half`` columns, then averaged over as many: no column
    higher than it was, and the skin stretched below it changes smoothly across, not in vertical stripes."""
    windows = np.lib.stride_tricks.sliding_window_view
    padded = np.pad(floor, half, constant_values=-np.inf)
    lowest = windows(padded, 2 * half + 1).max(axis=1)
    return windows(np.pad(lowest, half, mode="edge"), 2 * half + 1).mean(axis=1).astype(np.float32)


def confine(grids: np.ndarray, rect: Rect, floor: np.ndarray) -> np.ndarray:
    """Backward-map displacements (..., rect.h, rect.w, 2) limited so that no pixel below a column's floor
    samples at or above it (and pixels at or above it do not move)."""
    if not np.isfinite(floor).any():
        return grids
    rows = np.arange(rect.h, dtype=np.float32)[:, None] + rect.y0 + 0.5
    room = rows - floor[None] - 1.0  # how far up a pixel may reach without touching the structure
    up = np.maximum(-grids[..., 1], 1e-6)
    k = np.where(np.isfinite(room), np.clip(REACH * room / up, 0, 1), 1.0).astype(np.float32)
    return grids * k[..., None]
