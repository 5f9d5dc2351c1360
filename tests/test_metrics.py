"""Consistency metrics on synthetic videos whose answers are known, and ``inspect`` on a real render."""

import json
import subprocess
import sys
from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from avatar_render.api import RenderRequest, render
from avatar_render.config import load_config
from avatar_render.face.landmarks import find_model
from avatar_render.face.layout import Box, layout_from_box
from avatar_render.face.track import PhaseCorrelator
from avatar_render.metrics.colour import ciede2000, rgb_to_lab
from avatar_render.metrics.inspect import inspect_video
from avatar_render.metrics.lips import MEASURE as LIPS
from avatar_render.metrics.seams import chunk_boundaries, measure_seams
from avatar_render.metrics.summary import summary_rows
from tests.media import speech_like, write_audio

FPS = 25
SIZE = 128
FACE = [34.0, 22.0, 60.0, 60.0]  # x, y, w, h in video pixels
SS = 4  # supersampling of the drawing


def _texture(seed: int, sigma: float) -> np.ndarray:
    noise = np.random.default_rng(seed).normal(0, 1, (SIZE * SS, SIZE * SS)).astype(np.float32)
    blurred = cv2.GaussianBlur(noise, (0, 0), sigma * SS)
    return blurred / blurred.std()


BACKGROUND = _texture(1, 3.0)
SKIN_TEXTURE = _texture(2, 1.5)


def face_frame(*, mouth: float = 0.0, eyes: float = 0.0, shift=(0.0, 0.0), tint=(0, 0, 0),
               other_face: bool = False, eye_open: float = 1.0) -> np.ndarray:
    """(SIZE, SIZE, 3) uint8: a drawn face at FACE with the mouth open by ``mouth`` (0..1) and the eyes
    closed by ``eyes`` (0..1), the whole picture moved by ``shift`` pixels and offset by ``tint``;
    ``eye_open`` < 1 draws narrower eyes (a smile's slit between the creases of the lid and the cheek),
    which close by narrowing to nothing: the skin and creases around them stay as they are."""
    lay = layout_from_box(Box(*FACE))
    big = np.empty((SIZE * SS, SIZE * SS, 3), np.float32)
    big[:] = (90, 110, 140)
    big += BACKGROUND[..., None] * 12
    f = lay.face
    s = lambda v: int(round(v * SS))  # noqa: E731
    cv2.ellipse(big, (s(f.cx), s(f.cy)), (s(f.w * 0.48), s(f.h * 0.62)), 0, 0, 360, (205, 160, 135), -1)
    if other_face:  # a different face: wide brows, a moustache, a scar
        cv2.rectangle(big, (s(f.x + 8), s(f.y + 12)), (s(f.x + f.w - 8), s(f.y + 17)), (60, 40, 30), -1)
        cv2.line(big, (s(f.x + 10), s(f.y + 25)), (s(f.x + 30), s(f.y + 50)), (120, 60, 60), 3 * SS)
        cv2.ellipse(big, (s(lay.mouth.cx), s(lay.mouth.y - 2)), (s(lay.mouth.w * 0.7), s(4)), 0, 0, 360, (50, 35, 25),
                    -1)
    face_mask = np.zeros(big.shape[:2], np.float32)
    cv2.ellipse(face_mask, (s(f.cx), s(f.cy)), (s(f.w * 0.48), s(f.h * 0.62)), 0, 0, 360, 1.0, -1)
    big += (SKIN_TEXTURE * 8 * face_mask)[..., None]
    cv2.line(big, (s(f.cx), s(f.cy - 6)), (s(f.cx + 3), s(f.cy + 8)), (150, 105, 90), 2 * SS)  # nose
    for e in (lay.left_eye, lay.right_eye):
        narrow = eye_open < 1
        half = e.h * 0.5 * eye_open * ((1 - eyes) if narrow else 1)
        if half > 0:  # the eye's white and iris, seen through its opening (drawn in the opening's box only)
            cx, cy, rx, ry = s(e.cx), s(e.cy), s(e.w * 0.45), s(half)
            x0, y0 = cx - rx - 1, cy - ry - 1
            roi = big[y0 : cy + ry + 2, x0 : cx + rx + 2]
            slit = np.zeros(roi.shape[:2], np.uint8)
            cv2.ellipse(slit, (cx - x0, cy - y0), (rx, ry), 0, 0, 360, 1, -1)
            eye = np.empty_like(roi)
            eye[:] = (245, 245, 240)
            cv2.circle(eye, (cx - x0, cy - y0), s(e.h * 0.45), (40, 30, 25), -1)
            roi[slit > 0] = eye[slit > 0]
        for dy in (-0.55, 0.55) if narrow else ():
            cv2.ellipse(big, (s(e.cx), s(e.cy + dy * e.h)), (s(e.w * 0.5), s(e.h * 0.2)), 0, 200 if dy < 0 else 20,
                        340 if dy < 0 else 160, (70, 45, 40), 2 * SS)
        if eyes > 0 and not narrow:  # the lid comes down from the top of the eye
            top = e.cy - e.h * 0.6
            cv2.rectangle(big, (s(e.x - 1), s(top)), (s(e.x + e.w + 1), s(top + eyes * e.h * 1.2)), (200, 155, 130), -1)
    m = lay.mouth
    cv2.ellipse(big, (s(m.cx), s(m.cy + mouth * m.w * 0.2)), (s(m.w * 0.45), s(m.h * 0.3 + mouth * m.w * 0.22)), 0, 0,
                360, (70, 20, 30), -1)
    frame = cv2.resize(big, (SIZE, SIZE), interpolation=cv2.INTER_AREA)
    if shift != (0.0, 0.0):
        frame = cv2.warpAffine(frame, np.float32([[1, 0, shift[0]], [0, 1, shift[1]]]), (SIZE, SIZE),
                               borderMode=cv2.BORDER_REFLECT)
    return np.clip(frame + np.array(tint, np.float32) + 0.5, 0, 255).astype(np.uint8)


def write_video(path: Path, frames) -> Path:
    """Lossless H.264 (yuv420p) at FPS from an iterable of (SIZE, SIZE, 3) uint8 frames."""
    with av.open(str(path), "w") as c:
        stream = c.add_stream("libx264", rate=FPS)
        stream.width = stream.height = SIZE
        stream.pix_fmt = "yuv420p"
        stream.options = {"qp": "0", "preset": "ultrafast"}
        for i, frame in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(frame, format="rgb24")
            vf.pts = i
            c.mux(stream.encode(vf))
        c.mux(stream.encode(None))
    return path


def fake_report(path: Path, frames: int, chunk_frames: int, transition_frames: int = 0) -> Path:
    path.write_text(json.dumps({"frames": frames, "config": {"chunk": {
        "chunk_frames": chunk_frames, "context_frames": 1, "transition_frames": transition_frames}}, "chunks": []}))
    return path


def envelope(n: int, seed: int) -> np.ndarray:
    """(n,) syllable-like loudness per frame in [0, 1]: smooth bursts with silent gaps."""
    rng = np.random.default_rng(seed)
    env = np.zeros(n)
    t = 2
    while t < n:
        length = min(int(rng.integers(4, 9)), n - t)
        env[t : t + length] = np.hanning(length + 2)[1:-1] * rng.uniform(0.5, 1.0)
        t += length + int(rng.integers(1, 7))
    return env


def tone_wav(path: Path, env: np.ndarray, rate: int = 16000) -> Path:
    """A 180 Hz tone whose loudness follows ``env`` (one value per video frame)."""
    per = rate // FPS
    t = np.arange(len(env) * per) / rate
    gain = np.repeat(env, per)
    return write_audio(path, (0.4 * gain * np.sin(2 * np.pi * 180 * t))[None].astype(np.float32), rate)


@pytest.fixture(scope="module")
def constant(tmp_path_factory):
    d = tmp_path_factory.mktemp("constant")
    frame = face_frame()
    video = write_video(d / "constant.mp4", (frame for _ in range(75)))
    return inspect_video(video, report=fake_report(d / "r.json", 75, 25), face_box=FACE)


def test_constant_video_has_no_drift_no_seams_no_blinks(constant):
    assert constant.colour.face.mean < 0.05 and constant.colour.frame.mean < 0.05
    assert constant.colour.first_noticeable_s is None
    assert constant.seams is not None and constant.seams.ratio == pytest.approx(1.0, abs=0.05)
    assert [b.frame for b in constant.seams.boundaries] == [25, 50]
    assert constant.blinks.count == 0
    assert constant.head.speed_mean < 0.01 and constant.head.travel_max < 0.01
    assert constant.identity.similarity.mean > 0.99
    assert constant.face_found and constant.reference == "first frame"
    assert constant.mouth is None and "needs speech" in constant.missing["mouth"]


def test_planted_colour_shift_is_caught_at_its_second(tmp_path):
    start_s = 2
    frames = (face_frame(tint=(14, -3, -12) if i >= start_s * FPS else (0, 0, 0)) for i in range(4 * FPS))
    r = inspect_video(write_video(tmp_path / "tint.mp4", frames), face_box=FACE)
    assert r.colour.first_noticeable_s == start_s
    face = r.colour.face.per_second
    assert max(face[:start_s]) < 0.5 < 2.0 < min(face[start_s:])
    assert r.colour.face.trend_per_min > 0


def test_planted_jump_at_a_chunk_boundary_gives_a_high_seam_ratio(tmp_path):
    n = 100

    def pose(i: int, jump: bool):
        sway = 2.0 * np.sin(2 * np.pi * i / 60)
        return (sway + (3.0 if jump and i >= 50 else 0.0), 0.0)

    for jump in (False, True):
        frames = (face_frame(shift=pose(i, jump)) for i in range(n))
        video = write_video(tmp_path / f"jump{jump}.mp4", frames)
        s = measure_seams(video, fake_report(tmp_path / "r.json", n, 25))
        if jump:
            assert s.ratio > 4 and s.worst is not None and s.worst.frame == 50 and s.worst.ratio > 8
        else:
            assert 0.5 < s.ratio < 1.6


def test_boundaries_follow_the_chunk_plan_with_i_chunks():
    report = {"config": {"chunk": {"chunk_frames": 50, "context_frames": 1, "transition_frames": 8}}, "chunks": []}
    got = [(b.frame, b.kind) for b in chunk_boundaries(report, 130)]
    assert got == [(46, "edge"), (50, "seam"), (54, "edge"), (96, "edge"), (100, "seam"), (104, "edge")]
    report["config"]["chunk"]["transition_frames"] = 0
    assert [(b.frame, b.kind) for b in chunk_boundaries(report, 130)] == [(50, "seam"), (100, "seam")]


def test_boundaries_follow_a_short_first_chunk_and_the_backends_lead_frame():
    report = {"config": {"backend": "infinitetalk",
                         "chunk": {"chunk_frames": 16, "context_frames": 5, "transition_frames": 0,
                                                              "first_frames": 4}},
              # the first frame published alone is no boundary
              "chunks": [{"start": 0, "end": 1}, {"start": 1, "end": 5}]}
    assert [(b.frame, b.kind) for b in chunk_boundaries(report, 40)] == [(5, "seam"), (21, "seam"), (37, "seam")]
    report["config"]["chunk"]["first_frames"] = 0
    assert [b.frame for b in chunk_boundaries(report, 40)] == [17, 33]


def test_mouth_follows_speech_energy_or_not(tmp_path):
    n = 150
    speech = envelope(n, seed=3)
    wav = tone_wav(tmp_path / "speech.wav", speech)
    results = {}
    for name, mouth in (("matched", speech), ("unmatched", envelope(n, seed=11))):
        video = write_video(tmp_path / f"{name}.mp4", (face_frame(mouth=m / mouth.max()) for m in mouth))
        results[name] = inspect_video(video, audio=wav, face_box=FACE).mouth
    assert results["matched"].correlation > 0.8 and results["matched"].best_lag_frames == 0
    assert abs(results["unmatched"].correlation) < 0.4


def test_mouth_motion_during_silence(tmp_path):
    n = 150
    speech = envelope(n, seed=5)
    speech[60:100] = 0.0  # 1.6 s of silence
    wav = tone_wav(tmp_path / "speech.wav", speech)
    still = write_video(tmp_path / "still.mp4", (face_frame(mouth=m) for m in speech))
    chatter = np.where(np.arange(n) // 4 % 2 == 1, 0.8, 0.0)
    moving = write_video(tmp_path / "moving.mp4",
                         (face_frame(mouth=m if not 60 <= i < 100 else chatter[i]) for i, m in enumerate(speech)))
    quiet = inspect_video(still, audio=wav, face_box=FACE).mouth
    busy = inspect_video(moving, audio=wav, face_box=FACE).mouth
    assert quiet.silence_s >= 1.0
    assert quiet.silence_motion < 0.1 < 0.5 < busy.silence_motion


def test_blinks_are_counted_at_their_times(tmp_path):
    starts = [20, 55, 85]
    shape = [0.4, 0.8, 1.0, 1.0, 0.7, 0.3]

    def closure(i: int) -> float:
        return next((shape[i - s] for s in starts if 0 <= i - s < len(shape)), 0.0)

    video = write_video(tmp_path / "blinks.mp4", (face_frame(eyes=closure(i)) for i in range(110)))
    r = inspect_video(video, face_box=FACE)
    assert r.blinks.count == len(starts)
    assert np.allclose(r.blinks.times_s, np.array(starts) / FPS, atol=2 / FPS)
    assert r.blinks.per_minute == pytest.approx(len(starts) / (110 / FPS / 60))


def test_blinks_of_narrow_eyes_are_counted_and_a_moving_head_has_none(tmp_path):
    """A smile's narrow eyes: the slit is a small part of the eye region, and a blink covers it (the whole
    region's change was under the bar that keeps head motion out). A swaying, shaking head with the same
    eyes open throughout has no blink."""
    starts = [20, 55, 85]
    shape = [0.4, 0.8, 1.0, 1.0, 0.7, 0.3]

    def closure(i: int) -> float:
        return next((shape[i - s] for s in starts if 0 <= i - s < len(shape)), 0.0)

    narrow = write_video(tmp_path / "narrow.mp4", (face_frame(eyes=closure(i), eye_open=0.3) for i in range(110)))
    r = inspect_video(narrow, face_box=FACE)
    assert r.blinks.count == len(starts)
    assert np.allclose(r.blinks.times_s, np.array(starts) / FPS, atol=2 / FPS)
    rng = np.random.default_rng(1)
    moves = [(3.0 * np.sin(2 * np.pi * i / 40) + rng.uniform(-1, 1), 2.0 * np.cos(2 * np.pi * i / 30))
             for i in range(110)]
    moving = write_video(tmp_path / "moving.mp4", (face_frame(shift=p, eye_open=0.3) for p in moves))
    assert inspect_video(moving, face_box=FACE).blinks.count == 0


def test_head_motion_smooth_against_shaky(tmp_path):
    rng = np.random.default_rng(0)
    sway = [(3.0 * np.sin(2 * np.pi * i / 50), 1.5 * np.cos(2 * np.pi * i / 70)) for i in range(100)]
    shaky = [(x + rng.uniform(-1, 1), y + rng.uniform(-1, 1)) for x, y in sway]
    smooth_r = inspect_video(write_video(tmp_path / "smooth.mp4", (face_frame(shift=p) for p in sway)), face_box=FACE)
    shaky_r = inspect_video(write_video(tmp_path / "shaky.mp4", (face_frame(shift=p) for p in shaky)), face_box=FACE)
    track = smooth_r.series.head
    assert np.abs(track[:, 0] - np.array(sway)[:, 0]).max() < 0.3  # the tracker follows the face
    assert smooth_r.head.jitter < 0.5 < 1.0 < shaky_r.head.jitter
    assert shaky_r.head.jerk_rms > 5 * smooth_r.head.jerk_rms


def test_phase_correlator_recovers_subpixel_shifts():
    rng = np.random.default_rng(4)
    image = cv2.GaussianBlur(rng.normal(0, 1, (200, 200)).astype(np.float32), (0, 0), 2.0) * 40 + 128
    correlator = PhaseCorrelator(cv2.getRectSubPix(image, (90, 90), (100, 100)))
    for dx, dy in rng.uniform(-4, 4, (10, 2)):
        moved = cv2.getRectSubPix(image, (90, 90), (100 - dx, 100 - dy))  # content moved by (+dx, +dy)
        got_x, got_y, peak = correlator.shift(moved)
        assert abs(got_x - dx) < 0.1 and abs(got_y - dy) < 0.1 and peak > 0.5


def test_identity_drops_when_the_face_changes(tmp_path):
    frames = (face_frame(other_face=i >= 2 * FPS) for i in range(4 * FPS))
    r = inspect_video(write_video(tmp_path / "swap.mp4", frames), face_box=FACE)
    before, after = r.identity.similarity.per_second[:2], r.identity.similarity.per_second[2:]
    assert min(before) > 0.98 and max(after) < min(before) - 0.05
    assert r.identity.similarity.worst_s >= 2 and "proxy" in r.identity.method


def test_ciede2000_matches_published_pairs():
    # Sharma, Wu and Dalal (2005), Table 1.
    pairs = [((50, 2.6772, -79.7751), (50, 0, -82.7485), 2.0425), ((50, 0, 0), (50, -1, 2), 2.3669),
             ((50, 2.49, -0.001), (50, -2.49, 0.0009), 7.1792), ((50, 2.5, 0), (73, 25, -18), 27.1492),
             ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387), 1.2644),
             ((90.8027, -2.0831, 1.441), (91.1528, -1.6435, 0.0447), 1.4441)]
    a, b, expected = (np.array([p[i] for p in pairs], float) for i in range(3))
    assert np.allclose(ciede2000(a, b), expected, atol=1e-4)
    assert np.allclose(ciede2000(b, a), expected, atol=1e-4)
    assert np.allclose(rgb_to_lab(np.array([255, 0, 0], np.uint8)), [53.24, 80.09, 67.20], atol=0.05)


@pytest.fixture(scope="module")
def small_render(tmp_path_factory, face_png):
    d = tmp_path_factory.mktemp("render")
    speech = write_audio(d / "talk.wav", speech_like(2.0, 16000), 16000)
    cfg = load_config(None, ("video.width=96", "video.height=96", "chunk.chunk_frames=20", "chunk.transition_frames=4"))
    out, report = d / "out.mp4", d / "report.json"
    render(RenderRequest(reference=face_png, audio=speech, output=out, config=cfg, report=report))
    return out, report, speech


def cli(*args):
    return subprocess.run([sys.executable, "-m", "avatar_render", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_inspect_cli_on_a_real_render(small_render, face_png, tmp_path):
    out, report, speech = small_render
    plot, js = tmp_path / "m.png", tmp_path / "m.json"
    done = cli("inspect", out, "--report", report, "--ref", face_png, "--audio", speech, "--plot", plot, "--json", js)
    assert done.returncode == 0, done.stderr
    for label in ("colour drift, face", "colour drift, frame", "seam ratio", "mouth vs speech", "mouth in silence",
                  "blink rate", "head motion", "identity similarity", "proxy"):
        assert label in done.stdout, label
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(js.read_text())
    assert data["video"]["frames"] == json.loads(report.read_text())["frames"] == 50
    kinds = {b["kind"] for b in data["seams"]["boundaries"]}
    assert kinds == {"seam", "edge"} and data["seams"]["transition_frames"] == 4
    assert data["reference"] == "reference image" and -1 <= data["mouth"]["correlation"] <= 1


def test_inspect_cli_without_report_and_bad_input(small_render, tmp_path):
    out, _, _ = small_render
    done = cli("inspect", out)
    assert done.returncode == 0, done.stderr
    assert "needs the render's report" in done.stdout
    missing = cli("inspect", tmp_path / "nope.mp4")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().startswith("Error:") and "nope.mp4" in missing.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    done = cli("inspect", out, "--report", bad)
    assert done.returncode == 1 and "chunk plan" in done.stderr


def test_without_a_face_no_blink_rate_is_made_up(tmp_path):
    """No face found: the eyes' places are a guess, and what flickers there is not a blink (a small render read
    120 blinks a minute so)."""
    rng = np.random.default_rng(0)
    frames = (np.full((96, 96, 3), 110, np.uint8) + rng.integers(0, 30, (96, 96, 3), dtype=np.uint8) for _ in range(50))
    result = inspect_video(write_video(tmp_path / "noface.mp4", frames))
    assert not result.face_found
    assert {m: (v, d) for m, v, d in summary_rows(result)}["blink rate"][0] == "n/a"


def test_inspect_of_a_still_image_says_nothing_but_its_table(face_png):
    """A still picture is a video of one frame: no blink noise to read from frame to frame, and no warning of
    numpy's printed for it."""
    done = cli("inspect", face_png)
    assert done.returncode == 0, done.stderr
    assert "1 frames at 25 fps" in done.stdout and done.stderr == "", done.stderr


def test_face_sharpness_falls_with_blur_and_is_relative_to_the_reference(tmp_path):
    sharp = face_frame()
    soft = cv2.GaussianBlur(sharp, (0, 0), 2.0)
    got = {}
    for name, frame in (("sharp", sharp), ("soft", soft)):
        video = write_video(tmp_path / f"{name}.mp4", (frame for _ in range(25)))
        got[name] = inspect_video(video, face_box=FACE).sharpness
    assert got["soft"].face.mean < 0.3 * got["sharp"].face.mean
    # Without a reference image the first frame is the reference: a still video is as sharp as itself.
    assert (got["sharp"].relative == pytest.approx(1.0, abs=0.05)
            and got["soft"].relative == pytest.approx(1.0, abs=0.05))
    blurred_in_time = write_video(tmp_path / "later.mp4", (sharp if i < 13 else soft for i in range(25)))
    result = inspect_video(blurred_in_time, face_box=FACE).sharpness
    assert result.relative < 0.7 and result.face.per_second[0] < result.reference


@pytest.mark.skipif(find_model() is None, reason="needs the face landmark model (scripts/fetch_face_model.py)")
def test_the_mouth_of_a_real_render_is_read_from_its_lips(tmp_path, face_png):
    """With the landmark model, the mouth is the inner-lip opening found in each frame: on 8 s of the example's
    speech it follows the speech (measured: r 0.64; motion in the mouth box read 0.51 on the whole example)."""
    import wave

    with wave.open(str(face_png.parent / "talk.wav")) as src:
        params, data = src.getparams(), src.readframes(8 * src.getframerate())
    with wave.open(str(tmp_path / "talk.wav"), "wb") as out:
        out.setparams(params)
        out.writeframes(data)
    cfg = load_config(None, ("video.width=192", "video.height=192"))
    render(RenderRequest(reference=face_png, audio=tmp_path / "talk.wav", output=tmp_path / "o.mp4", config=cfg))
    result = inspect_video(tmp_path / "o.mp4", reference=face_png, audio=tmp_path / "talk.wav")
    assert result.mouth.measure == LIPS and result.series.mouth_is_lips
    assert result.mouth.correlation > 0.45 and abs(result.mouth.best_lag_frames) <= 2
    assert 0 < np.nanmedian(result.series.mouth) < 0.5  # eye distances
    row = dict((m, d) for m, _, d in summary_rows(result))["mouth vs speech"]
    assert row.startswith("correlation of the mouth (inner-lip opening from face landmarks) with speech level")


@pytest.mark.skipif(find_model() is None, reason="needs the face landmark model (scripts/fetch_face_model.py)")
def test_inspect_measures_the_face_the_render_chose(tmp_path, face_png):
    """A reference with two faces rendered with ``face.index=2``: the render's report tells ``inspect`` which face,
    and the reference is fitted around that one, as the render fitted it (it took the larger one before)."""
    from avatar_render.metrics.inspect import _landmarks_here
    from avatar_render.metrics.regions import fitted_reference

    face = cv2.imread(str(face_png))
    two = np.full((512, 1100, 3), 128, np.uint8)
    two[:, :512] = face
    two[64:448, 640:1024] = cv2.resize(face, (384, 384), interpolation=cv2.INTER_AREA)
    ref = tmp_path / "two.png"
    cv2.imwrite(str(ref), two)
    speech = write_audio(tmp_path / "talk.wav", speech_like(1.0, 16000), 16000)
    cfg = load_config(None, ("video.width=128", "video.height=128", "face.index=2"))
    out, report = tmp_path / "out.mp4", tmp_path / "report.json"
    render(RenderRequest(reference=ref, audio=speech, output=out, config=cfg, report=report))
    with av.open(str(out)) as c:
        first = next(c.decode(video=0)).to_ndarray(format="rgb24").astype(np.float32)

    def off(reference) -> float:  # the render's first frame (the head barely moved) against a fitted reference
        return float(np.abs(first - reference.image.astype(np.float32)).mean())

    chosen, largest = fitted_reference(ref, 128, 128, face_index=2), fitted_reference(ref, 128, 128)
    assert chosen.layout.face.x > largest.layout.face.x
    assert off(chosen) < 6 and off(largest) > 3 * off(chosen)
    assert _landmarks_here("/no/such/model.tflite") == "auto" and _landmarks_here(None) == "auto"
    measured = inspect_video(out, report=report, reference=ref, audio=speech).colour.frame.mean  # (ΔE00 to the ref)
    untold = json.loads(report.read_text())
    untold["config"]["face"]["index"] = None  # as inspect read every report before
    (tmp_path / "untold.json").write_text(json.dumps(untold))
    wrong = inspect_video(out, report=tmp_path / "untold.json", reference=ref, audio=speech).colour.frame.mean
    assert measured < 1.5 and wrong > 3  # (measured: 0.37 against 5.95, the frame compared with the wrong crop)
