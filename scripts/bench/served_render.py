"""The render both WebRTC benchmarks (webrtc_latency.py, webrtc_viewers.py) watch: the preview on
examples/face.png speaking examples/talk.wav looped to the length asked, served (``--serve 0``); with
``paced``, also pushed to an RTMP listener on the loopback (an ffmpeg process) with a 0.5-s queue, so
the writer waits for the wire and generation is held to real time, as a session's would be."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from avatar_render.bench import loop_speech

ROOT = Path(__file__).resolve().parents[2]


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) the process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def served_render(seconds: float, size: int, render_args: list[str], work: Path, *,
                  paced: bool) -> tuple[list[str], Optional[subprocess.Popen]]:
    """The render's command line (its speech written into ``work``) and the RTMP listener when ``paced``
    (the caller waits for it after the render)."""
    loop_speech(ROOT / "examples" / "talk.wav", seconds, work / "speech.wav")
    cmd = [sys.executable, "-m", "avatar_render", "render", "--ref", str(ROOT / "examples" / "face.png"),
           "--audio", str(work / "speech.wav"), "--serve", "0", "--serve-linger", "1",
           f"video.width={size}", f"video.height={size}", *render_args]
    if not paced:
        return cmd, None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"rtmp://127.0.0.1:{port}/live/bench"
    listener = subprocess.Popen(["ffmpeg", "-hide_banner", "-loglevel", "error", "-listen", "1", "-i", url,
                                 "-c", "copy", "-f", "null", "-"], stdin=subprocess.DEVNULL)
    time.sleep(1.0)  # (it listens)
    return cmd + ["--live", url, "--live-buffer", "0.5", "--preroll", "0.5"], listener


def print_figures(figures: dict, listener: Optional[subprocess.Popen], json_path: Optional[Path],
           render: subprocess.Popen) -> int:
    """Print the figures (and write them to ``json_path``) once the listener is done; the render's exit code."""
    if listener is not None:
        listener.wait(timeout=30)
    print(json.dumps(figures, indent=1))
    if json_path:
        json_path.write_text(json.dumps(figures, indent=1) + "\n")
    return render.returncode or 0
