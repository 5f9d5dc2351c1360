#!/usr/bin/env python3
"""A real-time session's latency: from an audio sample's arrival to its frame leaving the live sink.

Starts ``avatar-render render --audio post: --serve PORT`` (preview backend, 512x512) with a live sink
(``--sink``), pushes speech (examples/talk.wav as 16 kHz raw PCM, repeated) to ``POST /audio`` at
real-time pace in 40 ms pieces, with a pause of ``--gap`` seconds every ``--every`` seconds (an agent
that speaks, then listens), and notes when each frame came out of the sink:

* ``stdout``: ``--live -``, the fragmented MP4 on the render's standard output, read as it arrives;
* ``rtmp``: ``--live rtmp://…`` to an RTMP listener on the loopback (``ffmpeg -listen 1``, copying the
  FLV to a pipe without probing or buffering), each FLV video tag timed as it comes out of the pipe;
* ``watch``: the watch page in headless Chromium (Playwright) over WebRTC, each frame timed when the
  page shows it (requestVideoFrameCallback).

After ``POST /end`` the report's idle stretches place every pushed piece on the session's timeline,
hence on a video frame; its latency is the time that frame came out minus the time the piece was pushed.
Also samples the render's resident memory every second.

Prints the latency distribution (p50, p95, max), the silence the session put in, and the mean
resident memory in the first and the last minute.

    python scripts/bench/session_latency.py --seconds 600                  # the 10-minute run
    python scripts/bench/session_latency.py --seconds 30                   # a quick look
    python scripts/bench/session_latency.py --seconds 60 --sink rtmp -- --preroll 0
    python scripts/bench/session_latency.py --seconds 60 --sink watch
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from avatar_render.telemetry import rss_mb_of

ROOT = Path(__file__).resolve().parents[2]
RATE, FPS, PIECE_S = 16000, 25, 0.04


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def speech(seconds: float) -> np.ndarray:
    out = subprocess.run(["ffmpeg", "-v", "error", "-stream_loop", "-1", "-i", str(ROOT / "examples" / "talk.wav"),
                          "-t", str(seconds), "-ar", str(RATE), "-ac", "1", "-f", "s16le", "-"],
                         capture_output=True, check=True).stdout
    return np.frombuffer(out, np.int16)


class Fragments(threading.Thread):
    """Reads fMP4 from ``stream``: ``arrivals`` holds (time.time(), video frames so far) per fragment."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream, self.arrivals, self.frames = stream, [], 0
        self.start()

    def run(self) -> None:
        while True:
            head = self.stream.read(8)
            if len(head) < 8:
                return
            size, kind = struct.unpack(">I4s", head)
            body = self.stream.read(size - 8)
            if kind == b"moof":
                self.frames += _video_samples(body)
            elif kind == b"mdat":
                self.arrivals.append((time.time(), self.frames))


class FlvTags(threading.Thread):
    """Reads FLV from ``stream``: ``arrivals`` holds (time.time(), its frame index + 1) per video frame, the
    frame known from its timestamp (frame i at i / FPS plus the AAC priming, 1024 samples at RATE: the
    push sink's clock, kept by the listener's -copyts). Counting tags would not do: the listener drops
    the frames that come while it starts (about 2 s), which a count would put on the frames after them."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream, self.arrivals = stream, []
        self.start()

    def run(self) -> None:
        if len(self.stream.read(13)) < 13:  # the header and the first PreviousTagSize
            return
        while True:
            head = self.stream.read(11)
            if len(head) < 11:
                return
            kind, size = head[0] & 0x1F, int.from_bytes(head[1:4], "big")
            body = self.stream.read(size + 4)  # (and the PreviousTagSize after it)
            if kind == 9 and len(body) > 1 and body[1] == 1:  # a video tag holding an AVC frame (not its header)
                ms = int.from_bytes(head[4:7], "big") | head[7] << 24
                frame = round((ms / 1000 - 1024 / RATE) * FPS)
                self.arrivals.append((time.time(), frame + 1))


def rtmp_listener(port: int) -> tuple[subprocess.Popen, str]:
    """An RTMP listener on the loopback that hands the FLV on as it comes: no probing, no buffering."""
    url = f"rtmp://127.0.0.1:{port}/live/session"
    listener = subprocess.Popen(["ffmpeg", "-hide_banner", "-loglevel", "error", "-fflags", "nobuffer",
                                 "-probesize", "100000", "-analyzeduration", "100000", "-listen", "1", "-i", url,
                                 "-map", "0:v", "-c", "copy", "-copyts", "-flush_packets", "1", "-f", "flv", "-"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    time.sleep(1.0)  # (it listens)
    return listener, url


class Shown(threading.Thread):
    """The watch page in headless Chromium: ``arrivals`` holds (time.time(), frame index + 1) per frame shown."""

    FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             "--autoplay-policy=no-user-gesture-required"]

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.arrivals, self.stop, self.via = url, [], threading.Event(), None
        self.ready = threading.Event()
        self.start()

    def run(self) -> None:
        import shutil

        from playwright.sync_api import sync_playwright

        chromium = shutil.which("chromium") or sys.exit("needs Chromium (apt-get install chromium)")
        take = "() => { const s = window.watch.shown; window.watch.shown = []; return s; }"
        with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
            browser = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True,
                                                           args=self.FLAGS)
            page = browser.new_page()
            page.goto(self.url)
            self.ready.set()
            while not self.stop.wait(0.5):
                self.via = page.evaluate("window.watch.via")
                self.arrivals += [(at / 1000, frame + 1) for at, frame, *_ in page.evaluate(take)]
            browser.close()


def _boxes(data: bytes):
    at = 0
    while at + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        yield kind, data[at + 8:at + size]
        at += size


def _video_samples(moof: bytes) -> int:
    count = 0
    for kind, traf in _boxes(moof):
        if kind != b"traf":
            continue
        boxes = dict(_boxes(traf))
        track = struct.unpack(">I", boxes[b"tfhd"][4:8])[0]
        if track == 1:  # the video track (io/fmp4.py)
            count += struct.unpack(">I", boxes[b"trun"][4:8])[0]
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="audio pushed in all")
    parser.add_argument("--every", type=float, default=8.0, help="speak this long, then pause")
    parser.add_argument("--gap", type=float, default=3.0, help="the pause, in seconds")
    parser.add_argument("--sink", choices=("stdout", "rtmp", "watch"), default="stdout",
                        help="where the frames are timed (see above)")
    parser.add_argument("overrides", nargs="*", help="config keys and options for the render, after --")
    args = parser.parse_args()
    pcm = speech(args.seconds)
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        report_path = Path(folder) / "report.json"
        cmd = [sys.executable, "-m", "avatar_render", "render", "--ref", str(ROOT / "examples" / "face.png"),
               "--audio", "post:", "--serve", f"127.0.0.1:{port}", "--serve-linger", "0",
               "--report", str(report_path), "--progress", "none", "audio.raw=s16le:16000:1", "video.width=512",
               "video.height=512"]
        listener = None
        if args.sink == "stdout":
            cmd += ["--live", "-"]
        elif args.sink == "rtmp":
            listener, url = rtmp_listener(free_port())
            cmd += ["--live", url]
        render = subprocess.Popen([*cmd, *args.overrides], stdout=subprocess.PIPE,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        if args.sink == "stdout":
            out = Fragments(render.stdout)
        elif args.sink == "rtmp":
            out = FlvTags(listener.stdout)
        memory: list[tuple[float, float]] = []
        stop = threading.Event()

        def sample_memory() -> None:
            while not stop.wait(1.0):
                if (rss := rss_mb_of(render.pid)) is None:
                    return
                memory.append((time.monotonic(), rss))

        threading.Thread(target=sample_memory, daemon=True).start()
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                connection.connect()
                break
            except OSError:
                time.sleep(0.2)
        if args.sink == "watch":
            out = Shown(f"http://127.0.0.1:{port}/")
            out.ready.wait(60)
            time.sleep(1.0)  # (the page connects)
        connection.putrequest("POST", "/audio")
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        step = round(PIECE_S * RATE)
        pushed: list[tuple[int, float]] = []  # (first sample of the piece, time.time() it was pushed)
        due, spoken = time.monotonic(), 0.0
        for k in range(0, len(pcm), step):
            if spoken >= args.every:
                time.sleep(args.gap)
                due, spoken = due + args.gap, 0.0
            piece = pcm[k:k + step].tobytes()
            pushed.append((k, time.time()))
            connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
            due, spoken = due + PIECE_S, spoken + PIECE_S
            time.sleep(max(0.0, due - time.monotonic()))
        connection.send(b"0\r\n\r\n")
        connection.getresponse().read()
        end = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        end.request("POST", "/end")
        end.getresponse().read()
        if args.sink == "watch":
            time.sleep(2.0)  # the last frames through the browser
            out.stop.set()
        render.wait(timeout=600)
        stop.set()
        out.join(timeout=30)
        if listener is not None:
            listener.wait(timeout=30)
        report = json.loads(report_path.read_text())
    idle = report.get("idle") or []
    arrivals = sorted(out.arrivals)
    latencies, steady = [], []
    for k, t in pushed:
        at_s = k / RATE  # the piece on the session's timeline: after every stretch of silence put in before it
        for start_s, length in idle:
            if start_s <= at_s + 1e-3:  # (a stretch that starts where the piece does comes before it)
                at_s += length
        frame = int(at_s * FPS)
        arrived = next((when for when, frames in arrivals if frames > frame), None)
        if arrived is not None:
            latencies.append(arrived - t)
            if k / RATE >= args.every:  # after the first pause (the render's start-up is behind it)
                steady.append(arrived - t)
    lat = np.array(latencies)
    print(f"pushed {len(pcm) / RATE:.1f} s in {len(pushed)} pieces; session {report['duration_s']:.1f} s with "
          f"{report.get('idle_s') or 0:.1f} s idle; {report['frames']} frames")
    print(f"latency arrival -> frame out of the {args.sink} sink (s): p50 {np.percentile(lat, 50):.3f}  "
          f"p95 {np.percentile(lat, 95):.3f}  max {lat.max():.3f}  ({len(lat)} pieces)")
    if steady:
        print(f"  after the first pause (the render's start-up behind): p50 {np.percentile(steady, 50):.3f}  "
              f"p95 {np.percentile(steady, 95):.3f}  max {max(steady):.3f}  ({len(steady)} pieces)")
    if report.get("live"):
        print("live sinks (the report's):", json.dumps(report["live"]))
    t0 = memory[0][0] if memory else 0.0
    first = [m for t, m in memory if t - t0 <= 60]
    last = [m for t, m in memory if t >= memory[-1][0] - 60] if memory else []
    if first and last:
        print(f"resident memory: first minute {np.mean(first):.0f} MB, last minute {np.mean(last):.0f} MB, "
              f"peak {report['peak_rss_mb']:.0f} MB")


if __name__ == "__main__":
    main()
