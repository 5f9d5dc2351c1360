"""Helpers of the live tests: free ports, listeners on the loopback, what a received stream holds."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import wave
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FFMPEG = shutil.which("ffmpeg")
needs_ffmpeg = pytest.mark.skipif(FFMPEG is None, reason="needs the ffmpeg command (apt-get install ffmpeg)")


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int, *, udp: bool = False, timeout: float = 20.0) -> None:
    """Until a socket is bound to ``port`` on this machine (read from /proc, so that a probe does not
    use up a listener that accepts one connection)."""
    tables = ["/proc/net/udp", "/proc/net/udp6"] if udp else ["/proc/net/tcp", "/proc/net/tcp6"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for table in tables:
            try:
                rows = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                if int(local.rsplit(":", 1)[1], 16) == port and (udp or state == "0A"):
                    return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port}")


def speech(path: Path, seconds: float) -> Path:
    """examples/talk.wav cut (or repeated) to ``seconds``."""
    with wave.open(str(ROOT / "examples" / "talk.wav")) as src:
        params, data = src.getparams(), src.readframes(src.getnframes())
    need = int(seconds * params.framerate) * params.sampwidth * params.nchannels
    with wave.open(str(path), "wb") as out:
        out.setparams(params)
        out.writeframes((data * (need // len(data) + 1))[:need])
    return path


def render_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "avatar_render", "render", "--ref", str(ROOT / "examples" / "face.png"), *args]


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


# Runs the CLI with the preview held before it draws its segment argv[2] (1-based) until the file argv[1]
# exists: the render cannot end (nor its output appear) before the test has seen what it waits for.
HELD = """
import sys, time
from pathlib import Path
from tests.decode_hook import before_each_segment
go, at = Path(sys.argv[1]), int(sys.argv[2])
def hold(segment):
    while segment == at and not go.exists():
        time.sleep(0.01)
before_each_segment(hold)
from avatar_render.cli import main
sys.argv = ["avatar-render", *sys.argv[3:]]
main()
"""


def held_render(go: Path, at: int, *args: str) -> subprocess.Popen:
    """``render_cmd(*args)`` held before it draws its segment ``at`` until ``go`` exists; in a process group of its
    own, as a terminal's foreground job."""
    return subprocess.Popen([sys.executable, "-c", HELD, str(go), str(at), *render_cmd(*args)[3:]],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
                            start_new_session=True)


def wait_until(ready, proc: subprocess.Popen, *, hang_s: float = 120.0) -> None:
    """Until ``ready()`` (a render held for it cannot end first); ``hang_s`` only guards against a hang."""
    deadline = time.monotonic() + hang_s
    while not ready():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "hung"
        time.sleep(0.02)


@dataclass
class Received:
    frames: int
    keyframes: list[int]  # indices of the video packets that are keyframes
    video_last: float  # s: pts of the last video packet
    audio_last: float  # s: pts of the last audio packet
    audio_last_duration: float  # as the container says (FLV and MPEG-TS carry none: a whole AAC frame then)
    audio_packets: int
    monotonic: bool
    fps: float

    @property
    def video_end(self) -> float:
        return self.video_last + 1 / self.fps

    @property
    def audio_end(self) -> float:
        return self.audio_last + self.audio_last_duration


def probe(path: str, fps: float) -> Received:
    """What a stream (a file, a playlist URL) holds, packet by packet, as ffprobe reads it."""
    out = subprocess.run(["ffprobe", "-v", "error", "-show_entries",
                          "packet=stream_index,codec_type,pts_time,duration_time,flags",
                          "-of", "json", path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    packets = json.loads(out.stdout)["packets"]
    video = [p for p in packets if p["codec_type"] == "video"]
    audio = [p for p in packets if p["codec_type"] == "audio"]

    def ordered(ps: list[dict]) -> bool:
        t = [float(p["pts_time"]) for p in ps]
        return all(b > a for a, b in zip(t, t[1:]))

    last = audio[-1].get("duration_time")
    return Received(frames=len(video), keyframes=[i for i, p in enumerate(video) if "K" in p["flags"]],
                    video_last=float(video[-1]["pts_time"]), audio_last=float(audio[-1]["pts_time"]),
                    audio_last_duration=float(last) if last not in (None, "N/A") else 0.0, audio_packets=len(audio),
                    monotonic=ordered(video) and ordered(audio), fps=fps)
