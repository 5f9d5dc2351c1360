"""Helpers for the batch tests: job folders, runs of `avatar-render batch` in their own process, and
ways to find and kill the process rendering a job."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from tests.media import speech_like, write_audio

ROOT = Path(__file__).resolve().parents[1]
HOOKS = Path(__file__).resolve().parent / "batch_hooks"
# a resume point every chunk
SMALL = ("video.width=64", "video.height=64", "chunk.chunk_frames=8", "chunk.transition_frames=2",
         "video.gop_seconds=0.3")


def env(**extra: str) -> dict:
    """The environment of a batch process: the project and the tests' slow-chunk hook importable."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HOOKS), str(ROOT)]), **extra}


def batch(*args, cwd: Path, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "avatar_render", "batch", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env(**extra_env),
        timeout=timeout,
    )


def start_batch(*args, cwd: Path, **extra_env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "avatar_render", "batch", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env=env(**extra_env),
    )


def make_jobs(folder: Path, face: Path, names: list[str], seconds: float = 1.0) -> Path:
    """A reference and a speech clip per name (NAME.png + NAME.wav), each clip different."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        shutil.copy(face, folder / f"{name}.png")
        write_audio(folder / f"{name}.wav", speech_like(seconds, 16000, seed=10 + i), 16000)
    return folder


def summary(out: Path, name: str = "batch-summary") -> dict:
    return json.loads((out / f"{name}.json").read_text())


def by_name(record: dict) -> dict[str, dict]:
    return {job["name"]: job for job in record["jobs"]}


def state(path: Path) -> tuple[int, int, str]:
    """Size, modification time and SHA-256 of a file."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


def report_of(out: Path, job: dict) -> dict:
    return json.loads((out / job["report"]).read_text())


def chunk_hashes(report: dict) -> list[tuple]:
    """(start, end, video_sha256, audio_sha256) of every chunk of a render report."""
    return [(c["start"], c["end"], c["video_sha256"], c["audio_sha256"]) for c in report["chunks"]]


def committed_frames(output: Path) -> int:
    """Frames the job's journal has committed (its documented journal.json), 0 when there is none yet."""
    try:
        commit = json.loads((output.with_name(output.name + ".journal") / "journal.json").read_text())["commit"]
    except (OSError, ValueError, KeyError):
        return 0
    return (commit or {}).get("frames", 0)


def lock_holder(output: Path) -> Optional[int]:
    """The process holding the job's journal lock (the one rendering it), from /proc/locks."""
    try:
        inode = (output.with_name(output.name + ".journal") / "lock").stat().st_ino
    except OSError:
        return None
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
            continue  # a waiter, or another kind of lock
        if int(parts[5].rsplit(":", 1)[1]) == inode:
            return int(parts[4])
    return None


def wait_for_commit(output: Path, *, proc: Optional[subprocess.Popen] = None, timeout: float = 120) -> int:
    """Wait until the job has committed frames and a process holds its lock; returns that process id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if committed_frames(output) > 0:
            pid = lock_holder(output)
            if pid is not None:
                return pid
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the batch ended before the job started: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError(f"no frame of {output.name} was committed in {timeout} s")
