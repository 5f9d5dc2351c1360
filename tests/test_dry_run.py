"""--dry-run: every check before the first frame, the plan printed, nothing written."""

import json
from pathlib import Path

import pytest

from tests.cli_util import cli
from tests.folders import snapshot
from tests.media import speech_like, write_audio

SMALL = ("video.width=96", "video.height=96")


@pytest.fixture
def d(tmp_path: Path, face_png: Path) -> Path:
    (tmp_path / "face.png").write_bytes(face_png.read_bytes())
    write_audio(tmp_path / "talk.wav", speech_like(3.0, 16000), 16000)
    return tmp_path


def test_render_dry_run_prints_the_plan_and_writes_nothing(d):
    before = snapshot(d, mtimes=True)
    done = cli("render", "--ref", d / "face.png", "--audio", d / "talk.wav", "-o", d / "out.mp4", "--report",
               d / "r.json", "--dry-run", *SMALL, "chunk.chunk_frames=20", "chunk.transition_frames=4")
    assert done.returncode == 0, done.stderr
    rows = dict(line.split(":", 1) for line in done.stdout.splitlines()[:-1])
    assert rows["frames"].strip() == "75 (3.00 s at 25 fps, 96x96)"
    assert rows["chunks"].strip().startswith("4 N + 3 I: 20 frames each, 4 frames regenerated over each seam; "
                                             "order N0, N1, I0, N2, I1, N3, ...")
    assert rows["backend"].strip().startswith("preview") and rows["face"].strip().startswith("1 face, ")
    assert "MB resident" in rows["memory"] and rows["face model"].strip()
    assert rows["writes"].strip() == f"'{d / 'out.mp4'}', '{d / 'r.json'}'"
    assert done.stdout.splitlines()[-1] == "Dry run: nothing was written."
    assert snapshot(d, mtimes=True) == before


def test_render_dry_run_refuses_what_the_render_would_in_the_same_sentence(d):
    before = snapshot(d, mtimes=True)
    for extra, words in ((("-o", d / "missing" / "o.mp4"), "does not exist (create it first)"),
                         (("-o", d / "o.mp4", "--report", d / "talk.wav"), "is the audio file"),
                         (("-o", d / "o.mp4", "face.index=2"), "face.index=2 asks for the face 2nd from the left")):
        done = cli("render", "--ref", d / "face.png", "--audio", d / "talk.wav", "--dry-run", *extra, *SMALL)
        assert done.returncode == 1 and words in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert snapshot(d, mtimes=True) == before


def test_render_dry_run_as_json(d):
    done = cli("render", "--ref", d / "face.png", "--audio", d / "talk.wav", "-o", d / "out.mp4", "--dry-run",
               "--progress", "json", *SMALL)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["event"] == "plan" and plan["frames"] == 75 and plan["resume_from"] is None


def test_batch_dry_run_says_what_each_job_would_do_and_writes_nothing(d):
    jobs = d / "jobs"
    jobs.mkdir()
    (jobs / "a.wav").write_bytes((d / "talk.wav").read_bytes())
    (jobs / "b.wav").write_text("not audio")
    before = snapshot(d, mtimes=True)
    done = cli("batch", jobs, "--ref", d / "face.png", "--out", d / "out", "--dry-run", "--progress", "json", *SMALL)
    assert done.returncode == 1, done.stderr  # a job would fail
    plans = {p["name"]: p for p in map(json.loads, done.stdout.splitlines())}
    assert plans["a"]["action"] == "render" and plans["a"]["frames"] == 75
    assert plans["b"]["action"] == "fail" and "is not a readable audio" in plans["b"]["reason"]
    assert snapshot(d, mtimes=True) == before  # not even the output folder


def test_batch_dry_run_lists_the_files_no_job_takes(d):
    """As the real run warns of each file of the folder left without a partner, so does the dry run."""
    jobs = d / "jobs"
    jobs.mkdir()
    (jobs / "a.png").write_bytes((d / "face.png").read_bytes())
    (jobs / "a.wav").write_bytes((d / "talk.wav").read_bytes())
    (jobs / "orphan.wav").write_bytes((d / "talk.wav").read_bytes())
    (jobs / "lonely.png").write_bytes((d / "face.png").read_bytes())
    done = cli("batch", jobs, "--out", d / "out", "--dry-run", "--progress", "json", *SMALL)
    assert done.returncode == 0, done.stderr
    plans = {p["name"]: p for p in map(json.loads, done.stdout.splitlines())}
    assert plans["a"]["action"] == "render"
    assert plans["orphan.wav"]["action"] == plans["lonely.png"]["action"] == "unused"
    assert "no partner of the same name" in plans["orphan.wav"]["reason"]
    text = cli("batch", jobs, "--out", d / "out", "--dry-run", *SMALL)
    assert "1 of 1 jobs to render" in text.stdout and "orphan.wav" in text.stdout, text.stdout


def test_dry_runs_name_the_transcript_and_what_is_done_with_it(d):
    """--transcript (preview.transcript) in the render's plan: its words, a name the dictionary lacks; a batch
    folder's transcript of a job's stem in its plan; a missing one refused as the render would."""
    (d / "words.txt").write_text("Good morning, Zorbla, and welcome at 9.")
    before = snapshot(d, mtimes=True)
    done = cli("render", "--ref", d / "face.png", "--audio", d / "talk.wav", "-o", d / "out.mp4", "--dry-run",
               "--transcript", d / "words.txt", *SMALL)
    assert done.returncode == 0, done.stderr
    rows = dict(line.split(":", 1) for line in done.stdout.splitlines()[:-1])
    assert rows["words"].strip().startswith(f"'{d / 'words.txt'}': 7 words, aligned with the audio")
    assert "('zorbla'): their sounds are guessed from their letters" in rows["words"]
    done = cli("render", "--ref", d / "face.png", "--audio", d / "talk.wav", "-o", d / "out.mp4", "--dry-run",
               "--transcript", d / "none.txt", *SMALL)
    assert done.returncode == 1 and "The transcript file" in done.stderr and "was not found" in done.stderr
    jobs = d / "jobs"
    jobs.mkdir()
    (jobs / "a.wav").write_bytes((d / "talk.wav").read_bytes())
    (jobs / "a.srt").write_text("1\n00:00:00,000 --> 00:00:02,000\nGood morning.\n")
    (jobs / "b.wav").write_bytes((d / "talk.wav").read_bytes())
    inside = snapshot(d, mtimes=True)
    done = cli("batch", jobs, "--ref", d / "face.png", "--out", d / "out", "--dry-run", "--progress", "json", *SMALL)
    assert done.returncode == 0, done.stderr
    plans = {p["name"]: p for p in map(json.loads, done.stdout.splitlines())}
    assert plans["a"]["reason"] == "the words of 'a.srt'" and plans["b"]["reason"] == ""
    assert snapshot(d, mtimes=True) == inside and before.items() <= inside.items()
