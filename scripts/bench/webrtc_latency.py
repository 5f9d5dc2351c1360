#!/usr/bin/env python3
"""WebRTC from ``--serve`` in Chromium: first frame shown after the command's start, glass-to-glass delay.

Starts headless Chromium (the OS's, driven by Playwright), then ``avatar-render render ... --serve 0``
(preview backend, examples/face.png, ``--seconds`` of examples/talk.wav repeated), opens the printed URL
in ``--viewers`` tabs at once and reports:

* the first frame shown (requestVideoFrameCallback) in the first tab, from the command's start;
* glass-to-glass: for every frame shown, its display time minus the time the writer handed that frame
  over (the frame is known from its RTP timestamp, which counts frames from the viewer's first keyframe;
  the hand-over times are read from status.json, polled every 20 ms): median, p95, max;
* per tab, the frames received, decoded and dropped (WebRTC's statistics) and the frames shown (only the
  tab in front: Chromium does not paint the others); the render's speed, peak memory (its own summary
  line), resident memory after a minute and at the end, and CPU time (the browsers share the machine:
  on 2 cores, 10 tabs take most of it).

``--no-watch`` runs the same render with no viewer, for the speed a viewer costs.

    python scripts/bench/webrtc_latency.py --seconds 300
    python scripts/bench/webrtc_latency.py --seconds 300 --viewers 10
    python scripts/bench/webrtc_latency.py --seconds 300 --no-watch
    python scripts/bench/webrtc_latency.py --seconds 300 -- --live-buffer 1 chunk.chunk_frames=10 \
        chunk.transition_frames=0
    python scripts/bench/webrtc_latency.py --seconds 300 --paced -- chunk.chunk_frames=10 chunk.transition_frames=0
"""

from __future__ import annotations

import argparse
import bisect
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from served_render import cpu_s, print_figures, served_render

from avatar_render.telemetry import rss_mb_of

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--autoplay-policy=no-user-gesture-required"]
TAKE_SHOWN = "() => { const s = window.watch.shown; window.watch.shown = []; return s; }"
DECODED = """async () => { if (!rtc) return null; const out = {};
    for (const s of (await rtc.pc.getStats()).values()) if (s.type === 'inbound-rtp' && s.kind === 'audio')
      out.audio_jitter_buffer_s = s.jitterBufferDelay / Math.max(1, s.jitterBufferEmittedCount);
    for (const s of (await rtc.pc.getStats()).values()) if (s.type === 'inbound-rtp' && s.kind === 'video')
      Object.assign(out, {received: s.framesReceived, decoded: s.framesDecoded, dropped: s.framesDropped,
                          lost: s.packetsLost, freezes: s.freezeCount,
                          jitter_buffer_s: s.jitterBufferDelay / Math.max(1, s.jitterBufferEmittedCount),
                          decode_s: s.totalDecodeTime / Math.max(1, s.framesDecoded)});
    return out; }"""


class Handovers(threading.Thread):
    """status.json polled: (newest frame, the time.time() the writer handed it over), each change once; and
    (frame, the time.time() it was seen sent), for the frames seen as the last one sent."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.seen, self.sent, self.stop = url, [], [], threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.url + "status.json", timeout=2) as r:
                    rtc = json.load(r).get("webrtc") or {}
                if rtc.get("newest_at") and (not self.seen or rtc["newest_frame"] > self.seen[-1][0]):
                    self.seen.append((rtc["newest_frame"], rtc["newest_at"]))
                if rtc.get("sent_frame", -1) >= 0 and (not self.sent or rtc["sent_frame"] > self.sent[-1][0]):
                    self.sent.append((rtc["sent_frame"], time.time()))
            except OSError:
                pass
            time.sleep(0.02)

    def handed_at(self, frame: int) -> float | None:
        i = bisect.bisect_left([f for f, _ in self.seen], frame)
        return self.seen[i][1] if i < len(self.seen) else None


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--viewers", type=int, default=1)
    ap.add_argument("--no-watch", action="store_true", help="no browser: the render's speed without a viewer")
    ap.add_argument("--paced", action="store_true",
                    help="hold generation to real time, as a session's would be: an RTMP target on the loopback "
                         "(an ffmpeg listener) with a 0.5-s queue makes the writer wait for the wire")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("render_args", nargs="*", help="more for the render, after --: options, config overrides")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="webrtc-latency-"))
    cmd, listener = served_render(args.seconds, args.size, args.render_args, work, paced=args.paced)
    figures: dict = {"seconds": args.seconds, "paced": args.paced, "size": args.size,
                     "viewers": 0 if args.no_watch else args.viewers, "render_args": args.render_args}
    if args.no_watch:
        start = time.time()
        with (work / "render.log").open("w") as log:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
            cpu = None
            while proc.poll() is None:
                cpu = cpu_s(proc.pid) or cpu
                time.sleep(0.5)
        done = subprocess.CompletedProcess(cmd, proc.returncode, (work / "render.log").read_text())
        figures["render_cpu_s"] = cpu
        summary = [ln for ln in done.stdout.splitlines() if ln.startswith("Streamed")]
        figures.update(wall_s=round(time.time() - start, 2), summary=summary[-1] if summary else done.stdout[-500:])
        print(json.dumps(figures, indent=1))
        return done.returncode
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or sys.exit("needs Chromium (apt-get install chromium)")
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        browser = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=FLAGS)
        pages = [browser.new_page() for _ in range(args.viewers)]
        start = time.time()
        log = (work / "render.log").open("w")
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True)
        while not (found := re.search(r"http://\S+/", (work / "render.log").read_text())):
            if proc.poll() is not None:
                sys.exit((work / "render.log").read_text())
            time.sleep(0.01)
        url = found.group(0)
        figures["url_printed_s"] = round(time.time() - start, 3)
        handovers = Handovers(url)
        for page in pages:
            page.goto(url)
        pages[0].wait_for_function("window.watch.firstFrameAt !== null", timeout=600_000)
        figures["first_frame_shown_s"] = round(pages[0].evaluate("window.watch.firstFrameAt") / 1000 - start, 3)
        figures["via"] = pages[0].evaluate("window.watch.via")
        shown: list[list] = [[] for _ in pages]
        rss = []  # (s since the command's start, the render's resident memory in MB)
        while proc.poll() is None:  # (the server stays up while the pages are open: --serve-linger)
            time.sleep(2)
            rss.append((time.time() - start, rss_mb_of(proc.pid)))
            figures["render_cpu_s"] = cpu_s(proc.pid) or figures.get("render_cpu_s")
            for i, page in enumerate(pages):
                shown[i] += page.evaluate(TAKE_SHOWN)
            status = pages[0].evaluate("fetch('status.json').then(r => r.json())")
            if status["state"] not in ("starting", "rendering") and status.get("webrtc", {}).get("ended"):
                time.sleep(1.5)  # the last frames through the jitter buffer
                break
        for i, page in enumerate(pages):
            shown[i] += page.evaluate(TAKE_SHOWN)
        figures["video_per_viewer"] = [page.evaluate(DECODED) for page in pages]
        figures["gops_skipped"] = status.get("webrtc", {}).get("dropped_gops")
        figures["frames_sent"] = status.get("webrtc", {}).get("frames_sent")
        browser.close()
    handovers.stop.set()  # (it polls the server too)
    handovers.join()
    proc.wait(timeout=60)
    total = round(args.seconds * 25)
    delays = [e[0] / 1000 - h for s in shown for e in s if (h := handovers.handed_at(e[1])) is not None]
    in_browser = [(e[0] - e[2]) / 1000 for s in shown for e in s if len(e) > 2 and e[2] is not None]
    # the part of it before the frame left the server (polled: a frame seen sent up to 20 ms after it was)
    waits = [at - h for f, at in handovers.sent if (h := handovers.handed_at(f)) is not None]
    log.close()
    summary = [ln for ln in (work / "render.log").read_text().splitlines() if ln.startswith("Streamed")]
    figures.update(
        wall_s=round(time.time() - start, 2),
        first_frame_handed_over_s=round(handovers.seen[0][1] - start, 3) if handovers.seen else None,
        frames_shown_per_viewer=[len({e[1] for e in s}) for s in shown], frames_total=total,
        glass_to_glass_s={"median": round(percentile(delays, 0.5), 3), "p95": round(percentile(delays, 0.95), 3),
                          "max": round(max(delays), 3)} if delays else None,
        received_to_shown_s={"median": round(percentile(in_browser, 0.5), 3),
                             "p95": round(percentile(in_browser, 0.95), 3)} if in_browser else None,
        handed_over_to_sent_s={"median": round(percentile(waits, 0.5), 3), "p95": round(percentile(waits, 0.95), 3),
                               "max": round(max(waits), 3)} if waits else None,
        summary=summary[-1] if summary else None,
        rss_mb={"after_60_s": next((round(m) for t, m in rss if t >= 60 and m), None),
                "last": next((round(m) for _, m in reversed(rss) if m), None),
                "max": round(max((m for _, m in rss if m), default=0))})
    return print_figures(figures, listener, args.json, proc)


if __name__ == "__main__":
    sys.exit(main())
