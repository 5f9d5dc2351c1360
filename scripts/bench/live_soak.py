#!/usr/bin/env python3
"""A long live render at real-time pacing: memory, A/V drift and latency as a viewer on RTMP sees them.

Starts an RTMP listener on the loopback (the ffmpeg command, ``-listen 1``), renders speech of
``--seconds`` (examples/talk.wav repeated) with the preview backend to ``--live rtmp://...`` (and, with
``--hls``, an HLS playlist beside), samples the render's resident memory every second, and reads
the FLV the listener passes on as it arrives. Prints:

* memory: mean RSS in the first minute of streaming and in the last minute, and their ratio;
* A/V: where audio and video end on the wire, their difference in frames;
* time from the command's start to the first frame the listener received, and the wire's lateness
  (each video frame's arrival against the schedule of the earliest-arriving one; the listener's own
  probe of the first 32 KB delays the first frames a little);
* CPU seconds of the whole render and of the publishing thread (from the render's report).

    python scripts/bench/live_soak.py --seconds 600      # the 10-minute run (docs/live.md)
    python scripts/bench/live_soak.py --seconds 60       # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from avatar_render.bench import loop_speech
from avatar_render.telemetry import rss_mb_of

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FlvReader(threading.Thread):
    """Reads FLV tags from a pipe as they arrive: (arrival monotonic time, type, timestamp ms, size)."""

    def __init__(self, pipe) -> None:
        super().__init__(daemon=True)
        self.pipe, self.tags = pipe, []

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            more = self.pipe.read(n - len(data))
            if not more:
                raise EOFError
            data += more
        return data

    def run(self) -> None:
        try:
            self._read(9 + 4)  # header + the first PreviousTagSize
            while True:
                head = self._read(11)
                kind, size = head[0], int.from_bytes(head[1:4], "big")
                stamp = int.from_bytes(head[4:7], "big") | head[7] << 24
                body = self._read(size)
                self._read(4)
                key = kind == 9 and body[0] >> 4 == 1 and body[1] == 1  # a keyframe's NAL units (not the config)
                if kind in (8, 9) and not (kind == 9 and body[1] != 1) and not (kind == 8 and body[1] == 0):
                    self.tags.append((time.monotonic(), kind, stamp, size, key))
        except EOFError:
            pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--hls", action="store_true", help="also write an HLS playlist")
    args = ap.parse_args()
    if shutil.which("ffmpeg") is None:
        sys.exit("needs the ffmpeg command (apt-get install ffmpeg)")
    work = Path(tempfile.mkdtemp(prefix="live-soak-"))
    speech = work / "speech.wav"
    loop_speech(ROOT / "examples" / "talk.wav", args.seconds, speech)
    port = free_port()
    url = f"rtmp://127.0.0.1:{port}/live/soak"
    # no probing: the listener passes each tag on as it arrives
    listener = subprocess.Popen(["ffmpeg", "-hide_banner", "-loglevel", "error", "-probesize", "32768",
                                 "-analyzeduration", "0",
                                 "-listen", "1", "-i", url, "-c", "copy",
                                 "-flush_packets", "1", "-f", "flv", "pipe:1"], stdout=subprocess.PIPE)
    reader = FlvReader(listener.stdout)
    reader.start()
    time.sleep(1.0)
    cmd = [sys.executable, "-m", "avatar_render", "render", "--ref", str(ROOT / "examples" / "face.png"), "--audio",
           str(speech), "--live", url, "--report", str(work / "report.json"), "-q",
           f"video.width={args.size}", f"video.height={args.size}"]
    if args.hls:
        cmd += ["--live", str(work / "live.m3u8")]
    start = time.monotonic()
    render = subprocess.Popen(cmd, cwd=ROOT)
    samples = []  # (seconds since start, RSS MB)
    while True:
        pid, status, usage = os.wait4(render.pid, os.WNOHANG)
        if pid:
            break
        rss = rss_mb_of(render.pid)
        if rss is not None:
            samples.append((time.monotonic() - start, rss))
        time.sleep(1.0)
    wall = time.monotonic() - start
    render.returncode = os.waitstatus_to_exitcode(status)
    listener.wait(timeout=30)
    reader.join(timeout=10)
    if render.returncode:
        print(f"the render failed with exit code {render.returncode}")
        return 1
    report = json.loads((work / "report.json").read_text())
    video = [t for t in reader.tags if t[1] == 9]
    audio = [t for t in reader.tags if t[1] == 8]
    fps = report.get("fps", 25.0)
    frame_ms = 1000.0 / fps
    video_end = video[-1][2] + frame_ms
    audio_end = audio[-1][2] + (audio[-1][2] - audio[-2][2])  # FLV has no durations: the last one like the one before
    # lateness of each frame on the wire: its arrival against the earliest-arriving frame's schedule
    offsets = [arrival - stamp / 1000.0 for arrival, _, stamp, _, _ in video]
    late = [o - min(offsets) for o in offsets]
    first = video[0]
    minute = min(60.0, wall / 4)
    streaming = first[0] - start  # memory from the first frame on the wire (before it: imports and set-up)
    head = [r for t, r in samples if streaming <= t <= streaming + minute]
    tail = [r for t, r in samples if t >= samples[-1][0] - minute]
    live = report.get("live") or {}
    push = next((v for k, v in live.items() if k.startswith("rtmp")), {})
    result = {
        "seconds": args.seconds, "size": args.size, "wall_s": round(wall, 1),
        "frames_received": len(video), "frames_rendered": report.get("frames"),
        "keyframes_received": sum(t[4] for t in video),
        "rss_first_minute_mb": round(sum(head) / len(head), 1), "rss_last_minute_mb": round(sum(tail) / len(tail), 1),
        "rss_ratio": round((sum(tail) / len(tail)) / (sum(head) / len(head)), 3),
        "av_end_difference_frames": round((audio_end - video_end) / frame_ms, 3),
        "first_frame_received_s": round(first[0] - start, 3),
        "first_frame_out_s_after_inputs": push.get("first_frame_out_s"),
        "inputs_s": report.get("inputs_s"),
        "wire_lateness_s": {"first_frame": round(late[0], 3), "median": round(sorted(late)[len(late) // 2], 3),
                            "max_after_first_second": round(max(late[int(fps):] or [0.0]), 3)},
        "timestamps_monotonic": all(b[2] >= a[2] for a, b in zip(video, video[1:]))
        and all(b[2] >= a[2] for a, b in zip(audio, audio[1:])),
        "render_cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "publish_thread_cpu_s": push.get("cpu_s"),
        "publish_cpu_percent_of_wall": round(100 * (push.get("cpu_s") or 0) / wall, 2), "stalls": push.get("stalls"),
    }
    print(json.dumps(result, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
