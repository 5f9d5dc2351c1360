"""The generated mouth interior of a reference that shows no teeth (preview/interior.py), on a real closed
mouth: the example rendered with its lips pressed shut, taken as the reference."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from avatar_render.face import mesh as fm
from avatar_render.face.landmarks import find_model
from avatar_render.preview.render import render_frame
from avatar_render.preview.rig import OPEN_LEVELS, contour_t, face_coords
from avatar_render.preview.shapes import PART, PART_KNEE, ROUND_REST_HOLE, MouthShape
from tests.test_preview import rig_for, row

LUMA = np.array([0.299, 0.587, 0.114], np.float32)


@pytest.fixture(scope="module")
def closed(tmp_path_factory):
    shut = render_frame(rig_for(512, 512).rig, row(-1.0))
    path = tmp_path_factory.mktemp("closed") / "closed.png"
    cv2.imwrite(str(path), cv2.cvtColor(shut, cv2.COLOR_RGB2BGR))
    return rig_for(512, 512, ref=path).rig


def _opening(rig, p) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(luma, rgb, depth) of the pixels inside the frame's moved inner lips (the head still); depth: 0 at the
    upper lip, 1 at the lower."""
    frame = render_frame(rig, p)
    moved = rig.mouth.moved(float(p[0]), float(p[1]))
    poly = np.concatenate([moved[list(fm.LIPS_INNER_UPPER)], moved[list(fm.LIPS_INNER_LOWER)][::-1]])
    mask = np.zeros(frame.shape[:2], np.uint8)
    cv2.fillPoly(mask, [np.round(poly * 16).astype(np.int32)], 1, cv2.LINE_8, 4)
    mask = cv2.erode(mask, np.ones((3, 3), np.uint8)) > 0
    ys, xs = np.nonzero(mask)
    s, t = face_coords(xs + 0.5, ys + 0.5, rig.mesh)
    top = contour_t(s, moved[list(fm.LIPS_INNER_UPPER)], rig.mesh)
    depth = (t - top) / np.maximum(contour_t(s, moved[list(fm.LIPS_INNER_LOWER)], rig.mesh) - top, 1e-3)
    rgb = frame[mask].astype(np.float32)
    return rgb @ LUMA, rgb, depth


def test_a_closed_mouth_opens_onto_teeth_and_a_shaded_interior(closed):
    assert closed.teeth is not None and not closed.teeth.visible and closed.synth is not None
    lips = float(closed.synth.cavity @ LUMA) / 0.38  # the lips' own grey level
    luma, rgb, depth = _opening(closed, row(0.8))
    # (this face's lips are pale: its teeth are brighter than them, and far less saturated)
    teeth = (luma > lips + 10) & (rgb.max(axis=1) - rgb.min(axis=1) < 0.22 * luma)
    assert teeth[depth < 0.35].mean() > 0.3  # the upper teeth under the upper lip
    assert teeth[depth < 0.35].mean() > 2 * teeth[(depth > 0.4) & (depth < 0.75)].mean()
    assert luma.std() > 30  # teeth, dark and tongue; a flat fill reads a few levels
    assert luma.min() > 8  # dark, not black


def test_ee_shows_teeth_and_oo_shows_little(closed):
    def bright(p) -> float:
        luma, _, _ = _opening(closed, p)
        return float((luma > np.percentile(closed.image @ LUMA, 50)).sum())

    assert bright(row(0.4, 1.0)) > 3 * max(bright(row(0.4, -1.0)), 1.0)
    # Lips half rounded (an "aw", an "oy") leave the teeth in view; rounded further (an "oh") they close over them.
    half, neutral, oh = bright(row(0.6, -0.5)), bright(row(0.6)), bright(row(0.6, -0.8))
    assert half > 0.85 * neutral and oh < 0.5 * half


def test_generated_teeth_are_the_same_in_every_frame(closed, tmp_path_factory):
    _, a, _ = _opening(closed, row(0.6))
    _, b, _ = _opening(closed, row(0.6, blink=1.0))  # another frame, the same mouth
    assert np.array_equal(a, b)
    ref = tmp_path_factory.getbasetemp() / "closed0" / "closed.png"
    _, again, _ = _opening(rig_for(512, 512, ref=ref).rig, row(0.6))  # the rig built again
    assert np.array_equal(again, a)


def test_spectacle_frames_stay_put_through_a_blink(tmp_path):
    """Dark frames drawn over the example's eyes: a full blink closes the lids and leaves the rims as they are."""
    rig = rig_for(512, 512).rig
    image, d = rig.image.copy(), rig.mesh.eye_distance
    rims = np.zeros(image.shape[:2], np.uint8)
    for eye in (fm.LEFT_EYE_UPPER + fm.LEFT_EYE_LOWER, fm.RIGHT_EYE_UPPER + fm.RIGHT_EYE_LOWER):
        c = rig.mesh.at(eye).mean(axis=0)
        ellipse = ((round(c[0]), round(c[1] + 0.05 * d)), (round(0.42 * d), round(0.27 * d)), 0, 0, 360)
        cv2.ellipse(image, *ellipse, (25, 22, 20), 2, cv2.LINE_AA)
        cv2.ellipse(rims, *ellipse[:3], 235, 305, 1, 2)  # the top rim, above the lid (its ends come down to the lashes)
    path = tmp_path / "glasses.png"
    cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    glasses = rig_for(512, 512, ref=path).rig
    open_, shut = render_frame(glasses, row()), render_frame(glasses, row(blink=1.0))
    rim = rims > 0
    diff = np.abs(open_.astype(np.int16) - shut).max(axis=2)
    assert (diff[~rim] > 30).sum() > 50  # the lids closed
    reach = np.zeros_like(rim)
    reach[glasses.eye_bank.rect.slices] = True  # where the blink's warp acts
    near = rim & reach
    assert near.sum() > 30
    assert np.percentile(diff[near], 95) <= 12  # and the frames did not come down with them


@pytest.mark.skipif(find_model() is None, reason="face landmark model not installed (scripts/fetch_face_model.py)")
def test_a_thick_rim_low_over_the_eyes_stays_put_through_a_blink(tmp_path):
    """Grace Hopper's thick black spectacle rims, low over her eyes (matplotlib's sample photo): the black-hat took
    each rim and the creased, shadowed skin under it for one structure, whose mean read as a grey brow, and the
    blink dragged the rims down into the eyes."""
    from matplotlib import cbook

    ref = tmp_path / "hopper.jpg"
    with cbook.get_sample_data("grace_hopper.jpg") as photo:
        ref.write_bytes(photo.read())
    rig = rig_for(512, 512, ref=ref).rig
    open_, shut = render_frame(rig, row()), render_frame(rig, row(blink=1.0))
    diff = np.abs(open_.astype(np.int16) - shut).max(axis=2)
    gray = rig.image.astype(np.float32) @ LUMA
    rims = np.zeros(gray.shape, bool)
    for upper in (fm.LEFT_EYE_UPPER, fm.RIGHT_EYE_UPPER):  # (the rim: the black above the lid, over its middle)
        lid = rig.mesh.at(upper)
        width = float(np.ptp(lid[:, 0]))
        x0, x1 = int(lid[:, 0].min() + 0.2 * width), int(lid[:, 0].max() - 0.2 * width)
        y0, y1 = int(lid[:, 1].min() - 0.7 * width), int(lid[:, 1].min() - 0.2 * width)
        rims[y0:y1, x0:x1] = gray[y0:y1, x0:x1] < 50
        assert (diff[int(lid[:, 1].max()) : int(lid[:, 1].max() + 0.15 * width), x0:x1] > 30).any()  # it closed
    assert rims.sum() > 100
    assert np.percentile(diff[rims], 95) <= 20  # the rims stayed


def test_the_interior_is_as_soft_and_grainy_as_the_photo(closed):
    from avatar_render.preview.interior import photo_softness

    sharp, grain = photo_softness(closed.image, closed.mesh)
    soft, smooth = photo_softness(cv2.GaussianBlur(closed.image, (0, 0), 2.0), closed.mesh)
    assert sharp < 1.0 and 1.4 < soft < 2.6  # a 2-pixel blur is read back
    assert smooth < 0.5 * grain
    assert closed.synth.blur < 0.5 and abs(float(closed.synth.noise.std()) - grain * 1.06) < 0.3 * grain


def _middle_column(rig, p) -> np.ndarray:
    """Grey levels down the middle of the mouth, from the moved outer upper to the outer lower lip contour."""
    frame = render_frame(rig, p).astype(np.float32) @ LUMA
    moved = rig.mouth.moved(float(p[0]), float(p[1]))
    top, bottom = moved[0], moved[17]  # the outer lips' middle points
    n = int(np.ceil(np.linalg.norm(bottom - top) * 2)) + 1
    xs = np.linspace(top[0], bottom[0], n, dtype=np.float32) - 0.5
    ys = np.linspace(top[1], bottom[1], n, dtype=np.float32) - 0.5
    return cv2.remap(frame, xs[None], ys[None], cv2.INTER_LINEAR)[0]


def test_a_closed_mouth_parts_visibly_as_soon_as_it_speaks(closed):
    """A quiet sound (open 0.15) shows a gap between closed lips that differs from them as much as a mouth
    that showed its teeth at rest does: 0.05 mouth widths or more of it 40 grey levels off the lips."""
    lips = float(closed.synth.cavity @ LUMA) / 0.38
    for p in (row(0.15), row(0.15, 0.5)):
        off = np.abs(_middle_column(closed, p) - lips) >= 40
        assert off.sum() * 0.5 >= 0.05 * closed.mouth.width_px  # (samples every half pixel)
    rest = np.abs(_middle_column(closed, row(0.0)) - lips) >= 40
    assert rest.sum() * 0.5 < 0.01 * closed.mouth.width_px  # and none at rest
    # (the parting's knee is one of the warp bank's levels, so the bank's blend of it is exact)
    assert PART_KNEE in OPEN_LEVELS
    # A reference that shows its teeth opens as it did.
    example = rig_for(512, 512).rig.mouth
    assert np.allclose(example.moved(0.15, 0.0), example.base + 0.15 * example.jaw)


def test_rounded_lips_close_over_the_teeth_and_open_on_the_dark(closed):
    """Rounding lips close over the teeth, which stay white where they show (shaded teeth read as lips, and as
    dark stripes); half rounded (an "aw") they leave them in view; an oo is a dark opening, hardly a tooth in
    it, smaller than the same opening unrounded (most of the closed mouth's parting is taken back)."""
    lips = float(closed.synth.cavity @ LUMA) / 0.38
    bright = np.percentile(closed.image @ LUMA, 50)
    shown, white = [], []
    for rounded in (0.0, 0.4, 0.7, 0.85, 1.0):
        luma, _, _ = _opening(closed, row(0.5, -rounded))
        shown.append(float((luma > bright).sum()))
        white.append(float(np.median(luma[luma > bright])) if shown[-1] else 0.0)
    assert shown[1] > 0.8 * shown[0] and shown[2] > 0.5 * shown[0]
    assert shown[1] >= shown[2] > shown[3] > shown[4] and shown[4] <= 0.05 * shown[0]
    assert white[1] > white[0] - 3
    luma, _, _ = _opening(closed, row(0.5, -1.0))
    assert np.median(luma) < lips - 40

    def gap(width: float) -> float:
        moved = closed.mouth.moved(0.3, width)
        return float((moved[14] - moved[13]) @ closed.mouth.down)  # inner lips' middle points

    assert gap(-1.0) < gap(0.0) - 0.3 * PART * closed.mouth.width_px


def test_rounded_lips_meet_towards_the_corners_around_a_round_hole(closed):
    """An "oo" is a round hole: rounded lips meet towards the corners (the gap between the inner lips shut there,
    the jaw's drop held off the lower lip), open in the middle, where an unrounded mouth is open across."""
    mouth, mesh = closed.mouth, closed.mesh
    ex, _ = mesh.axes()
    centre = mesh.points[[61, 291]].mean(axis=0)
    pairs = list(zip(fm.LIPS_INNER_UPPER[1:-1], fm.LIPS_INNER_LOWER[1:-1]))
    # how far out each pair lies, in mouth widths (the corners at 0.5)
    across = np.array([abs(float((mesh.points[iu] - centre) @ ex)) for iu, _ in pairs]) / mouth.width_px

    def gaps(open_: float, width: float) -> np.ndarray:
        moved = mouth.moved(open_, width)
        return np.array([float((moved[il] - moved[iu]) @ mouth.down) for iu, il in pairs])

    outer, middle = across > 0.35, across < 0.15
    assert outer.any() and middle.any()
    for open_ in (0.3, 0.8):
        rounded, plain = gaps(open_, -1.0), gaps(open_, 0.0)
        assert rounded[outer].max() < 0.3 * plain[outer].min()
        assert rounded[middle].min() > 0.75 * plain[middle].max()


def test_rounded_lips_close_a_dark_rest_opening_to_a_small_hole(closed):
    """A photo whose lips are apart with no teeth in view (their generated teeth the rounded lips cover): its "oo"
    is a small hole, not the photo's whole opening in the dark; a photo showing its own teeth keeps them in view."""
    mesh, width = closed.mesh, closed.mouth.width_px
    ex, ey = mesh.axes()
    centre = mesh.points[[61, 291]].mean(axis=0)
    points = mesh.points.copy()
    for idx in (fm.LIPS_INNER_LOWER[1:-1], fm.LIPS_OUTER_LOWER[1:-1]):  # the lower lip dropped 0.2 mouth widths
        u = ((points[list(idx)] - centre) @ ex) / width
        points[list(idx)] += (0.2 * width * np.clip(1 - (2 * u) ** 2, 0, 1))[:, None] * ey
    apart = fm.FaceMesh(points=points, source=mesh.source)

    def middle_gap(shape: MouthShape, open_: float, rounded: float) -> float:
        moved = shape.moved(open_, -rounded)
        return float((moved[14] - moved[13]) @ shape.down) / width  # inner lips' middle points

    dark, own = MouthShape.build(apart, points, closed=True), MouthShape.build(apart, points, closed=False)
    rest = middle_gap(own, 0.0, 0.0)
    assert rest > 0.18
    assert middle_gap(dark, 0.0, 1.0) < ROUND_REST_HOLE + 0.03 < 0.5 * rest
    assert middle_gap(dark, 0.0, 0.5) < 0.75 * rest
    assert middle_gap(dark, 0.6, 1.0) > middle_gap(dark, 0.0, 1.0) + 0.05  # the jaw still opens it
    assert middle_gap(own, 0.0, 1.0) > 0.95 * rest


@pytest.mark.parametrize("teeth_shown", [True, False])
def test_a_black_and_white_photo_keeps_a_grey_mouth(closed, tmp_path, teeth_shown):
    """The mouth's lining is red in a colour photo; in a black-and-white one it is grey, like the rest of it
    (it was drawn red in the example's own teeth's gaps)."""
    image = rig_for(512, 512).rig.image if teeth_shown else closed.image
    grey = np.repeat(np.round(image.astype(np.float32) @ LUMA).astype(np.uint8)[..., None], 3, axis=2)
    path = tmp_path / "grey.png"
    cv2.imwrite(str(path), grey)
    rig = rig_for(512, 512, ref=path).rig
    assert rig.teeth.visible == teeth_shown
    for p in (row(0.3), row(0.8), row(0.6, 0.5), row(0.6, -0.8)):
        _, rgb, _ = _opening(rig, p)
        assert len(rgb) > 100 and (rgb.max(axis=1) - rgb.min(axis=1)).max() <= 3  # (rounding: 1-2 levels)
    _, rgb, _ = _opening(rig_for(512, 512).rig if teeth_shown else closed, row(0.8))  # (the colour photo's)
    assert np.median(rgb[:, 0] - rgb[:, 2]) > 10


@pytest.mark.parametrize("teeth_shown", [True, False])
def test_a_sepia_photo_keeps_its_tint_in_the_mouth(closed, tmp_path, teeth_shown):
    """A toned photo (every colour one tint, from dark to light) has coloured skin and lips, but its mouth is in its
    tint, not the lining's red (it was a maroon in the sepia example's open mouth: R - G 29 against G - B 11.5)."""
    image = rig_for(512, 512).rig.image if teeth_shown else closed.image
    g = image.astype(np.float32) @ LUMA
    sepia = np.clip(np.stack([1.07 * g + 10, 0.95 * g + 5, 0.78 * g], axis=-1), 0, 255).astype(np.uint8)
    path = tmp_path / "sepia.png"
    cv2.imwrite(str(path), cv2.cvtColor(sepia, cv2.COLOR_RGB2BGR))
    rig = rig_for(512, 512, ref=path).rig
    assert rig.teeth.visible == teeth_shown
    for p in (row(0.3), row(0.8), row(0.6, 0.5)):
        _, rgb, _ = _opening(rig, p)
        r, gr, b = rgb.T
        # the tint's own: R - G = 0.12 g + 5 and G - B = 0.17 g + 5 (g the grey level); grain and rounding aside
        assert len(rgb) > 100 and np.median((r - gr) - (gr - b)) < 3 and np.percentile(r - gr, 95) < 45


def _upper_row(interior) -> tuple[np.ndarray, np.ndarray]:
    """(s of each column, RGB) of the generated upper teeth a few pixels below the lip line."""
    s = interior.s0 + np.arange(interior.upper.shape[1], dtype=np.float32)
    return s, interior.upper[int(interior.pad) + 3, :, :3]


def test_generated_teeth_in_shade_take_the_mouths_warmth(closed):
    """Teeth darken towards the corners, where the arch turns away; that shade takes the lips' hue at the same grey
    level (a neutral grey beside a warm face reads green). Under the same light they are ivory."""
    interior = closed.synth
    s, rgb = _upper_row(interior)
    width = interior.width
    lips = interior.cavity / 0.38
    middle, side = rgb[np.abs(s) < 0.05 * width], rgb[np.abs(np.abs(s) - 0.42 * width) < 0.03 * width]
    lit, shaded = float(np.median(middle @ LUMA)), float(np.median(side @ LUMA))
    assert shaded < 0.85 * lit

    def ratio(c: np.ndarray) -> float:  # red over green
        return float(np.median(c[:, 0] / c[:, 1]))

    assert ratio(side) > ratio(middle) + 0.01  # warmer, towards the lips' own (the same hue before)
    assert ratio(middle) < float(lips[0] / lips[1])


def test_generated_teeth_turn_with_a_turned_face(closed):
    """On a face turned aside, the lips' midline lies off the corners' middle: the incisors meet there, and the teeth
    on the far side show narrower than on the near one."""
    from avatar_render.preview.interior import MIDLINE, build_interior

    mesh, width = closed.mesh, closed.mouth.width_px
    ex, _ = mesh.axes()
    skin = np.array([200.0, 150.0, 130.0], np.float32)

    def gaps(shift: float) -> tuple[np.ndarray, float]:
        """The dark lines between the teeth (s, pixels from the midline) and the midline, the lips' midline moved
        ``shift`` mouth widths along the mouth."""
        points = mesh.points.copy()
        points[list(MIDLINE)] += shift * width * ex
        built = fm.FaceMesh(points=points, source=mesh.source)
        interior = build_interior(closed.image, built, closed.synth.noise_rect, skin=skin)
        s, rgb = _upper_row(interior)
        luma = rgb @ LUMA
        dips = (luma[1:-1] < luma[:-2]) & (luma[1:-1] <= luma[2:])
        return s[1:-1][dips] - interior.midline, interior.midline

    lines, midline = gaps(0.0)
    assert abs(midline - float(np.mean((mesh.at(MIDLINE) - mesh.points[[61, 291]].mean(0)) @ ex))) < 0.5
    assert np.abs(lines).min() <= 1.0  # the incisors meet on the midline
    for shift in (-0.15, 0.15):
        lines, midline = gaps(shift)
        assert abs(midline) > 0.1 * width and np.abs(lines).min() <= 1.0
        # the first lines beside the midline: the central incisors, the far one (on the midline's side) narrower
        far = np.abs(lines[(lines * shift > 1.5)]).min()
        near = np.abs(lines[(lines * shift < -1.5)]).min()
        assert far < near - 0.5
