"""The background behind a moving head stays still (preview/backdrop.py): the reference with a striped backdrop
drawn behind the example's head, where the head's soft warp used to bend the stripes along with every nod."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from avatar_render.face import mesh as fm
from avatar_render.face.segment import PersonSegmenter, find_model
from avatar_render.preview.backdrop import BAND
from avatar_render.preview.render import render_frame
from avatar_render.preview.rig import build_rig
from tests.test_preview import rig_for, row

needs_segmenter = pytest.mark.skipif(find_model() is None, reason="person segmentation model not installed "
                                     "(avatar-render setup)")


@pytest.fixture(scope="module")
def striped():
    """(reference, mesh, person mask over the whole picture): the example's head (its face outline grown by a
    third) over black and white stripes 6 px wide."""
    rig = rig_for(512, 512).rig
    image, mesh = rig.image.copy(), rig.mesh
    oval = mesh.at(fm.FACE_OVAL)
    centre = oval.mean(axis=0)
    mask = np.zeros(image.shape[:2], np.uint8)
    cv2.fillPoly(mask, [np.round((centre + 1.3 * (oval - centre)) * 16).astype(np.int32)], 1, cv2.LINE_AA, 4)
    person = cv2.GaussianBlur(mask.astype(np.float32), (0, 0), 1.0)
    stripes = np.where((np.arange(image.shape[1]) // 6) % 2 == 0, 20, 235).astype(np.uint8)
    image[person < 0.5] = np.repeat(np.broadcast_to(stripes, image.shape[:2])[person < 0.5][:, None], 3, axis=1)
    return image, mesh, person


def _segment(person: np.ndarray):
    return lambda image, region: person[region[1] : region[3], region[0] : region[2]].copy()


def test_the_background_stays_still_as_the_head_moves(striped):
    image, mesh, person = striped
    still, bent = build_rig(image, mesh, person=_segment(person)), build_rig(image, mesh)
    p = row(0.0, dx=0.04, dy=0.02, roll=2.0)  # a nod: 0.04 face widths across, 2 degrees of roll
    moved, before = render_frame(still, p), render_frame(bent, p)
    rect = still.head.rect
    inside = np.zeros(person.shape, bool)
    inside[rect.slices] = True
    # The background beyond the band around the head's outline: the stripes where they were.
    band = int(BAND * still.head.face_width) + 2  # (at the usual head motion)
    clear = cv2.erode((person < 0.5).astype(np.uint8), np.ones((3, 3), np.uint8), iterations=band) > 0
    background = inside & clear
    assert background.sum() > 2000
    diff = np.abs(moved.astype(np.int16) - image.astype(np.int16)).max(axis=2)
    assert diff[background].max() == 0
    assert (np.abs(before.astype(np.int16) - image.astype(np.int16)).max(axis=2)[background] > 100).sum() > 100
    # The head moved as before: the face's own pixels are the soft warp's.
    face = cv2.erode((person > 0.99).astype(np.uint8), np.ones((3, 3), np.uint8), iterations=band) > 0
    assert np.array_equal(moved[face & inside], before[face & inside])
    assert diff[face & inside].mean() > 5


def test_the_band_around_the_head_stretches_without_folding(striped):
    """Where the head moved off, the stripes beside it stretch; no pixel of the head shows twice, and the stripes'
    order is kept (a fold would repeat a stripe backwards)."""
    image, mesh, person = striped
    rig = build_rig(image, mesh, person=_segment(person))
    frame = render_frame(rig, row(0.0, dx=0.06))  # to the image's right
    shift = int(0.06 * rig.head.face_width)
    assert shift >= 4
    was = person > 0.99
    now = np.zeros_like(was)
    now[:, shift:] = was[:, :-shift]
    uncovered = was & ~cv2.dilate(now.astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
    inside = np.zeros_like(was)
    inside[rig.head.rect.slices] = True
    uncovered &= inside
    rows = np.nonzero(uncovered.any(axis=1))[0]
    uncovered[rows[-len(rows) // 3 :]] = False  # (the neck, where the head's weight fades: it moves less)
    assert uncovered.sum() > 50
    px = frame[uncovered].astype(np.float32)
    skin = image[was & inside].astype(np.float32)

    def chroma(c: np.ndarray) -> float:  # (the stripes are grey)
        return float(np.median(c.max(axis=1) - c.min(axis=1)))

    assert chroma(skin) > 30 and chroma(px) < 10
    # Along a row through the band, the map's source x only grows: the band is stretched, not folded.
    r = rig.head.rect
    y = int(rows[len(rows) // 3])
    xs = np.arange(r.x0, r.x1, dtype=np.float32)
    weight = cv2.resize(rig.head.weight, (r.w, r.h))[y - r.y0]
    source = xs - weight * rig.head.face_width * 0.06
    assert np.all(np.diff(source) > 0)


def _folding_rows(rig, travel: float) -> int:
    """How many rows of the head's rectangle fold (the map's source x stops growing) when the head moves ``travel``
    face widths across."""
    r = rig.head.rect
    weight = cv2.resize(rig.head.weight, (r.w, r.h))
    source = np.arange(r.w, dtype=np.float32) - weight * travel * rig.head.face_width
    return int((np.diff(source, axis=1) <= 0).any(axis=1).sum())


def test_a_livelier_head_takes_a_wider_band(striped):
    """The band around the person is stretched, never folded: at the usual motion (0.06 face widths across is more
    than it ever moves) no row folds; preview.head_motion 3 widens the band three times, and moving three times as
    far folds no row the head's own ellipse does not (its fading band is as narrow as ever)."""
    image, mesh, person = striped
    usual = build_rig(image, mesh, person=_segment(person))
    lively = build_rig(image, mesh, person=_segment(person), motion=3.0)
    assert (lively.head.weight > 0.01).sum() > (usual.head.weight > 0.01).sum()
    assert _folding_rows(usual, 0.06) == 0
    assert _folding_rows(lively, 0.18) <= _folding_rows(build_rig(image, mesh), 0.18)


def test_a_head_with_nothing_behind_it_keeps_its_ellipse(striped):
    image, mesh, _ = striped
    everyone = build_rig(image, mesh, person=lambda image, region: np.ones((region[3] - region[1],
                                                                            region[2] - region[0]), np.float32))
    assert np.array_equal(everyone.head.weight, build_rig(image, mesh).head.weight)


def test_a_segmentation_that_misses_the_face_is_not_used(striped):
    """A drawing or a statue the segmentation does not see as a person: the head keeps its ellipse (kept off what the
    segmentation calls background, its face would stand still while its outline moved)."""
    image, mesh, person = striped
    nobody = build_rig(image, mesh, person=lambda image, region: np.zeros((region[3] - region[1],
                                                                         region[2] - region[0]), np.float32))
    assert np.array_equal(nobody.head.weight, build_rig(image, mesh).head.weight)
    half = person.copy()
    half[:, : int(mesh.points[:, 0].mean())] = 0  # (the face's left half missed)
    assert np.array_equal(build_rig(image, mesh, person=_segment(half)).head.weight, nobody.head.weight)


@needs_segmenter
def test_the_segmentation_finds_the_person_and_the_render_uses_it():
    """On the example (an astronaut before a flag and a rocket): her face is the person's, the corners of the head's
    rectangle (the flag, the sky) are not, and the render's rig keeps them still."""
    rig = rig_for(512, 512).rig
    r = rig.head.rect
    person = PersonSegmenter(find_model()).person(rig.image, (r.x0, r.y0, r.x1, r.y1))
    assert person.shape == (r.h, r.w)
    face = (rig.mesh.points - [r.x0, r.y0]).astype(int)
    assert np.median(person[face[:, 1], face[:, 0]]) > 0.9
    assert person[:20, :20].mean() < 0.1 and person[:20, -20:].mean() < 0.1
    assert (build_rig(rig.image, rig.mesh).head.weight - rig.head.weight).max() > 0.9  # (moved whole before)
