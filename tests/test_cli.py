"""The command line as a user meets it: exit codes, one-sentence errors, no tracebacks, files untouched."""

import json
from pathlib import Path

import pytest

from tests.cli_util import cli
from tests.media import speech_like, write_audio, write_video_without_audio


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("speech")
    return write_audio(d / "talk.wav", speech_like(1.2, 16000), 16000)


def assert_one_sentence_error(done, *, contains: str):
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    assert contains.lower() in lines[0].lower(), lines[0]


def test_render_writes_mp4_and_report(tmp_path, face_png, speech):
    out, report = tmp_path / "o.mp4", tmp_path / "r.json"
    done = cli("render", "--ref", face_png, "--audio", speech, "-o", out, "--report", report, "video.width=96",
               "video.height=96", "--seed", "3")
    assert done.returncode == 0, done.stderr
    assert "Wrote" in done.stdout and "first frame" in done.stdout and "peak memory" in done.stdout
    rep = json.loads(report.read_text())
    assert rep["frames"] == 30 and rep["config"]["seed"] == 3 and rep["config"]["video"]["width"] == 96
    assert sum(c["end"] - c["start"] for c in rep["chunks"]) == 30



def test_the_old_live_gop_option_sets_the_one_keyframe_knob_and_says_so(tmp_path, face_png, speech):
    """--live-gop and video.gop_seconds were two knobs for one keyframe interval: the old option is now a
    hidden alias of the config key (a warning names the key), and an unset key gives a file 10 s GOPs."""
    out, report = tmp_path / "o.mp4", tmp_path / "r.json"
    done = cli("render", "--ref", face_png, "--audio", speech, "-o", out, "--report", report, "video.width=96",
               "video.height=96", "--live-gop", "0.5")
    assert done.returncode == 0, done.stderr
    assert "pass video.gop_seconds=0.5 instead" in " ".join(done.stderr.split())
    assert json.loads(report.read_text())["config"]["video"]["gop_seconds"] == 0.5
    assert "--live-gop" not in cli("render", "--help").stdout


def test_version():
    from importlib.metadata import version

    done = cli("--version")
    assert done.returncode == 0 and done.stdout == f"avatar-render {version('avatar-render')}\n", done.stdout


@pytest.mark.slow
def test_bad_inputs(tmp_path, face_png, speech):
    text_png = tmp_path / "notes.png"
    text_png.write_text("not an image")
    empty = write_audio(tmp_path / "empty.wav", speech_like(0.5, 16000)[:, :0], 16000)
    garbage = tmp_path / "noise.mp3"
    garbage.write_bytes(bytes(range(256)) * 40)
    silent_video = write_video_without_audio(tmp_path / "silent.mp4", 1.0)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [
        (("--ref", text_png, "--audio", speech, "-o", tmp_path / "a.mp4"), "notes.png"),
        (("--ref", face_png, "--audio", empty, "-o", tmp_path / "b.mp4"), "no audio samples"),
        (("--ref", face_png, "--audio", garbage, "-o", tmp_path / "c.mp4"), "noise.mp3"),
        (("--ref", face_png, "--audio", silent_video, "-o", tmp_path / "d.mp4"), "no audio track"),
        (("--ref", face_png, "--audio", tmp_path / "missing.wav", "-o", tmp_path / "e.mp4"), "missing.wav"),
        (("--ref", face_png, "--audio", speech, "-o", blocker / "f.mp4"), "file"),
        (("--ref", face_png, "--audio", speech, "-o", tmp_path / "g.avi"), ".mp4"),
        (("--ref", face_png, "--audio", speech, "-o", tmp_path), "folder"),
        (("--ref", face_png, "--audio", speech, "-o", tmp_path / "h.mp4", "preview.fsp=3"), "preview.fsp"),
        (("--ref", face_png, "--audio", speech, "-o", tmp_path / "i.mp4", "video.width=wide"), "video.width"),
        (("--ref", face_png, "--audio", speech, "-o", tmp_path / "j.mp4", "preview.fps=0"), "preview.fps"),
        (("--ref", face_png, "--audio", speech, "-o", tmp_path / "k.mp4", "-c", tmp_path / "none.yaml"), "none.yaml"),
    ]
    for args, contains in cases:
        assert_one_sentence_error(cli("render", *args), contains=contains)
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == sorted(["notes.png", "empty.wav", "noise.mp3", "silent.mp4", "file"]), leftovers


def test_existing_output_needs_force(tmp_path, face_png, speech):
    out = tmp_path / "keep.mp4"
    out.write_bytes(b"my old video")
    assert_one_sentence_error(cli("render", "--ref", face_png, "--audio", speech, "-o", out), contains="--force")
    assert out.read_bytes() == b"my old video"


@pytest.mark.slow
def test_doctor_lists_codecs_and_backends():
    done = cli("doctor")
    assert done.returncode == 0, done.stderr
    for word in ("libx264", "aac", "preview", "cpu"):
        assert word in done.stdout
