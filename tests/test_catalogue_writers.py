"""The third catalogue: the file rules on the surfaces added after the render's own outputs (HLS folders,
the watch server, batch manifests and ledgers, inspect, bench), each case run as a user would.

A refusal is exit 1 with one sentence (no traceback); in every case no file that was there before changes,
and nothing is written where the user did not ask for it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from avatar_render.batch.ledger import batch_dir
from avatar_render.cli import app
from avatar_render.io.live.server import WatchServer
from tests.folders import snapshot
from tests.media import speech_like, write_audio

ROOT = Path(__file__).resolve().parents[1]
TINY = ("video.width=48", "video.height=48", "chunk.chunk_frames=10", "chunk.transition_frames=4",
        "video.gop_seconds=0.4")


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def refused(result, words: str) -> str:
    text = result.stdout + result.stderr
    assert result.exit_code == 1, text
    assert "Traceback" not in text and "internal error" not in text, text
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and words in lines[0], result.stderr
    return lines[0]


@pytest.fixture()
def d(tmp_path, face_png):
    (tmp_path / "face.png").write_bytes(face_png.read_bytes())
    write_audio(tmp_path / "talk.wav", speech_like(0.8, 16000), 16000)
    (tmp_path / "hls").mkdir()
    return tmp_path


def render(d: Path, *args: str):
    return cli("render", "--ref", str(d / "face.png"), "--audio", str(d / "talk.wav"), *args, *TINY, "-q")


# -- HLS folders: only the render's own names, never over a file it did not write ------------------


@pytest.mark.parametrize("theirs", ["live-init.mp4", "live-000000000.m4s", "live-000000010.m4s"])
def test_hls_never_replaces_a_users_file_of_its_names(d, theirs):
    (d / "hls" / theirs).write_bytes(b"somebody's file")
    before = snapshot(d)
    refused(render(d, "-o", str(d / "out.mp4"), "--live", str(d / "hls" / "live.m3u8")), "is in the way")
    assert snapshot(d) == before


def test_hls_force_replaces_only_what_its_playlist_lists(d):
    playlist = d / "hls" / "live.m3u8"
    assert render(d, "--live", str(playlist)).exit_code == 0
    (d / "hls" / "live-000000999.m4s").write_bytes(b"not listed: somebody's")
    before = snapshot(d)
    refused(render(d, "--live", str(playlist), "--force"), "live-000000999.m4s' is in the way")
    assert snapshot(d) == before
    (d / "hls" / "live-000000999.m4s").unlink()
    assert render(d, "--live", str(playlist), "--force").exit_code == 0  # its own files: replaced


def test_hls_leaves_the_rest_of_its_folder_alone(d):
    others = {"notes.txt": b"mine", "other-init.mp4": b"another stream", "live.mp4": b"a video",
              "liveX-000000000.m4s": b"another stem", ".live-000000000.m4s.tmp": b"a hidden file"}
    for name, data in others.items():
        (d / "hls" / name).write_bytes(data)
    assert render(d, "--live", str(d / "hls" / "live.m3u8")).exit_code == 0
    for name, data in others.items():
        assert (d / "hls" / name).read_bytes() == data
    new = sorted(set(os.listdir(d / "hls")) - set(others))
    assert new[0] == "live-000000000.m4s" and new[-2:] == ["live-init.mp4", "live.m3u8"], new
    assert all(n.startswith("live-0") and n.endswith(".m4s") for n in new[:-2])


def test_hls_segment_names_are_checked_against_the_inputs(d):
    audio = d / "hls" / "live-000000000.m4s"
    write_audio(d / "speech.wav", speech_like(0.8, 16000), 16000)
    audio.write_bytes((d / "speech.wav").read_bytes())
    before = snapshot(d)
    result = cli("render", "--ref", str(d / "face.png"), "--audio", str(audio), "--live", str(d / "hls" / "live.m3u8"),
                 *TINY, "-q")
    refused(result, "is the audio file")
    assert snapshot(d) == before


# -- the watch server: only what the render wrote and listed ----------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""


def test_the_server_hands_out_only_the_names_the_render_listed(tmp_path):
    for name in ("live.m3u8", "live-init.mp4", "live-000000000.m4s", "live-000000050.m4s", "private.mp4",
                 "secret.m3u8"):
        (tmp_path / name).write_bytes(name.encode())
    listed: set[str] = set()
    server = WatchServer("127.0.0.1", 0, tmp_path, "live.m3u8", served=lambda: frozenset(listed))
    try:
        live = server.url + "live/"
        assert json.loads(_get(server.url + "status.json")[1])["playlist"] is False
        assert _get(live + "live.m3u8")[0] == 404  # there, but not written by the render yet
        listed |= {"live.m3u8", "live-init.mp4", "live-000000000.m4s"}
        assert json.loads(_get(server.url + "status.json")[1])["playlist"] is True
        for name in sorted(listed):
            assert _get(live + name) == (200, name.encode())
        for name in ("private.mp4", "secret.m3u8", "live-000000050.m4s", "..%2Fprivate.mp4"):
            assert _get(live + name)[0] == 404, name
    finally:
        server.close()


@pytest.mark.slow
def test_a_served_render_does_not_hand_out_the_users_files(d):
    (d / "hls" / "private.mp4").write_bytes(b"the user's own video")
    write_audio(d / "long.wav", speech_like(6.0, 16000), 16000)
    proc = subprocess.Popen([sys.executable, "-m", "avatar_render", "render", "--ref", str(d / "face.png"),
                             "--audio", str(d / "long.wav"), "--live", str(d / "hls" / "live.m3u8"), "--serve", "0",
                             "--serve-linger", "3", "-q", *TINY], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        url = proc.stdout.readline().split()[-1]
        while _get(url + "live/live.m3u8")[0] != 200:  # the render lists its first segment
            assert proc.poll() is None, proc.stdout.read()
        assert _get(url + "live/private.mp4")[0] == 404
        assert _get(url + "live/live-init.mp4")[0] == 200
    finally:
        assert proc.wait(timeout=120) == 0, proc.stdout.read()
    assert (d / "hls" / "private.mp4").read_bytes() == b"the user's own video"


# -- inspect and bench: never over their inputs, never over somebody's file -----------------------


@pytest.fixture(scope="module")
def video(tmp_path_factory, face_png) -> Path:
    folder = tmp_path_factory.mktemp("video")
    write_audio(folder / "talk.wav", speech_like(0.8, 16000), 16000)
    out = folder / "a.mp4"
    result = cli("render", "--ref", str(face_png), "--audio", str(folder / "talk.wav"), "-o", str(out), *TINY, "-q")
    assert result.exit_code == 0, result.stderr
    return out


@pytest.mark.parametrize("args, words", [
    (("--json", "{v}"), "is the video"),
    (("--plot", "{v}"), "is the video"),
    (("--json", "{d}/talk.wav", "--audio", "{d}/talk.wav"), "is the audio file"),
    (("--plot", "{d}/face.png", "--ref", "{d}/face.png"), "is the reference file"),
    (("--json", "{d}/m.json", "--plot", "{d}/m.json"), "is the JSON file, which is written too"),
    (("--json", "{d}/notes.json"), "was not written by avatar-render; pass --force"),
    (("--plot", "{d}/photo.png"), "was not written by avatar-render; pass --force"),
    (("--json", "{d}/nowhere/m.json"), "does not exist"),
])
def test_inspect_refuses_before_reading_a_frame(d, video, args, words):
    (d / "notes.json").write_text('{"mine": true}\n')
    (d / "photo.png").write_bytes((d / "face.png").read_bytes())
    (d / "a.mp4").write_bytes(video.read_bytes())
    before = snapshot(d)
    refused(cli("inspect", str(d / "a.mp4"), *(a.format(v=d / "a.mp4", d=d) for a in args)), words)
    assert snapshot(d) == before


@pytest.mark.parametrize("make, words", [
    (lambda p: p.write_bytes(b""), "is empty (0 bytes); give a video file"),
    (lambda p: p.mkdir(), "is a folder, not a regular file; give a video file"),
    (lambda p: os.mkfifo(p), "is a named pipe (FIFO), not a regular file; give a video file"),  # (never opened)
    (lambda p: None, "does not exist; check the path"),
])
def test_inspect_names_what_its_video_is(tmp_path, make, words):
    make(tmp_path / "v.mp4")
    before = sorted(os.listdir(tmp_path))  # (names only: a FIFO's content would block)
    refused(cli("inspect", str(tmp_path / "v.mp4")), f"The video '{tmp_path / 'v.mp4'}' {words}")
    assert sorted(os.listdir(tmp_path)) == before


def test_inspect_replaces_its_own_files_and_others_only_with_force(d, video):
    from avatar_render.files.targets import is_ours

    (d / "notes.json").write_text('{"mine": true}\n')
    json_path, plot = d / "m.json", d / "m.png"
    for _ in range(2):  # the second run replaces the first run's files without --force
        result = cli("inspect", str(video), "--json", str(json_path), "--plot", str(plot))
        assert result.exit_code == 0, result.stderr
        assert is_ours(json_path, "inspect") and is_ours(plot, "plot")
    assert json.loads(json_path.read_text())["video"]["frames"] == 20
    assert cli("inspect", str(video), "--json", str(d / "notes.json"), "--force").exit_code == 0
    assert is_ours(d / "notes.json", "inspect")


@pytest.mark.parametrize("durations, words", [("nan", "positive numbers of seconds up to 86400"),
                                              ("inf", "up to 86400"), ("1000000", "up to 86400"),
                                              ("-1", "positive"), ("1,nan", "positive")])
def test_bench_refuses_durations_before_writing_anything(d, durations, words):
    before = snapshot(d)
    refused(cli("bench", "--durations", durations, "--ref", str(d / "face.png"), "--speech", str(d / "talk.wav"),
                "--out", str(d / "results")), words)
    assert snapshot(d) == before


@pytest.mark.parametrize("args, words", [
    (("--json", "{d}/talk.wav"), "is the speech file"),
    (("--json", "{d}/face.png"), "is the reference file"),
    (("--json", "{d}/notes.json"), "was not written by avatar-render"),
    (("--out", "{d}/notes.json"), "is not a folder"),
    (("--out", "{d}/no/such/folder"), "nor does the folder"),
    (("--speech", "{d}/face.png"), "must be a non-empty 16-bit PCM WAV"),
])
def test_bench_refuses_before_its_first_render(d, args, words):
    (d / "notes.json").write_text('{"mine": true}\n')
    (d / "results").mkdir()
    before = snapshot(d)
    base = {"--ref": str(d / "face.png"), "--speech": str(d / "talk.wav"), "--out": str(d / "results")}
    given = [a.format(d=d) for a in args]
    rest = [x for k, v in base.items() if k not in given for x in (k, v)]
    refused(cli("bench", "--durations", "1", "--sizes", "48x48", *rest, *given), words)
    assert snapshot(d) == before


def test_bench_leaves_no_audio_behind_when_a_render_fails(d, monkeypatch):
    scratch = d / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    broken = d / "broken.png"  # (found a file by the checks before the first render; not an image to the render)
    broken.write_bytes(b"not a picture")
    result = cli("bench", "--durations", "1", "--sizes", "48x48", "--ref", str(broken), "--speech",
                 str(d / "talk.wav"), "--out", str(d / "results"))
    refused(result, "benchmark render failed")
    assert list(scratch.iterdir()) == []  # the looped speech and the video went with their temporary folder
    assert not (d / "results").exists()  # nor the folders it made for its results


# -- batch: manifests, outputs inside --out, the ledger, two batches at once -------------------------


def _manifest(d: Path, rows: list[str], name: str = "jobs.csv") -> Path:
    path = d / name
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture()
def jobs(d):
    src = d / "in"
    src.mkdir()
    (src / "a.png").write_bytes((d / "face.png").read_bytes())
    (src / "a.wav").write_bytes((d / "talk.wav").read_bytes())
    (d / "precious.mp4").write_bytes(b"the user's video")
    return d


def test_a_batch_reference_that_is_no_picture_is_refused_before_any_job(jobs):
    """``--ref`` is every job's reference: an audio file given there is refused once, not by each job in turn."""
    refused(cli("batch", str(jobs / "in"), "--ref", str(jobs / "in" / "a.wav"), "--out", str(jobs / "out"), *TINY),
            "has no video stream to take the face from")
    assert not (jobs / "out").exists()


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("output, words", [
    ("../precious.mp4", "is outside the output folder"),
    ("{d}/precious.mp4", "is outside the output folder"),
    ("sub/../../precious.mp4", "is outside the output folder"),
    ("a.png", "must be a file name ending in .mp4"),
])
def test_batch_outputs_stay_inside_the_output_folder(jobs, output, words, force):
    manifest = _manifest(jobs, ["ref,audio,output", f"in/a.png,in/a.wav,{output.format(d=jobs)}"])
    before = snapshot(jobs)
    refused(cli("batch", str(manifest), "--out", str(jobs / "out"), *(["--force"] if force else [])), words)
    assert snapshot(jobs) == before


def test_batch_never_writes_one_jobs_render_over_another_jobs_input(jobs):
    # row 2 reads in/b.mp4 (a video reference); row 3 would render to in/b.mp4 with --out in
    (jobs / "in" / "b.mp4").write_bytes(b"a video reference")
    manifest = _manifest(jobs, ["ref,audio,output", "a.png,a.wav,x.mp4", "b.mp4,a.wav,y.mp4", "a.png,a.wav,b.mp4"],
                         name="in/jobs.csv")
    before = snapshot(jobs)
    line = refused(cli("batch", str(manifest), "--out", str(jobs / "in"), "--force"), "is the reference of")
    assert "jobs.csv line 4" in line and "jobs.csv line 3" in line
    assert snapshot(jobs) == before


@pytest.mark.parametrize("make, words", [
    (lambda d: os.symlink(d / "loop", d / "loop"), "loops back on itself"),
    (lambda d: None, "not text (a NUL byte)"),
    (lambda d: None, "longer than 64 KB"),
    (lambda d: None, "nested too deeply"),
    (lambda d: None, "not valid JSON"),
    (lambda d: None, "the audio is 5, not a file name (give it as a string)"),
], ids=["symlink loop", "NUL byte", "210 KB cell", "deep nesting", "broken JSON", "a number for a file"])
def test_batch_manifest_cells_are_one_sentence(jobs, make, words):
    make(jobs)
    rows = {
        "loops back on itself": json.dumps({"ref": "loop", "audio": "in/a.wav"}),
        "not text (a NUL byte)": json.dumps({"ref": "in/a.png\0x", "audio": "in/a.wav"}),
        "longer than 64 KB": json.dumps({"ref": "in/a.png", "audio": "in/a.wav", "prompt": "x" * 210_000}),
        "nested too deeply": "[" * 100_000 + "]" * 100_000,
        "not valid JSON": '{"ref": "in/a.png", "audio": ',
        "the audio is 5, not a file name (give it as a string)": json.dumps({"ref": "in/a.png", "audio": 5}),
    }
    manifest = _manifest(jobs, [rows[words]], name="jobs.jsonl")
    before = snapshot(jobs)
    line = refused(cli("batch", str(manifest), "--out", str(jobs / "out")), words)
    assert "jobs.jsonl line 1" in line
    assert snapshot(jobs) == before


@pytest.mark.parametrize("cell, words", [("x" * 210_000, "line 2: not a readable CSV row"),
                                         ("in/a.png\0", "line 2: the ref cell is not text (a NUL byte)"),
                                         ('"in/a.png', "not a readable CSV row (unexpected end of data)")])
def test_batch_csv_cells_are_one_sentence(jobs, cell, words):
    manifest = _manifest(jobs, ["ref,audio", f"{cell},in/a.wav"])
    refused(cli("batch", str(manifest), "--out", str(jobs / "out")), words)


def test_a_fifo_manifest_is_refused_without_waiting(jobs):
    fifo = jobs / "jobs.csv"
    os.mkfifo(fifo)
    done = subprocess.run([sys.executable, "-m", "avatar_render", "batch", str(fifo), "--out", str(jobs / "out")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1 and "a named pipe (FIFO)" in done.stderr and "Traceback" not in done.stderr
    assert not (jobs / "out").exists()


def test_a_batch_folder_that_is_not_ours_is_refused(jobs):
    manifest = _manifest(jobs, ["ref,audio", "in/a.png,in/a.wav"])
    (jobs / "out" / ".batch").mkdir(parents=True)
    (jobs / "out" / ".batch" / "mine.txt").write_text("somebody's")
    before = snapshot(jobs)
    refused(cli("batch", str(manifest), "--out", str(jobs / "out")), "not made by it")
    assert snapshot(jobs) == before


def test_a_summary_that_is_not_ours_needs_force(jobs):
    manifest = _manifest(jobs, ["ref,audio", "in/a.png,in/a.wav"])
    (jobs / "out").mkdir()
    (jobs / "out" / "batch-summary.html").write_text("<p>my page</p>")
    before = snapshot(jobs)
    refused(cli("batch", str(manifest), "--out", str(jobs / "out")), "batch-summary.html' already exists")
    assert snapshot(jobs) == before


@pytest.mark.slow
def test_a_damaged_ledger_record_costs_only_its_own_job(jobs):
    (jobs / "in" / "b.png").write_bytes((jobs / "face.png").read_bytes())
    (jobs / "in" / "b.wav").write_bytes((jobs / "talk.wav").read_bytes())
    out = jobs / "out"
    first = cli("batch", str(jobs / "in"), "--out", str(out), *TINY)
    assert first.exit_code == 0, first.stderr
    records = sorted((batch_dir(out) / "ledger").glob("*.json"))
    records[0].write_text("[" * 100_000 + "]" * 100_000)  # nested past any parser's depth
    (out / "a.mp4").unlink()
    (out / "b.mp4").unlink()
    again = cli("batch", str(jobs / "in"), "--out", str(out), *TINY)
    assert again.exit_code == 0, again.stderr
    assert (out / "a.mp4").is_file() and (out / "b.mp4").is_file()
    assert json.loads(records[0].read_text())["status"] == "done"  # written anew


def test_a_job_another_batch_is_rendering_is_skipped_and_its_record_kept(jobs):
    manifest = _manifest(jobs, ["ref,audio", "in/a.png,in/a.wav"])
    out = jobs / "out"
    out.mkdir()
    batch_dir(out).mkdir()
    (batch_dir(out) / ".avatar-render-batch").write_text("")  # as a batch running into it has made it
    # another batch process: holds the job's lock as a batch rendering it does
    holder = subprocess.Popen([sys.executable, "-c", _HOLD.format(folder=str(batch_dir(out)), keys=_keys(jobs))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        result = cli("batch", str(manifest), "--out", str(out), *TINY)
        assert result.exit_code == 0, result.stderr
        record = json.loads((out / "batch-summary.json").read_text())
        assert [j["status"] for j in record["jobs"]] == ["skipped"]
        assert "another batch" in record["jobs"][0]["reason"]
        assert not (batch_dir(out) / "ledger").exists() and not (out / "a.mp4").exists()
        said = result.stdout + result.stderr  # (not "already done": it is not)
        assert "1 being rendered by another batch into this folder" in said and "already done" not in said, said
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    result = cli("batch", str(manifest), "--out", str(out), *TINY)  # the lock is gone with its process
    assert result.exit_code == 0 and (out / "a.mp4").is_file(), result.stderr


_HOLD = """
import sys
from avatar_render.batch.locks import JobLocks
locks = JobLocks({folder!r})
assert all(locks.take(key) for key in {keys!r})
print("held", flush=True)
sys.stdin.read()
"""


def _keys(d: Path) -> list[str]:
    from avatar_render.batch.manifest import read_manifest

    return [job.key for job in read_manifest(d / "jobs.csv", out_dir=(d / "out").resolve())]


# -- the render's own two left over from the second catalogue, and the folder rule -----------------


def test_a_300_byte_output_name_is_one_sentence(d):
    refused(render(d, "-o", str(d / ("n" * 296 + ".mp4"))), "too long")


def test_an_output_folder_that_does_not_exist_is_not_made(d):
    before = snapshot(d)
    refused(render(d, "-o", str(d / "missing" / "deeper" / "x.mp4")), "does not exist (create it first)")
    assert snapshot(d) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_report_where_nothing_can_be_written_is_refused_before_the_render(d):
    before = snapshot(d)
    refused(render(d, "-o", str(d / "out.mp4"), "--report", "/proc/report.json"), "cannot take a new file")
    assert snapshot(d) == before


def test_a_report_replaces_only_a_report(d):
    (d / "notes.json").write_text('{"mine": true}\n')
    before = snapshot(d)
    refused(render(d, "-o", str(d / "out.mp4"), "--report", str(d / "notes.json")), "was not written by avatar-render")
    assert snapshot(d) == before
    assert render(d, "-o", str(d / "a.mp4"), "--report", str(d / "r.json")).exit_code == 0
    assert render(d, "-o", str(d / "b.mp4"), "--report", str(d / "r.json")).exit_code == 0  # its own: replaced
    assert json.loads((d / "r.json").read_text())["output"].endswith("b.mp4")
