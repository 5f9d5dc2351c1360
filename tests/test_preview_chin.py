"""The chin comes down over what lies under it (preview/chin.py): the chin's pixels move with the jaw, what lies
beyond a short band under it (the neck, a collar, a hand) stays where it is in the frames."""

from __future__ import annotations

import numpy as np

from avatar_render.face import mesh as fm
from avatar_render.preview import chin as ch
from avatar_render.preview.render import render_frame
from tests.test_preview import rig_for, row


def test_the_chin_comes_down_over_what_lies_under_it():
    rig = rig_for(512, 512).rig
    bank, mesh, down = rig.mouth_bank, rig.mesh, rig.mouth.down
    assert bank.warps.chin is not None
    chin = mesh.points[fm.CHIN]
    travel = float(rig.mouth.displacement(1.0, 0.0)[fm.CHIN] @ down)  # the widest jaw drop
    assert travel > 4
    column = bank.blend(1.0, 0.0)[:, int(chin[0]) - bank.rect.x0]  # (h, 2) down the middle of the chin
    rows = np.arange(bank.rect.y0, bank.rect.y1) + 0.5
    # The chin's lowest pixels are drawn where it has come down to, from its own pixels (a backward map)...
    at = (rows > chin[1] + 1) & (rows < chin[1] + travel + ch.EDGE_PX - 0.5)
    assert at.any() and np.all(column[at] @ down < -0.9 * travel)
    # ... and beyond a band under it nothing moves: the mesh stretched it down to its fixed ring around the face,
    # 0.4 mouth widths below the chin (a collar under it went down and up with every syllable).
    band = max(ch.BAND * travel, ch.BAND_MIN_PX)
    beyond = rows > chin[1] + travel + ch.EDGE_PX + band + 1
    assert beyond.any() and np.abs(column[beyond]).max() < 1e-3


def test_what_lies_under_the_chin_stays_put_in_the_frames():
    rig = rig_for(512, 512).rig
    mesh = rig.mesh
    chin, w = mesh.points[fm.CHIN], mesh.mouth_width()
    still = render_frame(rig, row())
    for open_, width in ((1.0, 0.0), (0.6, -1.0), (0.45, 1.0)):
        frame = render_frame(rig, row(open_, width))
        x0, x1 = int(chin[0] - 0.4 * w), int(chin[0] + 0.4 * w)
        y0, y1 = int(chin[1] + 0.45 * w), int(chin[1] + 0.8 * w)  # the neck and the collar under the chin
        assert np.array_equal(frame[y0:y1, x0:x1], still[y0:y1, x0:x1]), (open_, width)
        lowest = slice(int(chin[1]) - 3, int(chin[1]))  # the chin's own lowest rows do move
        assert not np.array_equal(frame[lowest, x0:x1], still[lowest, x0:x1])
