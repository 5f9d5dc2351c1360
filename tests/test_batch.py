"""Batch: folders and manifests, the ledger (skip what is done, resume what was killed, go on past
failures), the summary, shards, and Ctrl-C; each run is a real `avatar-render batch` process."""

from __future__ import annotations

import os
import re
import shutil
import signal
from pathlib import Path

import av
import pytest

from avatar_render.batch import BatchRequest, Shard, plan_batch
from avatar_render.batch.shard import parse_shard, slurm_shard
from avatar_render.batch.sources import pair_folder
from avatar_render.config import load_config
from avatar_render.errors import AvatarRenderError
from tests.batch_util import (
    ROOT,
    SMALL,
    batch,
    by_name,
    chunk_hashes,
    make_jobs,
    report_of,
    start_batch,
    state,
    summary,
    wait_for_commit,
)
from tests.media import speech_like, write_audio

GOOD = ["anna", "ben", "chloe", "dev"]


def frames_of(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def one_sentence(text: str) -> bool:
    return bool(text) and "\n" not in text and "Traceback" not in text and text.rstrip().endswith(".")


@pytest.fixture(scope="module")
def six(tmp_path_factory, face_png):
    """A folder of six jobs, two of them broken (audio that is not audio, a reference that is not an
    image), one file without a partner; and the first batch run over it."""
    d = tmp_path_factory.mktemp("batch6")
    jobs = make_jobs(d / "jobs", face_png, GOOD)
    (jobs / "eve.png").write_bytes(face_png.read_bytes())
    (jobs / "eve.wav").write_bytes(b"RIFF, but not a wave file at all" * 20)
    (jobs / "finn.png").write_text("a text file, not an image")
    write_audio(jobs / "finn.wav", speech_like(1.0, 16000, seed=3), 16000)
    write_audio(jobs / "lonely.wav", speech_like(0.5, 16000, seed=4), 16000)
    first = batch(jobs, "--out", d / "out", "--jobs", "2", *SMALL, cwd=d)
    return d, first


@pytest.mark.slow
def test_six_jobs_two_broken(six):
    d, done = six
    out = d / "out"
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert sorted(p.name for p in out.glob("*.mp4")) == [f"{n}.mp4" for n in GOOD]
    assert all(frames_of(out / f"{n}.mp4") == 25 for n in GOOD)  # 1.0 s at 25 fps
    assert not list(out.glob("*.partial.mp4")) and not list(out.glob("*.journal"))
    assert "not paired, not rendered: lonely.wav" in done.stderr
    assert "Error: 2 of 6 jobs failed." in done.stderr
    record = summary(out)
    assert record["counts"] == {"done": 4, "resumed": 0, "skipped": 0, "failed": 2, "stopped": 0, "not run": 0}
    assert record["unpaired"] == [str(d / "jobs" / "lonely.wav")]
    jobs = by_name(record)
    assert set(jobs) == {*GOOD, "eve", "finn"}
    assert "eve.wav" in jobs["eve"]["reason"] and "finn.png" in jobs["finn"]["reason"]
    for name in ("eve", "finn"):
        assert jobs[name]["status"] == "failed" and one_sentence(jobs[name]["reason"]), jobs[name]
        assert f"Warning: {name}: failed ({jobs[name]['reason']})" in done.stderr
    for name in GOOD:
        job = jobs[name]
        assert job["status"] == "done" and job["frames"] == 25 and job["duration_s"] == pytest.approx(1.0, abs=0.03)
        assert job["generated_fps"] > 0 and job["wall_s"] > 0
        assert report_of(out, job)["frames"] == 25  # each job's own render report
        assert (out / job["thumbnail"]).stat().st_size > 500
    page = (out / "batch-summary.html").read_text()
    assert len(re.findall(r'<img src="\.batch/thumbs/[^"]+\.jpg"', page)) == 4
    assert all(f'href="{n}.mp4"' in page for n in GOOD) and page.count(">failed<") == 2


@pytest.mark.slow
def test_second_run_skips_the_done_jobs_and_touches_none(six):
    d, _ = six
    out = d / "out"
    before = {n: state(out / f"{n}.mp4") for n in GOOD}
    first = by_name(summary(out))
    again = batch(d / "jobs", "--out", out, "--jobs", "2", *SMALL, cwd=d)
    assert again.returncode == 1  # the broken two still fail
    assert {n: state(out / f"{n}.mp4") for n in GOOD} == before  # bytes and modification times
    record = summary(out)
    assert record["counts"]["skipped"] == 4 and record["counts"]["failed"] == 2 and record["counts"]["done"] == 0
    for n in GOOD:  # the figures of the run that rendered it, marked as such
        job, rendered = by_name(record)[n], first[n]
        assert job["status"] == "skipped" and job["figures_from"] and not rendered["figures_from"]
        assert {k: job[k] for k in ("frames", "duration_s", "generated_fps", "wall_s")} == \
            {k: rendered[k] for k in ("frames", "duration_s", "generated_fps", "wall_s")}
    page = (out / "batch-summary.html").read_text()
    assert page.count("not rendered again: the figures are from the run that ended") == 4
    assert f'<td class="num">{first["anna"]["generated_fps"]:.1f}</td>' in page


@pytest.mark.slow
def test_other_config_refuses_then_force_renders_again(six, tmp_path):
    d, _ = six
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    for name in ("eve", "finn"):
        (d / "jobs" / f"{name}.wav").rename(tmp_path / f"{name}.wav")  # only the good four this time
    try:
        before = state(out / "anna.mp4")
        other = batch(d / "jobs", "--out", out, *SMALL, "preview.head_motion=0", cwd=d)
        assert other.returncode == 1 and state(out / "anna.mp4") == before  # never replaced unasked
        assert by_name(summary(out))["anna"]["reason"] == (
            "'anna.mp4' was rendered from other inputs or another config; pass --force to render it again."
        )
        forced = batch(d / "jobs", "--out", out, "--jobs", "2", "--force", *SMALL, "preview.head_motion=0", cwd=d)
        assert forced.returncode == 0, forced.stderr
        assert summary(out)["counts"]["done"] == 4 and state(out / "anna.mp4") != before
    finally:
        for name in ("eve", "finn"):
            (tmp_path / f"{name}.wav").rename(d / "jobs" / f"{name}.wav")


@pytest.mark.slow
def test_killed_job_is_resumed_by_the_next_run(tmp_path, face_png):
    """SIGKILL of the process rendering one job: the batch reports it and goes on with the other; the
    next run resumes it from its journal, and its frames are those of an uninterrupted render."""
    jobs = make_jobs(tmp_path / "jobs", face_png, ["long", "short"], seconds=3.0)
    reference = batch(jobs, "--out", tmp_path / "ref", *SMALL, cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr
    out = tmp_path / "out"
    run = start_batch(jobs, "--out", out, "--jobs", "2", *SMALL, cwd=tmp_path, AVATAR_TEST_CHUNK_DELAY="0.3")
    try:
        os.kill(wait_for_commit(out / "long.mp4", proc=run), signal.SIGKILL)
        _, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 1, stderr
    first = by_name(summary(out))
    assert first["long"]["status"] == "failed" and "killed (SIGKILL)" in first["long"]["reason"]
    assert first["short"]["status"] == "done"  # the other job was not taken down
    assert (out / "long.partial.mp4").exists() and not (out / "long.mp4").exists()
    again = batch(jobs, "--out", out, *SMALL, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    second = by_name(summary(out))
    assert second["short"]["status"] == "skipped"
    assert second["long"]["status"] == "resumed" and second["long"]["resumed_frames"] > 0
    want = by_name(summary(tmp_path / "ref"))["long"]
    assert chunk_hashes(report_of(out, second["long"])) == chunk_hashes(report_of(tmp_path / "ref", want))
    assert frames_of(out / "long.mp4") == 75 and not (out / "long.partial.mp4").exists()


@pytest.mark.slow
def test_ctrl_c_stops_after_the_current_chunk_and_the_next_run_resumes(tmp_path, face_png):
    jobs = make_jobs(tmp_path / "jobs", face_png, ["a", "b", "c"], seconds=2.0)
    out = tmp_path / "out"
    run = start_batch(jobs, "--out", out, "--jobs", "1", *SMALL, cwd=tmp_path, AVATAR_TEST_CHUNK_DELAY="0.2")
    try:
        wait_for_commit(out / "a.mp4", proc=run)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 130, stderr
    assert "Traceback" not in stderr and "stopping the running jobs at their next keyframe" in stderr
    first = by_name(summary(out))
    assert first["a"]["status"] == "stopped" and (out / "a.partial.mp4").exists()
    assert first["b"]["status"] == first["c"]["status"] == "not run"
    again = batch(jobs, "--out", out, *SMALL, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    second = by_name(summary(out))
    assert second["a"]["status"] == "resumed" and second["b"]["status"] == second["c"]["status"] == "done"


# -- manifests --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def media(tmp_path_factory, face_png):
    d = tmp_path_factory.mktemp("manifest")
    (d / "in").mkdir()
    shutil.copy(face_png, d / "in" / "face.png")
    write_audio(d / "in" / "talk.wav", speech_like(0.6, 16000, seed=5), 16000)
    write_audio(d / "in" / "other.wav", speech_like(0.6, 16000, seed=6), 16000)
    return d


@pytest.mark.slow
def test_manifest_rows_with_overrides_and_prompts(media):
    (media / "jobs.csv").write_text(
        "ref,audio,output,overrides,prompt\n"
        "in/face.png,in/talk.wav,en/intro.mp4,,\n"
        'in/face.png,in/other.wav,,video.width=96 video.height=80 seed=4,"A calm voice, clearly: hello"\n'
    )
    done = batch(media / "jobs.csv", "--out", media / "out", *SMALL, cwd=media)
    assert done.returncode == 0, done.stderr
    jobs = by_name(summary(media / "out"))
    assert set(jobs) == {"en/intro", "other"}
    intro, other = report_of(media / "out", jobs["en/intro"]), report_of(media / "out", jobs["other"])
    assert (intro["width"], intro["height"]) == (64, 64) and (other["width"], other["height"]) == (96, 80)
    assert other["config"]["seed"] == 4 and other["config"]["model"]["prompt"] == "A calm voice, clearly: hello"
    assert (media / "out" / "en" / "intro.mp4").is_file() and (media / "out" / "other.mp4").is_file()
    assert jobs["other"]["origin"] == "jobs.csv line 3"


@pytest.mark.parametrize(
    "name, text, message",
    [
        (
            "bad.csv",
            "ref,audio\nin/face.png,in/talk.wav\nin/face.png,in/talk.wav,extra\n",
            "bad.csv line 3: more cells",
        ),
        (
            "bad.csv",
            "ref,audio\nin/face.png,in/talk.wav\nin/face.png,in/missing.wav\n",
            "bad.csv line 3: the audio 'in/missing.wav' does not exist",
        ),
        (
            "bad.csv",
            "ref,audio,overrides\nin/face.png,in/talk.wav,\nin/face.png,in/other.wav,video.wide=3\n",
            "bad.csv line 3: Unknown config key 'video.wide'",
        ),
        (
            "bad.csv",
            "ref,sound\nin/face.png,in/talk.wav\n",
            "bad.csv line 1: the header must name the columns ref and audio",
        ),
        (
            "bad.csv",
            "ref,audio,output\nin/face.png,in/talk.wav,a.mp4\nin/face.png,in/other.wav,a.mp4\n",
            "bad.csv line 3: its output 'a.mp4' is already written by the job of bad.csv line 2",
        ),
        (
            "bad.csv",
            "ref,audio,output\nin/face.png,in/talk.wav,en/grace.mp4\nin/face.png,in/other.wav,en/grace.mp4\n",
            "bad.csv line 3: its output 'en/grace.mp4' is already written by the job of bad.csv line 2",
        ),
        (
            "bad.csv",
            "ref,audio,output\nin/face.png,in/talk.wav,a.avi\n",
            "bad.csv line 2: the output 'a.avi' must be a file name ending in .mp4",
        ),
        (
            "bad.jsonl",
            '{"ref": "in/face.png", "audio": "in/talk.wav"}\n\n{"ref": "in/face.png", "audio": \n',
            "bad.jsonl line 3: not valid JSON",
        ),
        (
            "bad.jsonl",
            '{"ref": "in/face.png", "audio": "in/talk.wav", "overides": ["seed=1"]}\n',
            "bad.jsonl line 1: unknown key 'overides'",
        ),
        (
            "bad.jsonl",
            '{"ref": "in/face.png", "audio": "in/talk.wav", "overrides": ["seed"]}\n',
            "bad.jsonl line 1: the override 'seed' is not of the form key=value",
        ),
        (
            "bad.csv",
            "ref,audio,transcript\nin/face.png,in/talk.wav,\nin/face.png,in/other.wav,in/other.txt\n",
            "bad.csv line 3: the transcript 'in/other.txt' does not exist",
        ),
    ],
)
def test_bad_manifest_row_is_refused_with_its_line_before_anything_runs(media, name, text, message):
    (media / name).write_text(text)
    out = media / f"out-{abs(hash(text))}"
    done = batch(media / name, "--out", out, *SMALL, cwd=media)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {message}"), done.stderr
    assert not out.exists() or not any(out.rglob("*.mp4"))  # nothing ran


def test_a_manifests_transcript_column_is_resolved_as_its_inputs_and_comes_before_the_rows_overrides(media, tmp_path):
    (media / "in" / "talk.txt").write_text("Good morning.")
    (media / "words.csv").write_text("ref,audio,output,transcript,overrides\n"
                                     "in/face.png,in/talk.wav,a.mp4,in/talk.txt,seed=2\n"
                                     "in/face.png,in/other.wav,b.mp4,,\n")
    plan = plan_batch(BatchRequest(source=media / "words.csv", out=tmp_path, overrides=SMALL))
    a, b = plan.jobs
    assert a.overrides == (f'preview.transcript="{(media / "in" / "talk.txt").resolve()}"', "seed=2")
    assert b.overrides == ()


def test_jsonl_manifest_takes_overrides_as_a_mapping(media, tmp_path):
    (media / "jobs.jsonl").write_text(
        '{"ref": "in/face.png", "audio": "in/talk.wav", "output": "x.mp4", '
        '"overrides": {"video.width": 48, "face.box": [10, 10, 100, 100]}}\n'
    )
    plan = plan_batch(BatchRequest(source=media / "jobs.jsonl", out=tmp_path, overrides=SMALL))
    (job,) = plan.jobs
    assert (
        job.overrides == ("video.width=48", "face.box=[10, 10, 100, 100]")
        and job.output == (tmp_path / "x.mp4").resolve()
    )
    assert job.reference == (media / "in" / "face.png").resolve() and plan.decisions[job.key].action == "render"


# -- folders ------------------------------------------------------------------------------------------


def test_folder_pairs_by_stem_and_lists_the_rest(tmp_path, face_png):
    d = tmp_path / "f"
    make_jobs(d, face_png, ["a", "b"], seconds=0.2)
    shutil.copy(face_png, d / "b.jpg")  # two references for b: ambiguous, not guessed
    shutil.copy(face_png, d / "c.png")  # no audio
    (d / "notes.txt").write_text("ignored")
    listed = pair_folder(d, out_dir=tmp_path / "out")
    assert [j.name for j in listed.jobs] == ["a"] and listed.jobs[0].output == (tmp_path / "out" / "a.mp4").resolve()
    assert sorted(p.name for p in listed.unpaired) == ["b.jpg", "b.png", "b.wav", "c.png"]
    one_ref = pair_folder(d, out_dir=tmp_path / "out", ref=face_png)
    assert [(j.name, j.reference) for j in one_ref.jobs] == [("a", face_png), ("b", face_png)]
    with pytest.raises(AvatarRenderError, match="other than the source folder"):
        pair_folder(d, out_dir=d)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AvatarRenderError, match="holds no job"):
        pair_folder(tmp_path / "empty", out_dir=tmp_path / "out")


def test_a_folders_transcript_of_a_jobs_stem_is_its_preview_transcript_and_counts_as_an_input(tmp_path, face_png):
    """anna.png + anna.wav + anna.txt (or .srt, .vtt): the words of anna's speech; two for one job are listed
    and neither used; a text file of no job's stem is left alone. The ledger takes the words' content as it takes
    the inputs': edited, the job is not skipped as done."""
    d = tmp_path / "f"
    make_jobs(d, face_png, ["a", "b", "it's"], seconds=0.2)
    (d / "a.txt").write_text("Good morning.")
    (d / "b.srt").write_text("1\n00:00:00,000 --> 00:00:01,000\nGood morning.\n")
    (d / "b.vtt").write_text("WEBVTT\n\n00:00.000 --> 00:01.000\nGood morning.\n")
    (d / "it's.txt").write_text("Good morning.")  # (a quote in the path: the override is quoted for YAML)
    (d / "notes.txt").write_text("not a job's")
    listed = pair_folder(d, out_dir=tmp_path / "out")
    jobs = {j.name: j for j in listed.jobs}
    assert jobs["a"].overrides == (f'preview.transcript="{(d / "a.txt").resolve()}"',) and jobs["b"].overrides == ()
    assert sorted(p.name for p in listed.unpaired) == ["b.srt", "b.vtt"]
    cfg = load_config(None, jobs["it's"].overrides)
    assert cfg.preview.transcript == str((d / "it's.txt").resolve())
    request = BatchRequest(source=d, out=tmp_path / "out", overrides=SMALL)
    before = plan_batch(request).identities[jobs["a"].key]["identity"]
    assert plan_batch(request).identities[jobs["a"].key]["identity"] == before
    (d / "a.txt").write_text("Good evening.")
    assert plan_batch(request).identities[jobs["a"].key]["identity"] != before


# -- shards -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_shards_are_disjoint_and_cover_the_manifest(tmp_path):
    media = tmp_path / "m"
    (media / "in").mkdir(parents=True)
    for name in ("face.png", "talk.wav", "other.wav"):  # planning reads (hashes) the inputs but decodes nothing
        (media / "in" / name).write_bytes(name.encode())
    rows = [f"in/face.png,in/{'talk' if i % 2 else 'other'}.wav,clip{i:02d}.mp4" for i in range(23)]
    (media / "many.csv").write_text("ref,audio,output\n" + "\n".join(rows) + "\n")
    everything = [j.output for j in plan_batch(BatchRequest(source=media / "many.csv", out=tmp_path)).jobs]
    assert len(everything) == 23
    for n in range(1, 8):
        parts = [
            [
                j.output
                for j in plan_batch(BatchRequest(source=media / "many.csv", out=tmp_path, shard=Shard(i, n))).jobs
            ]
            for i in range(n)
        ]
        assert sorted(sum(parts, [])) == sorted(everything)  # covering, and no job twice
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        again = [
            [
                j.output
                for j in plan_batch(BatchRequest(source=media / "many.csv", out=tmp_path, shard=Shard(i, n))).jobs
            ]
            for i in range(n)
        ]
        assert again == parts  # deterministic
    assert parse_shard("2/5") == Shard(2, 5)
    for bad in ("5/5", "1", "a/b", "-1/3"):
        with pytest.raises(AvatarRenderError, match="--shard"):
            parse_shard(bad)
    assert slurm_shard(
        {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "3"}
    ) == Shard(2, 4)
    assert slurm_shard({}) is None
    with pytest.raises(AvatarRenderError, match="consecutive"):
        slurm_shard({"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_COUNT": "4"})


@pytest.mark.slow
def test_each_job_under_torchrun_over_several_processes(tmp_path, face_png):
    """--procs-per-job 2: each job is one request across two processes (the GPU variant's path; here
    gloo on the CPU with the tiny diffusion model). The launcher leaves no log folder in the temp folder."""
    jobs = make_jobs(tmp_path / "jobs", face_png, ["t"], seconds=0.6)
    temp = tmp_path / "temp"
    temp.mkdir()
    done = batch(
        jobs, "--out", tmp_path / "out", "-c", ROOT / "configs" / "tiny.yaml", "--procs-per-job", "2", cwd=tmp_path,
        TMPDIR=str(temp),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = summary(tmp_path / "out")["jobs"]
    assert job["status"] == "done" and job["processes"] == 2 and frames_of(tmp_path / "out" / "t.mp4") == 15
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor_")] == []  # (torch's own cache)


def test_the_batch_line_counts_a_stopped_job_as_not_finished(tmp_path):
    """After a Ctrl-C the jobs stopped before their end are not finished: one done of three reads 1/3, its frames
    against every job's (it read 3/3, 100 %)."""
    from rich.console import Console

    from avatar_render.batch.events import JobFinished, Planned
    from avatar_render.batch.jobs import Job, Outcome
    from avatar_render.batch.view import BatchView

    jobs = tuple(Job(n, tmp_path / "a.png", tmp_path / f"{n}.wav", tmp_path / f"{n}.mp4") for n in "abc")
    with BatchView(Console(file=open(os.devnull, "w")), warn=lambda t: None, info=lambda t: None, live=False) as view:
        view.on_event(Planned(to_run=jobs, skipped=(), refused=(), unpaired=(), workers=1, where="this machine",
                              frames_expected=(100, 100, 100)))
        view.on_event(JobFinished(Outcome(jobs[0], "done", frames=100)))
        for job in jobs[1:]:
            view.on_event(JobFinished(Outcome(job, "stopped", reason="stopped at a keyframe", frames=20)))
        figures = view.figures()
    assert (figures.jobs_done, figures.jobs_total) == (1, 3)
    assert figures.frames_total == 300 and figures.frames_done < 300
