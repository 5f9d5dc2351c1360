"""The Ray launcher on a local Ray instance that the test starts (CPU only, every address on the
loopback): the same bytes as a local run, a job whose Ray worker is killed in the middle is run again
by Ray and goes on from its journal, and Ctrl-C stops the tasks after their current chunk."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import av
import pytest

from tests.batch_util import (
    SMALL,
    batch,
    by_name,
    chunk_hashes,
    env,
    make_jobs,
    report_of,
    start_batch,
    summary,
    wait_for_commit,
)

pytest.importorskip("ray", reason="the Ray launcher is an optional extra: pip install -e '.[ray]'")

LOOPBACK = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"
}  # Ray's single-machine mode: it binds 127.0.0.1, not the node's address
NAMES = ["r1", "r2", "r3"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """`ray start --head --block` in its own process group, ended with that group; its workers slow
    each chunk down (tests/batch_hooks) so that one can be killed in the middle of a job."""
    ray = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
    if ray is None:
        pytest.skip("the ray command is not installed")
    port = free_port()
    temp = tempfile.mkdtemp(prefix="avr-ray-")  # short: Ray's socket paths must fit in 107 bytes
    log = open(Path(temp) / "head.log", "w")
    head = subprocess.Popen(
        [
            ray,
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            "--object-store-memory=100000000",
            f"--temp-dir={temp}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env(**LOOPBACK, AVATAR_TEST_CHUNK_DELAY="0.25"),
    )
    try:
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (Path(temp) / "head.log").read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed: {(Path(temp) / 'head.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        end_group(head)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def end_group(leader: subprocess.Popen, grace_s: float = 3.0) -> None:
    """SIGTERM to every process of the leader's group (`ray start --block` then stops the instance),
    SIGKILL to whatever of the group is left once the leader has gone or after ``grace_s``."""
    os.killpg(leader.pid, signal.SIGTERM)
    try:
        leader.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(leader.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    leader.wait()


@pytest.mark.slow
def test_ray_renders_the_local_bytes_even_when_a_worker_dies(tmp_path, face_png, ray_head):
    jobs = make_jobs(tmp_path / "jobs", face_png, NAMES, seconds=2.0)
    local = batch(jobs, "--out", tmp_path / "local", "--jobs", "2", *SMALL, cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    want = by_name(summary(tmp_path / "local"))

    plain = batch(jobs, "--out", tmp_path / "ray", *SMALL, "--ray-address", ray_head, cwd=tmp_path, **LOOPBACK)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "on Ray (127.0.0.1:" in plain.stdout
    for name in NAMES:
        assert sha256(tmp_path / "ray" / f"{name}.mp4") == sha256(tmp_path / "local" / f"{name}.mp4")

    # A Ray worker killed in the middle of r1: Ray runs the task again, and the retry goes on from the
    # journal, in a fresh folder and under --force over the finished one (the retry must not start over).
    for out, extra in ((tmp_path / "ray-killed", ()), (tmp_path / "ray", ("--force",))):
        got = killed_run(jobs, out, ray_head, *extra)
        assert got["r1"]["status"] == "resumed" and got["r1"]["resumed_frames"] > 0, got["r1"]
        assert got["r2"]["status"] == got["r3"]["status"] == "done"
        for name in ("r2", "r3"):
            assert sha256(out / f"{name}.mp4") == sha256(tmp_path / "local" / f"{name}.mp4")
        # The resumed job has the uninterrupted job's frames and audio, chunk by chunk, and its very bytes.
        assert chunk_hashes(report_of(out, got["r1"])) == chunk_hashes(report_of(tmp_path / "local", want["r1"]))
        assert sha256(out / "r1.mp4") == sha256(tmp_path / "local" / "r1.mp4")
        assert frames_of(out / "r1.mp4") == 50
        assert not list((out / ".batch").glob("attempts/*"))


def killed_run(jobs: Path, out: Path, address: str, *extra: str) -> dict:
    """A Ray batch whose worker rendering r1 is killed (SIGKILL) once r1 has committed frames."""
    run = start_batch(jobs, "--out", out, *SMALL, *extra, "--ray-address", address, cwd=jobs.parent, **LOOPBACK)
    try:
        os.kill(wait_for_commit(out / "r1.mp4", proc=run), signal.SIGKILL)  # the process holding r1's journal lock
        stdout, stderr = run.communicate(timeout=300)
    finally:
        run.kill()
    assert run.returncode == 0, stdout + stderr
    return by_name(summary(out))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def frames_of(path: Path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


@pytest.mark.slow
def test_ctrl_c_stops_the_ray_tasks_after_their_chunk_and_the_next_run_resumes(tmp_path, face_png, ray_head):
    jobs = make_jobs(tmp_path / "jobs", face_png, ["s1", "s2", "s3", "s4"], seconds=3.0)
    out = tmp_path / "out"
    run = start_batch(jobs, "--out", out, *SMALL, "--ray-address", ray_head, cwd=tmp_path, **LOOPBACK)
    try:
        wait_for_commit(out / "s1.mp4", proc=run)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode == 130, stderr
    first = by_name(summary(out))
    assert first["s1"]["status"] == "stopped" and (out / "s1.partial.mp4").exists()  # its journal kept
    assert {job["status"] for job in first.values()} <= {"stopped", "not run", "done"}
    again = batch(jobs, "--out", out, *SMALL, "--ray-address", ray_head, cwd=tmp_path, **LOOPBACK)
    assert again.returncode == 0, again.stderr
    second = by_name(summary(out))
    assert second["s1"]["status"] == "resumed"
    assert all(second[name]["status"] in ("done", "resumed", "skipped") for name in second)
