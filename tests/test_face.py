"""Face layout: detection on the example portrait, fallbacks and coordinate mapping."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from avatar_render.errors import AvatarRenderError
from avatar_render.face import finder
from avatar_render.face.detect import FaceDetector, choose_face
from avatar_render.face.fit import Fit, fit_to_frame
from avatar_render.face.layout import Box, FaceLayout, fallback_layout, layout_from_box
from avatar_render.io.reference import load_reference

FACE_PNG = Path(__file__).resolve().parents[1] / "examples" / "face.png"

# Measured by hand on examples/face.png (512x512): eye centres, and the lips (smiling, teeth showing).
LEFT_EYE = (203, 100)
RIGHT_EYE = (246, 101)
LIPS = Box(202, 138, 44, 16)  # corner to corner, top of the upper lip to the bottom of the lower lip


@pytest.fixture(scope="module")
def detector() -> FaceDetector:
    detector = FaceDetector()
    detector.load()
    return detector


@pytest.fixture(scope="module")
def portrait() -> np.ndarray:
    return load_reference(FACE_PNG)


@pytest.fixture(scope="module")
def layout(detector: FaceDetector, portrait: np.ndarray) -> FaceLayout:
    found = detector.detect(portrait)
    assert found is not None
    return found


def test_face_box_is_plausible(layout: FaceLayout) -> None:
    face = layout.face
    assert layout.detected
    # The cascade frames brows to just under the mouth: about x 178..270, y 69..161.
    assert 165 <= face.x <= 190 and 255 <= face.x + face.w <= 285
    assert 55 <= face.y <= 85 and 150 <= face.y + face.h <= 175


def test_eyes_are_on_the_eyes(layout: FaceLayout) -> None:
    for box, (x, y) in ((layout.left_eye, LEFT_EYE), (layout.right_eye, RIGHT_EYE)):
        assert abs(box.cx - x) <= 4 and abs(box.cy - y) <= 4
        assert box.x < x < box.x + box.w and box.y < y < box.y + box.h
        assert 12 <= box.w <= 26 and 5 <= box.h <= 14
    assert layout.left_eye.cx < layout.right_eye.cx


def test_mouth_is_on_the_lips(layout: FaceLayout) -> None:
    mouth, face = layout.mouth, layout.face
    assert abs(mouth.cx - LIPS.cx) <= 4 and abs(mouth.cy - LIPS.cy) <= 4
    assert 0.7 * LIPS.w <= mouth.w <= 1.2 * LIPS.w and 0.6 * LIPS.h <= mouth.h <= 1.3 * LIPS.h
    assert max(layout.left_eye.y + layout.left_eye.h, layout.right_eye.y + layout.right_eye.h) < mouth.y
    # Inside the lower third of the face box.
    assert face.y + 2 * face.h / 3 <= mouth.cy <= face.y + face.h
    assert face.x <= mouth.x and mouth.x + mouth.w <= face.x + face.w


def test_detection_is_scale_invariant(detector: FaceDetector, portrait: np.ndarray, layout: FaceLayout) -> None:
    big = cv2.resize(portrait, (1536, 1536), interpolation=cv2.INTER_CUBIC)  # searched on a downscaled copy
    found = detector.detect(big)
    assert found is not None
    (face, *features), (face_ref, *features_ref) = _boxes(found), _boxes(layout)
    assert np.allclose(np.array(face) / 3, face_ref, atol=8)  # the cascade's scale steps move the box a little
    for a, b in zip(features, features_ref):  # eyes and lips
        assert np.allclose(np.array(a) / 3, b, atol=4)


def test_detection_in_a_larger_canvas(detector: FaceDetector, portrait: np.ndarray, layout: FaceLayout) -> None:
    canvas = np.full((1000, 700, 3), 200, np.uint8)
    canvas[300:812, 100:612] = portrait
    found = detector.detect(canvas)
    assert found is not None
    assert abs(found.mouth.cx - 100 - layout.mouth.cx) <= 3 and abs(found.mouth.cy - 300 - layout.mouth.cy) <= 3


def test_a_small_face_in_a_large_photo_is_found(detector: FaceDetector, portrait: np.ndarray,
                                                layout: FaceLayout) -> None:
    """Too small for the first search (under 24 px in its 640-px copy), found by the second, in a larger one, on
    a plain backdrop (which skews an equalised histogram)."""

    canvas = np.full((2000, 3000, 3), 120, np.uint8)
    side = 320
    canvas[900 : 900 + side, 2200 : 2200 + side] = cv2.resize(portrait, (side, side), interpolation=cv2.INTER_AREA)
    k = side / portrait.shape[1]
    assert layout.face.w * k * 640 / 3000 < 24
    assert not detector.faces(canvas)  # (a video's frames are searched once, as fast as before)
    found = choose_face(canvas, detector, None)[0]
    assert found is not None
    assert abs(found.mouth.cx - (2200 + k * layout.mouth.cx)) <= 4
    assert abs(found.mouth.cy - (900 + k * layout.mouth.cy)) <= 4


@pytest.mark.parametrize("degrees", [35.0, -50.0])
def test_a_tilted_head_is_found_in_a_turned_copy(detector: FaceDetector, portrait: np.ndarray, layout: FaceLayout,
                                                 degrees: float) -> None:
    """A head tilted further than the upright search sees: found in a turned copy of the picture, its layout
    mapped back along the tilted eye line, and the landmarks found from it."""
    from avatar_render.face.landmarks import LandmarkModel, find_model

    canvas = np.full((900, 900, 3), 255, np.uint8)
    canvas[194:706, 194:706] = portrait
    turn = cv2.getRotationMatrix2D((450.0, 450.0), degrees, 1.0)  # (counter-clockwise on screen)
    tilted = cv2.warpAffine(canvas, turn, (900, 900), borderValue=(255, 255, 255))
    assert not detector.faces(tilted)
    found, _ = choose_face(tilted, detector, None)
    assert found is not None and found.detected
    assert abs(np.degrees(found.roll) + degrees) < 6  # the eye line turned with the picture
    mouth = turn @ (194 + layout.mouth.cx, 194 + layout.mouth.cy, 1.0)
    assert np.hypot(found.mouth.cx - mouth[0], found.mouth.cy - mouth[1]) < 0.15 * layout.face.w
    path = find_model()
    if path is not None:
        mesh = LandmarkModel(path).from_box(tilted, found.face, found.roll)
        assert mesh is not None
        a, b = mesh.points[33], mesh.points[263]  # the outer eye corners
        assert abs(np.degrees(np.arctan2(b[1] - a[1], b[0] - a[0])) + degrees) < 4


@pytest.mark.parametrize("quarters, says", [(1, "counter-clockwise"), (-1, "a quarter clockwise"), (2, "upside down")])
def test_a_picture_on_its_side_or_upside_down_is_animated_as_it_lies_and_named(
        detector: FaceDetector, portrait: np.ndarray, layout: FaceLayout, quarters: int, says: str) -> None:
    """A photo whose orientation tag was lost: with the landmark model's closer look, the face is found turned a
    quarter or half way round, its layout mapped back, and the note says how it lies. Without it, such turns are
    not searched (the cascade fires on the upside-down example: a mouth would be drawn on its forehead)."""
    from avatar_render.face.landmarks import LandmarkModel, find_model

    turned = np.ascontiguousarray(np.rot90(portrait, quarters))  # (counter-clockwise on screen for quarters > 0)
    assert choose_face(turned, detector, None)[1] == ""
    path = find_model()
    if path is None:
        pytest.skip("the face landmark model is not installed (avatar-render setup)")
    found, note = choose_face(turned, detector, None, is_face=LandmarkModel(path).finds_face(turned))
    assert found is not None and found.detected
    assert abs((np.degrees(found.roll) + 90 * quarters + 180) % 360 - 180) < 8  # the eye line turned with it
    assert says in note and "upright" in note
    h, w = portrait.shape[:2]
    mouth = {1: (layout.mouth.cy, w - layout.mouth.cx), -1: (h - layout.mouth.cy, layout.mouth.cx),
             2: (w - layout.mouth.cx, h - layout.mouth.cy)}[quarters]
    assert np.hypot(found.mouth.cx - mouth[0], found.mouth.cy - mouth[1]) < 0.15 * layout.face.w
    assert choose_face(portrait, detector, None, is_face=LandmarkModel(path).finds_face(portrait))[1] == ""


def test_no_face(detector: FaceDetector) -> None:
    assert detector.detect(np.full((480, 640, 3), 128, np.uint8)) is None
    noise = np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    assert detector.detect(noise) is None


def test_layout_follows_the_fitted_frame(detector: FaceDetector, portrait: np.ndarray, layout: FaceLayout) -> None:
    f = layout.face
    frame, fit = fit_to_frame(portrait, 384, 216, focus=(f.x, f.y, f.w, f.h))
    mapped = layout.mapped(fit)
    again = detector.detect(frame)
    assert again is not None
    assert abs(again.mouth.cx - mapped.mouth.cx) <= 4 and abs(again.mouth.cy - mapped.mouth.cy) <= 4
    assert abs(again.left_eye.cx - mapped.left_eye.cx) <= 4 and abs(again.right_eye.cy - mapped.right_eye.cy) <= 4


def test_weight_files_are_shipped_with_opencv() -> None:
    detector = FaceDetector()
    assert detector.name == "face_detector"
    files = detector.weight_files()
    assert files and all(p.suffix == ".xml" for p in files) and detector.missing_files() == []


class _BrokenDetector(FaceDetector):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def weight_files(self) -> list[Path]:
        return [self.path]


def test_unloadable_cascade_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(AvatarRenderError, match="missing.xml' is missing"):
        _BrokenDetector(tmp_path / "missing.xml").load()
    (tmp_path / "bad.xml").write_text("<opencv_storage>not a cascade")
    with pytest.raises(AvatarRenderError, match="bad.xml' could not be loaded"):
        _BrokenDetector(tmp_path / "bad.xml").load()


def test_layout_from_box_geometry() -> None:
    box = Box(100, 50, 200, 200)
    lay = layout_from_box(box)
    assert not lay.detected and lay.face == box
    assert layout_from_box(box, detected=True).detected
    left, right, mouth = lay.left_eye, lay.right_eye, lay.mouth
    assert left.cx < box.cx < right.cx and left.cx - box.x == pytest.approx(box.x + box.w - right.cx)
    assert left.cy == right.cy and box.y + 0.25 * box.h < left.cy < box.y + 0.5 * box.h
    assert mouth.cx == pytest.approx(box.cx) and box.y + 2 * box.h / 3 < mouth.cy < box.y + box.h
    assert left.y + left.h < mouth.y and mouth.x >= box.x and mouth.x + mouth.w <= box.x + box.w
    assert right.x > left.x + left.w  # eyes do not overlap
    assert 0.25 * box.w < mouth.w < 0.5 * box.w and mouth.h < mouth.w


def test_fallback_layout_sits_in_the_upper_middle() -> None:
    for width, height in ((512, 512), (1280, 720), (720, 1280)):
        lay = fallback_layout(width, height)
        face = lay.face
        assert not lay.detected
        assert face.cx == pytest.approx(width / 2) and face.cy < height / 2
        assert 0 <= face.x and face.x + face.w <= width and 0 <= face.y and face.y + face.h <= height


def test_box_helpers_and_mapping() -> None:
    box = Box(10, 20, 30, 40)
    assert (box.cx, box.cy) == (25, 40)
    assert Box.around(25, 40, 30, 40) == box
    fit = Fit(scale=0.5, offset_x=2, offset_y=4)
    assert box.scaled(fit) == Box(3, 6, 15, 20)
    lay = layout_from_box(Box(100, 100, 80, 80), detected=True)
    mapped = lay.mapped(fit)
    assert mapped.detected
    for a, b in zip(_boxes(mapped), _boxes(lay)):
        assert a == pytest.approx((b[0] * 0.5 - 2, b[1] * 0.5 - 4, b[2] * 0.5, b[3] * 0.5))
    with pytest.raises(AttributeError):
        box.x = 0  # type: ignore[misc]


def _boxes(lay: FaceLayout) -> list[tuple[float, float, float, float]]:
    return [(b.x, b.y, b.w, b.h) for b in (lay.face, lay.left_eye, lay.right_eye, lay.mouth)]


# Dense landmarks: MediaPipe's face mesh model when installed (scripts/fetch_face_model.py), else the template.

from avatar_render.face import mesh as fm  # noqa: E402
from avatar_render.face.finder import find_model as find_finder  # noqa: E402
from avatar_render.face.landmarks import LandmarkModel, find_model  # noqa: E402
from avatar_render.face.segment import find_model as find_segmenter  # noqa: E402

needs_model = pytest.mark.skipif(find_model() is None,
                                 reason="face landmark model not installed (scripts/fetch_face_model.py)")


@needs_model
def test_landmarks_on_the_example_match_hand_measures(portrait: np.ndarray, layout: FaceLayout) -> None:
    mesh = LandmarkModel(find_model()).from_box(portrait, layout.face)
    assert mesh is not None and mesh.source == "model"
    assert np.hypot(*(mesh.left_eye_centre - LEFT_EYE)) < 3 and np.hypot(*(mesh.right_eye_centre - RIGHT_EYE)) < 4
    for corner in (61, 291):  # lip corners inside the hand-measured lips box, within 3 px
        x, y = mesh.points[corner]
        assert LIPS.x - 3 <= x <= LIPS.x + LIPS.w + 3 and LIPS.y - 3 <= y <= LIPS.y + LIPS.h + 3
    assert 5 < mesh.lip_gap() < 12  # smiling, teeth showing
    assert 0.2 < mesh.eye_opening() < 0.4
    again = LandmarkModel(find_model()).track(portrait, mesh)  # tracking from itself stays put
    assert np.abs(again.points - mesh.points).mean() < 0.5


@needs_model
def test_no_face_no_landmarks() -> None:
    blank = np.full((256, 256, 3), 128, np.uint8)
    assert LandmarkModel(find_model()).from_box(blank, Box(64, 64, 128, 128)) is None


def test_landmark_settings(tmp_path: Path) -> None:
    assert find_model("template") is None
    with pytest.raises(AvatarRenderError, match="avatar-render setup"):
        find_model(str(tmp_path / "missing.tflite"))
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"not a model")
    with pytest.raises(AvatarRenderError, match="could not be read"):
        LandmarkModel(bad).load()


def test_template_mesh_sits_on_the_layout(layout: FaceLayout) -> None:
    mesh = fm.template_mesh(layout)
    assert mesh.source == "template" and mesh.points.shape == (fm.NUM_POINTS, 2)
    assert np.allclose(mesh.left_eye_centre, (layout.left_eye.cx, layout.left_eye.cy), atol=0.01)
    assert np.allclose(mesh.mouth_centre, (layout.mouth.cx, layout.mouth.cy), atol=0.01)
    assert mesh.lip_gap() == 0  # closed lips: nothing is assumed about teeth
    fit = Fit(scale=2.0, offset_x=10.0, offset_y=4.0)
    assert np.allclose(mesh.mapped(fit).points, mesh.points * 2 - (10, 4))


@pytest.fixture(scope="module")
def group(portrait: np.ndarray) -> np.ndarray:
    """Two people: a smaller copy of the portrait on the left, the portrait itself on the right."""
    small = cv2.resize(portrait, (portrait.shape[1] * 3 // 4, portrait.shape[0] * 3 // 4), interpolation=cv2.INTER_AREA)
    canvas = np.full((portrait.shape[0], small.shape[1] + 40 + portrait.shape[1], 3), 255, np.uint8)
    canvas[: small.shape[0], : small.shape[1]] = small
    canvas[:, small.shape[1] + 40:] = portrait
    return canvas


def test_a_group_photo_says_which_face_is_rendered_and_face_index_picks_another(group: np.ndarray) -> None:
    layout, note = choose_face(group, FaceDetector(), None)
    assert layout.face.x > group.shape[1] / 2  # the largest: the portrait on the right
    assert note.startswith("2 faces were found in the reference; rendering the largest, the 2nd from the left")
    assert "face.index=1..2 picks another" in note
    left, note = choose_face(group, FaceDetector(index=1), None)
    assert left.face.x + left.face.w < group.shape[1] / 2 and "rendering face.index=1, the 1st from the left" in note
    with pytest.raises(AvatarRenderError, match="face.index=3 asks for the face 3rd from the left, but 2 faces were"):
        choose_face(group, FaceDetector(index=3), None)
    assert choose_face(group[:, -512:], FaceDetector(), None)[1] == ""  # one face: nothing to say


def test_boxes_a_closer_look_rejects_are_not_faces(group: np.ndarray) -> None:
    """A box the cascade fires on in which the closer look (``is_face``: the landmark model's) sees no face, a hand
    or a patterned shirt, is neither rendered nor counted, nor is a tilted copy's."""
    looked_at = []

    def right_only(box: Box, roll: float) -> bool:
        looked_at.append(box)
        return box.x > group.shape[1] / 2

    layout, note = choose_face(group, FaceDetector(index=1), None, is_face=right_only)
    assert len(looked_at) == 2 and layout.face.x > group.shape[1] / 2 and note == ""  # one face: nothing to say
    with pytest.raises(AvatarRenderError, match="face.index=2 asks for the face 2nd from the left, but 1 face was"):
        choose_face(group, FaceDetector(index=2), None, is_face=right_only)
    assert choose_face(group, FaceDetector(), None, is_face=lambda box, roll: False) == (None, "")


@pytest.mark.skipif(find_finder() is None or find_model() is None,
                    reason="face models not installed (scripts/fetch_face_model.py)")
def test_a_speaking_face_the_cascade_misses_is_found_and_chosen(portrait: np.ndarray, monkeypatch) -> None:
    """The cascade misses a face whose mouth is open dark (a photo taken mid-word: Einstein at a lectern), and
    rendered the smaller face it did find. The second detector finds it, the landmark model confirms it, and
    being the largest it is the one chosen; nothing changes where the cascade finds every face."""
    speaking = portrait.copy()
    speaking[120:145, 195:255] = 30  # the example's lips and teeth, dark
    small = cv2.resize(portrait, (portrait.shape[1] // 2, portrait.shape[0] // 2), interpolation=cv2.INTER_AREA)
    photo = np.full((portrait.shape[0], small.shape[1] + portrait.shape[1], 3), 255, np.uint8)
    photo[: small.shape[0], : small.shape[1]] = small
    photo[:, small.shape[1]:] = speaking
    detector = FaceDetector()
    assert [b.x < small.shape[1] for b in detector.faces(photo, thorough=True)] == [True]  # the cascade alone
    model = LandmarkModel(find_model())
    layout, note = choose_face(photo, detector, None, is_face=model.finds_face(photo))
    face = layout.face
    assert abs(face.cx - (small.shape[1] + LIPS.x + LIPS.w / 2)) < 8 and 80 < face.w < 130  # the example's: 92 px
    assert note.startswith("2 faces were found in the reference; rendering the largest, the 2nd from the left")
    assert choose_face(portrait, FaceDetector(), None, is_face=model.finds_face(portrait)) == choose_face(
        portrait, FaceDetector(), None)  # one face the cascade finds: the same box, whether or not it looks again
    import tracemalloc

    strip = np.full((40, 20000, 3), 128, np.uint8)  # a panorama: its tiles are not padded to its length squared
    tracemalloc.start()
    assert finder.FaceFinder(finder.find_model()).faces(strip) == []
    assert tracemalloc.get_traced_memory()[1] < 50e6  # (a 20000-px square tile: 1.2 GB)
    tracemalloc.stop()
    monkeypatch.setattr(finder, "find_model", lambda: None)  # (as where only the landmark model is installed)
    assert choose_face(photo, FaceDetector(), None, is_face=model.finds_face(photo))[0].face.x < small.shape[1]


def test_the_second_detector_tiles_reach_every_edge() -> None:
    assert finder._starts(1000, 256) == [0, 128, 256, 384, 512, 640, 744]
    assert finder._starts(200, 256) == [0]
    assert finder.same_face(Box(0, 0, 100, 100), Box(40, 40, 20, 20))  # one inside the other
    assert not finder.same_face(Box(0, 0, 100, 100), Box(90, 0, 100, 100))  # neighbours touching


def test_render_of_a_group_photo_names_the_face(tmp_path: Path, group: np.ndarray) -> None:
    from PIL import Image

    from tests.media import speech_like, write_audio

    Image.fromarray(group).save(tmp_path / "group.png")
    audio = write_audio(tmp_path / "a.wav", speech_like(0.5, 16000), 16000)
    args = [sys.executable, "-m", "avatar_render", "render", "--ref", str(tmp_path / "group.png"), "--audio",
            str(audio), "video.width=96", "video.height=96", "-q"]
    done = subprocess.run([*args, "-o", str(tmp_path / "o.mp4")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Warning: 2 faces were found in the reference" in done.stderr, done.stderr
    refused = subprocess.run([*args, "-o", str(tmp_path / "p.mp4"), "face.index=4"], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1 and refused.stderr.startswith("Error: face.index=4 asks for the face 4th")
    assert "Traceback" not in refused.stderr and not (tmp_path / "p.mp4").exists()


def test_a_render_without_the_model_names_the_setup_command(monkeypatch) -> None:
    from avatar_render.preview import engine

    assert engine.landmark_notes("template") == ()  # chosen, not missing
    monkeypatch.setattr(engine, "find_model", lambda setting: None)  # (unit: as on a plain pip install)
    (note,) = engine.landmark_notes("auto")
    assert note.endswith("avatar-render setup")


def test_a_render_without_the_segmentation_model_names_the_setup_command(monkeypatch) -> None:
    """An install made before the person segmentation came: one line, naming the command that adds it."""
    from avatar_render.preview import engine

    monkeypatch.setattr(engine, "find_segmenter", lambda: None)
    (note,) = engine.segmentation_notes(1.0)
    assert "background" in note and note.endswith("avatar-render setup")
    assert engine.segmentation_notes(0.0) == ()  # (a still head: nothing moves the background)


@pytest.mark.skipif(find_finder() is None or find_model() is None or find_segmenter() is None,
                    reason="face models not installed (scripts/fetch_face_model.py)")
def test_setup_leaves_installed_models_in_place(tmp_path: Path) -> None:
    import shutil

    shutil.copyfile(find_model(), tmp_path / "face_landmark.tflite")
    shutil.copyfile(find_finder(), tmp_path / "face_detection_short_range.tflite")
    shutil.copyfile(find_segmenter(), tmp_path / "selfie_segmentation.tflite")
    done = subprocess.run([sys.executable, "-m", "avatar_render", "setup", "--dest", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "already in place" in done.stdout  # nothing downloaded


def test_setup_without_the_package_index_says_so_in_one_line_and_leaves_no_folder(tmp_path: Path) -> None:
    """pip's retries and errors are not the user's to read: one sentence, and the --dest folder it made is gone."""
    import os

    closed = {"PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "1", "PIP_NO_CACHE_DIR": "1",
              "PIP_TIMEOUT": "5"}  # (a port nothing listens on, on this machine)
    done = subprocess.run([sys.executable, "-m", "avatar_render", "setup", "--dest", str(tmp_path / "models")],
                          capture_output=True, text=True, env={**os.environ, **closed}, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: pip could not download mediapipe==0.10.21 (the package index could not be reached: is this machine "
        "offline?); the preview uses its template mesh until this step succeeds."], done.stderr
    assert list(tmp_path.iterdir()) == []


def test_setup_refuses_a_dest_that_is_not_a_folder(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    done = subprocess.run([sys.executable, "-m", "avatar_render", "setup", "--dest", str(afile)],
                          capture_output=True, text=True)
    assert done.returncode == 1 and "is not a folder" in done.stderr and "Traceback" not in done.stderr
    assert afile.read_bytes() == b"x"


def test_the_template_opens_its_lips_around_the_teeth_of_a_smile(portrait: np.ndarray, layout: FaceLayout) -> None:
    """The template's lips are closed; placed on a smile they ran across the teeth. Opened around them, the
    teeth lie between its inner lips; a mouth that shows no teeth leaves it as it was."""
    from avatar_render.face.teeth import open_to_teeth

    mesh = fm.template_mesh(layout)
    assert mesh.lip_gap() < 0.5
    opened = open_to_teeth(portrait, mesh)
    assert 4 < opened.lip_gap() < 14  # the example's teeth: 5-12 px between the lips (hand-measured lips 16 px)
    inner = np.concatenate([opened.at(fm.LIPS_INNER_UPPER), opened.at(fm.LIPS_INNER_LOWER)[::-1]])
    assert LIPS.y - 3 <= inner[:, 1].min() and inner[:, 1].max() <= LIPS.y + LIPS.h + 3
    x0, y0 = int(LIPS.x + 0.3 * LIPS.w), int(LIPS.y)
    box = portrait[y0 : y0 + int(LIPS.h), x0 : int(LIPS.x + 0.7 * LIPS.w)].astype(np.float32)
    grey = box @ np.array([0.299, 0.587, 0.114], np.float32)
    teeth = (grey > 215) & (box.max(axis=2) - box.min(axis=2) < 0.15 * grey)
    ys, xs = np.nonzero(teeth)
    assert len(ys) > 10
    inside = [cv2.pointPolygonTest(inner.astype(np.float32), (float(x + x0 + 0.5), float(y + y0 + 0.5)), False) >= 0
              for x, y in zip(xs, ys)]
    assert np.mean(inside) > 0.8
    # Lips together (the teeth painted over with the lips' colour): nothing to open.
    shut = portrait.copy()
    lips = portrait[int(LIPS.y) + 12, int(LIPS.cx)]
    shut[int(LIPS.y) : int(LIPS.y + LIPS.h), int(LIPS.x) : int(LIPS.x + LIPS.w)] = lips
    assert open_to_teeth(shut, mesh) is mesh


@needs_model
def test_the_landmark_model_tells_faces_from_what_the_cascade_mistook_for_one(group: np.ndarray,
                                                                             monkeypatch) -> None:
    """The cascade's boxes checked by the landmark model, as a render checks them: both faces kept, a box on
    the astronaut's suit (standing in for the cascade's mistakes: a hand, a shirt) dropped."""
    real = FaceDetector._search
    suit = Box(group.shape[1] - 232, 360, 120, 120)
    monkeypatch.setattr(FaceDetector, "_search", lambda self, image, side, **kw: [*real(self, image, side, **kw), suit])
    assert len(FaceDetector().faces(group)) == 3
    model = LandmarkModel(find_model())
    layout, note = choose_face(group, FaceDetector(index=2), None, is_face=model.finds_face(group))
    assert note.startswith("2 faces were found in the reference; rendering face.index=2, the 2nd from the left")
    assert layout.face.x > group.shape[1] / 2 and layout.face.x + layout.face.w < suit.x + suit.w
    mesh = model.from_box(group, layout.face)
    assert mesh is not None and layout.face.x < mesh.points[:, 0].mean() < layout.face.x + layout.face.w
