"""Helpers of the live tests: free ports, listeners on the loopback, what a received stream holds."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
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


class FirstBytes(threading.Thread):
    """Watches a file a listener writes: ``at`` is the time.time() when it first held ``size`` bytes."""

    def __init__(self, path: Path, size: int = 4096) -> None:
        super().__init__(daemon=True)
        self.path, self.size, self.at = path, size, None
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.is_set() and self.at is None:
            try:
                if self.path.stat().st_size >= self.size:
                    self.at = time.time()
            except OSError:
                pass
            time.sleep(0.02)


@dataclass
class Received:
    frames: int
    keyframes: list[int]  # indices of the video packets that are keyframes
    video_end: float  # s: last video packet's pts + duration
    audio_end: float
    audio_packets: int
    monotonic: bool
    fps: float


def probe(path: str, fps: float) -> Received:
    """What a stream (a file, a playlist URL) holds, packet by packet, as ffprobe reads it."""
    out = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "packet=stream_index,codec_type,pts_time,duration_time,flags",
                          "-of", "json", path], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    packets = json.loads(out.stdout)["packets"]
    video = [p for p in packets if p["codec_type"] == "video"]
    audio = [p for p in packets if p["codec_type"] == "audio"]

    def end(ps: list[dict], default: float) -> float:
        last = ps[-1]
        return float(last["pts_time"]) + float(last.get("duration_time") or default)

    def ordered(ps: list[dict]) -> bool:
        t = [float(p["pts_time"]) for p in ps]
        return all(b > a for a, b in zip(t, t[1:]))

    return Received(frames=len(video), keyframes=[i for i, p in enumerate(video) if "K" in p["flags"]],
                    video_end=end(video, 1 / fps), audio_end=end(audio, 0.0), audio_packets=len(audio),
                    monotonic=ordered(video) and ordered(audio), fps=fps)


def file_keyframes(path: Path) -> list[int]:
    return probe(str(path), 25.0).keyframes
