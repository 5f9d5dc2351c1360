"""The preview's start-up: warp maps made when a frame first needs them (the values of the banks made whole),
and the face search and PocketSphinx's decoder started early (``preview/early.py``) taken by the set-up
only when they are what it would have made."""

from __future__ import annotations

import subprocess
import sys

import cv2
import numpy as np
import pytest
from typer.testing import CliRunner

from avatar_render.config import load_config
from avatar_render.face import mesh as fm
from avatar_render.face.detect import FaceDetector, choose_face
from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.io.reference import load_reference
from avatar_render.preview import ahead, early
from avatar_render.preview.phones import PhoneRecognizer
from avatar_render.preview.rig import OPEN_LEVELS, WIDTH_LEVELS
from avatar_render.preview.rigid import confine
from avatar_render.preview.warp import backward_map
from tests.test_preview import FACE, needs_sphinx, rig_for


@pytest.fixture(autouse=True)
def _nothing_left_ahead():
    yield
    for name in (ahead.FACE, ahead.PHONE_DECODER):
        ahead.take(name)


def _whole(bank) -> np.ndarray:
    """Every map of a bank made at once, as the set-up made them before (the chin's slide too): (*grid, h, w, 2)
    float32."""
    w = bank.warps
    grids = np.zeros(tuple(len(a) for a in bank.axes) + (w.rect.h, w.rect.w, 2), np.float32)
    for node, moved in w.shapes.items():
        if np.abs(moved - w.vertices).max() > 1e-6:
            grids[node] = backward_map(w.vertices, moved, w.triangles, w.rect)
            if w.chin is not None:
                grids[node] = w.chin.apply(grids[node], w.vertices, moved)
    return grids if w.floor is None else confine(grids, w.rect, w.floor)


def test_a_warp_map_is_made_when_a_blend_first_needs_it():
    rig = rig_for(512, 512).rig
    bank = rig.mouth_bank
    assert bank._made == {}  # the set-up made none
    out = bank.blend(0.3, 0.0)  # exactly on a node: one map
    assert set(bank._made) == {(OPEN_LEVELS.index(0.3), WIDTH_LEVELS.index(0.0))}
    assert np.array_equal(out, _whole(bank)[OPEN_LEVELS.index(0.3), WIDTH_LEVELS.index(0.0)])
    bank.blend(0.35, 0.5)  # between nodes: the four around it (one of them made already)
    assert set(bank._made) == {(4, 1), (4, 2), (5, 1), (5, 2)}


def test_the_maps_are_those_of_the_banks_made_whole(tmp_path):
    """Every node of both banks, the eyes' limited by spectacle frames (``rigid.confine``) too."""
    plain = rig_for(512, 512).rig
    image, d = plain.image.copy(), plain.mesh.eye_distance
    for eye in (fm.LEFT_EYE_UPPER + fm.LEFT_EYE_LOWER, fm.RIGHT_EYE_UPPER + fm.RIGHT_EYE_LOWER):  # spectacle rims
        c = plain.mesh.at(eye).mean(axis=0)
        ellipse = ((round(c[0]), round(c[1] + 0.05 * d)), (round(0.42 * d), round(0.27 * d)), 0, 0, 360)
        cv2.ellipse(image, *ellipse, (25, 22, 20), 2, cv2.LINE_AA)
    path = tmp_path / "glasses.png"
    cv2.imwrite(str(path), cv2.cvtColor(image, cv2.COLOR_RGB2BGR))
    glasses = rig_for(512, 512, ref=path).rig
    assert glasses.eye_bank.warps.floor is not None and np.isfinite(glasses.eye_bank.warps.floor).any()
    for bank in (plain.mouth_bank, plain.eye_bank, glasses.mouth_bank, glasses.eye_bank):
        whole = _whole(bank)
        for node in bank.warps.shapes:
            assert np.array_equal(bank.grid(node), whole[node]), node


def test_the_early_face_is_taken_for_the_same_pixels_and_index_only():
    cfg = load_config(None, ())
    image = load_reference(FACE)
    path = find_model(cfg.face.landmarks)
    model = None if path is None else LandmarkModel(path)
    expected = choose_face(image, FaceDetector(), None, is_face=None if model is None else model.finds_face(image))
    early.start(cfg, FACE)
    assert early.take_face(image, None, model) == expected
    assert early.take_face(image, None, model) is None  # (taken once)
    early.start(cfg, FACE)
    other = image.copy()
    other[0, 0] ^= 1
    assert early.take_face(other, None, model) is None  # another image: the set-up looks itself
    early.start(cfg, FACE)
    assert early.take_face(image, 1, model) is None  # another face.index
    early.start(load_config(None, ("face.landmarks=template",)), FACE)
    assert early.take_face(image, None, LandmarkModel(FACE)) is None  # the boxes looked at by another model (none)
    early.start(load_config(None, ("face.box=[10,10,100,100]",)), FACE)
    assert ahead.take(ahead.FACE) is None  # a face box: nothing to look for


def test_an_early_search_that_fails_leaves_the_set_up_to_say_why(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a png")
    early.start(load_config(None, ("preview.phones=false",)), bad)
    assert early.take_face(load_reference(FACE), None, None) is None
    assert ahead.take(ahead.PHONE_DECODER) is None  # preview.phones=false: no decoder made


@needs_sphinx
def test_a_large_image_is_not_looked_at_early(tmp_path, monkeypatch):
    """The early search holds its own copy of the pixels until the set-up takes it: not for a large image,
    which the set-up alone reads (one copy of a huge scan, not two)."""
    monkeypatch.setattr(early, "EARLY_MAX_PIXELS", 512 * 512 - 1)  # (examples/face.png is 512x512)
    early.start(load_config(None, ("preview.phones=false",)), FACE)
    assert ahead.take(ahead.FACE) is None
    monkeypatch.setattr(early, "EARLY_MAX_PIXELS", 512 * 512)
    early.start(load_config(None, ("preview.phones=false",)), FACE)
    assert ahead.take(ahead.FACE) is not None


def test_the_recogniser_takes_the_decoder_made_early():
    early.start(load_config(None, ("face.box=[10,10,100,100]",)), FACE)
    made = ahead._started[ahead.PHONE_DECODER].value()
    recognizer = PhoneRecognizer()
    recognizer.load()
    assert recognizer._decoder is made
    fresh = PhoneRecognizer()  # nothing left to take: its own
    fresh.load()
    assert fresh._decoder is not made and fresh._decoder is not None


def test_the_command_line_starts_the_early_work_before_the_render(monkeypatch, tmp_path):
    from avatar_render.cli import app
    from avatar_render.errors import AvatarRenderError

    started = []

    def start(cfg, ref) -> None:
        started.append((cfg.backend, cfg.face.index, ref))
        raise AvatarRenderError("Stopped where the early work starts.")

    monkeypatch.setattr(early, "start", start)
    args = ["render", "--ref", str(FACE), "--audio", str(FACE.parent / "talk.wav"), "-o", str(tmp_path / "x.mp4"),
            "face.index=1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "Stopped where the early work starts." in result.output
    assert started == [("preview", 1, FACE)] and not list(tmp_path.iterdir())
    assert CliRunner().invoke(app, [*args, "--dry-run"]).exit_code == 0  # a dry run: its plan looks itself
    assert len(started) == 1


def test_a_command_refused_before_its_set_up_ends_in_one_sentence_while_the_early_work_runs(tmp_path):
    """The early threads are still in OpenCV and PocketSphinx when the command refuses its output: it waits
    for them and exits with its sentence (a daemon thread there made the interpreter's end abort)."""
    out = tmp_path / "x.mp4"
    out.write_bytes(b"kept")
    done = subprocess.run([sys.executable, "-m", "avatar_render", "render", "--ref", str(FACE), "--audio",
                           str(FACE.parent / "talk.wav"), "-o", str(out)], capture_output=True, text=True,
                          cwd=FACE.parents[1], timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"Error: The output '{out}' already exists; pass --force to replace it."
    assert out.read_bytes() == b"kept"
