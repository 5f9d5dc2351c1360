"""Progress where no terminal shows a bar (a pipe, a CI log): plain lines and JSON lines."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from avatar_render.progress import Figures, Ticker
from tests.cli_util import cli
from tests.media import speech_like, write_audio

SMALL = ("video.width=96", "video.height=96", "chunk.chunk_frames=8", "chunk.transition_frames=0")


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("speech")
    return write_audio(d / "talk.wav", speech_like(1.2, 16000), 16000)


def figures(done: int, total: int = 30) -> Figures:
    return Figures("render", frames_done=done, frames_total=total, frames_this_run=done, elapsed_s=1.0, fps=25.0)


def test_a_line_when_the_interval_has_passed_and_always_the_first_and_the_last():
    now, sent = [0.0], []
    ticker = Ticker(sent.append, style="lines", every_s=5.0, clock_s=lambda: now[0])
    for t, done in ((0, 8), (1, 16), (6, 24), (7, 28)):
        now[0] = t
        ticker.update(figures(done))
    ticker.close()  # the held-back 28 frames
    shown = [line.split(", ")[0].removeprefix("render: ") for line in sent]
    assert shown == ["8/30 frames (27%)", "24/30 frames (80%)", "28/30 frames (93%)"]
    ticker.update(figures(30))  # finished: shown at once however soon
    assert "30/30 frames (100%)" in sent[-1] and "ETA 0:00:00" in sent[-1]
    assert figures(8).line() == "render: 8/30 frames (27%), 8.0 fps, 0.32x real time, ETA 0:00:03"


def test_a_piped_render_prints_progress_lines(tmp_path, face_png, speech):
    done = cli("render", "--ref", face_png, "--audio", speech, "-o", tmp_path / "o.mp4", "--progress-every", "0",
               *SMALL)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("render: ")]
    assert len(lines) == 4, done.stdout  # one per chunk at interval 0
    assert lines[0].startswith("render: chunk 1, 8/30 frames (27%), ") and "x real time, ETA " in lines[0]
    assert lines[-1].startswith("render: chunk 4, 30/30 frames (100%), ")
    assert done.stdout.splitlines()[-1].startswith("Wrote ")


def test_a_session_shows_frames_and_elapsed_time_without_a_total_or_an_eta(tmp_path, face_png, speech):
    session = Figures("render", frames_done=75, frames_total=None, frames_this_run=75, elapsed_s=61.0, fps=25.0,
                      open_duration=True)
    assert session.line() == "render: 75 frames, 1.2 fps, 0.05x real time, elapsed 0:01:01"
    assert session.record()["eta_s"] is None and session.record()["open_duration"] is True
    with open(speech, "rb") as stdin:  # the audio from a pipe: its length is not known until it ends
        done = subprocess.run([sys.executable, "-m", "avatar_render", "render", "--ref", str(face_png), "--audio", "-",
                               "-o", str(tmp_path / "o.mp4"), "--progress-every", "0", *SMALL],
                              stdin=stdin, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("render: ")]
    assert lines and all(" elapsed " in line and "ETA" not in line and "/" not in line for line in lines), lines
    assert lines[-1].startswith("render: chunk 4, 30 frames, ")


def test_json_progress_is_one_object_a_line_and_ends_with_the_figures(tmp_path, face_png, speech):
    done = cli("render", "--ref", face_png, "--audio", speech, "-o", tmp_path / "o.mp4", "--progress", "json", *SMALL)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]  # every line of stdout is JSON
    progress, last = records[:-1], records[-1]
    assert progress and all(r["event"] == "progress" and r["frames_total"] == 30 for r in progress)
    assert progress[-1]["frames_done"] == 30 and progress[-1]["chunks_done"] == 4
    assert [r["frames_done"] for r in progress] == sorted(r["frames_done"] for r in progress)
    assert last["event"] == "done" and last["frames"] == 30 and last["output"].endswith("o.mp4")
    assert "Wrote" not in done.stdout


def test_batch_progress_counts_frames_of_all_jobs_with_an_eta(tmp_path, face_png, speech):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    for name in ("a", "b"):
        (jobs / f"{name}.wav").write_bytes(speech.read_bytes())
    done = cli("batch", jobs, "--ref", face_png, "--out", tmp_path / "out", "-j", "1", "--progress", "json",
               "--progress-every", "0", *SMALL)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    progress = [r for r in records if r["event"] == "progress"]
    assert all(r["what"] == "batch" and r["frames_total"] == 60 and r["jobs_total"] == 2 for r in progress)
    assert progress[0]["jobs_done"] == 0 and progress[0]["eta_s"] is None
    assert any(r["eta_s"] is not None and 0 < r["frames_done"] < 60 for r in progress)
    assert progress[-1]["jobs_done"] == 2 and progress[-1]["frames_done"] == 60
    assert records[-1]["event"] == "done" and len(records[-1]["outcomes"]) == 2
