"""Blinks on the example's eyes: lower lid contours the landmark model put on the cheek (preview/eyelids.py), and
a dark brow low over the eye, held rigid, that must still let the lid close (preview/rigid.py)."""

from __future__ import annotations

import cv2
import numpy as np

from avatar_render.face import mesh as fm
from avatar_render.preview.eyelids import fit_lower_lids
from tests.test_preview import rig_for


def _lower_offsets(mesh: fm.FaceMesh, than: fm.FaceMesh) -> np.ndarray:
    """(2, 7) how far down each eye's lower lid points (corners left out) lie from ``than``'s, pixels."""
    _, down = than.axes()
    return np.array([(mesh.at(lower[1:-1]) - than.at(lower[1:-1])) @ down for _, lower in fm.EYES])


def test_a_lower_lid_contour_on_the_cheek_is_moved_up_to_the_eye():
    rig = rig_for(512, 512).rig
    image, found = rig.image, rig.mesh
    _, down = found.axes()
    points = found.points.copy()
    for _, lower in fm.EYES:
        points[list(lower[1:-1])] += 3.0 * down  # three pixels down on the skin under the eye
    low = fm.FaceMesh(points=points, source=found.source)
    fitted = _lower_offsets(fit_lower_lids(image, low), found)
    assert np.abs(fitted[:, 1:-1]).mean() < 1.2  # back at the eye's edge (the model's own contour)
    assert (fitted <= 3.0 + 1e-4).all()  # never further down
    # Where the model's contour is on the edge already, it stays within a pixel of it.
    assert np.abs(_lower_offsets(fit_lower_lids(image, found), found)).max() <= 1.0


def _drawn_above_the_lids(tmp_path, low: float, high: float):
    """The example's rig with a dark band drawn from ``low`` to ``high`` eye widths above each upper lid."""
    rig = rig_for(512, 512).rig
    image = rig.image.copy()
    for upper, _ in fm.EYES:
        lid = rig.mesh.at(upper)
        width = float(np.ptp(lid[:, 0]))
        band = np.concatenate([lid - (0, low * width), (lid - (0, high * width))[::-1]])
        cv2.fillPoly(image, [np.round(band).astype(np.int32)], (40, 30, 25), cv2.LINE_AA)
    path = tmp_path / "drawn.png"
    cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    return rig_for(512, 512, ref=path).rig


def _closed_line(rig) -> tuple[list[float], list[float]]:
    """At a full blink, for the middle points of each upper lid: how far below the lid the pixel on the closed line
    takes its colour (px; > 0: from the eye), and each column's rigid floor (-inf: none)."""
    bank = rig.eye_bank
    rect, grid = bank.rect, bank.blend(1.0)
    floor = bank.warps.floor if bank.warps.floor is not None else np.full(rect.w, -np.inf)
    short, floors = [], []
    for upper, _ in fm.EYES:
        lid, shut = rig.mesh.at(upper), rig.eyes.moved(1.0)[list(upper)]
        for k in (3, 4, 5):
            x, y = int(shut[k, 0]), int(round(shut[k, 1] - 1))  # the pixel on the closed line
            short.append(float(y + 0.5 + grid[y - rect.y0, x - rect.x0, 1] - lid[k, 1]))
            floors.append(float(floor[x - rect.x0]))
    return short, floors


def test_a_dark_brow_low_over_the_eye_stays_put_and_the_lid_still_closes(tmp_path):
    """A brow drawn 0.45 eye widths above each upper lid (deep-set eyes): it is held rigid, and at a full blink the
    pixels on the closed line take their colour from the upper lid, not from the eye below it (before, the lid
    could reach only half the room under the brow, and the iris showed through a closed eye)."""
    browed = _drawn_above_the_lids(tmp_path, 0.45, 0.65)
    short, floors = _closed_line(browed)
    lids = [y for upper, _ in fm.EYES for y in browed.mesh.at(upper)[3:6, 1]]
    assert all(-np.inf < f < y for f, y in zip(floors, lids))  # the brow is held
    assert np.mean(short) < 0.6, short


def test_heavy_liner_on_the_lid_closes_with_it(tmp_path):
    """Dark liner and lashes from the lid's edge to 0.3 eye widths above it (Lenna's far eye) are the lid's, not a
    rim: nothing is held, and the closed line takes its colour from the lid (with them held, the lid stopped short
    and the closed eye showed the iris in vertical streaks)."""
    short, floors = _closed_line(_drawn_above_the_lids(tmp_path, 0.0, 0.3))
    assert floors == [-np.inf] * len(floors)
    assert max(short) < 0.6, short
