#!/usr/bin/env python3
"""Time from ``avatar-render render ... --serve`` starting to the first frame a browser shows.

Starts headless Chromium (the OS's, driven by Playwright) first, then the render with ``--serve 0``
(preview backend, examples/face.png, ``--seconds`` of examples/talk.wav), opens the printed URL at
once and reports, from the command's start: the URL printed, the first frame shown
(requestVideoFrameCallback), the render's end; from the render's inputs being ready: the first
segment listed; and the frames the page decoded.

    python scripts/bench/live_first_frame.py --seconds 20
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--autoplay-policy=no-user-gesture-required"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--size", type=int, default=512)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or sys.exit("needs Chromium (apt-get install chromium)")
    work = Path(tempfile.mkdtemp(prefix="live-first-frame-"))
    with wave.open(str(ROOT / "examples" / "talk.wav")) as src:
        params, data = src.getparams(), src.readframes(src.getnframes())
    need = int(args.seconds * params.framerate) * params.sampwidth * params.nchannels
    with wave.open(str(work / "speech.wav"), "wb") as out:
        out.setparams(params)
        out.writeframes((data * (need // len(data) + 1))[:need])
    out = work / "out.mp4"
    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        browser = p.chromium.launch_persistent_context(profile, executable_path=chromium, headless=True, args=FLAGS)
        page = browser.new_page()
        start = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "avatar_render", "render",
                                 "--ref", str(ROOT / "examples" / "face.png"),
                                 "--audio", str(work / "speech.wav"), "-o", str(out),
                                 "--serve", "0", "--serve-linger", "1",
                                 "--report", str(work / "report.json"), "-q",
                                 f"video.width={args.size}", f"video.height={args.size}"],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        line = proc.stdout.readline()
        url_at = time.time() - start
        page.goto(re.search(r"http://\S+", line).group(0))
        page.wait_for_function("window.watch.firstFrameAt !== null", timeout=300_000)
        first = page.evaluate("window.watch.firstFrameAt") / 1000 - start
        page.evaluate("document.getElementById('video').playbackRate = 4")
        page.wait_for_function("window.watch.ended", timeout=600_000)
        frames = page.evaluate("document.getElementById('video').getVideoPlaybackQuality().totalVideoFrames")
        browser.close()
    proc.wait(timeout=120)
    report = json.loads((work / "report.json").read_text())
    live = report.get("live") or {}
    hls = next((v for k, v in live.items() if k.endswith(".m3u8'")), {})
    print(json.dumps({
        "seconds": args.seconds, "size": args.size,
        "url_printed_s": round(url_at, 3),
        "inputs_ready_s": round(report["inputs_s"], 3),
        "first_segment_listed_after_inputs_s": hls.get("first_segment_listed_s"),
        "first_frame_shown_s": round(first, 3),
        "render_ended_s": round(out.stat().st_mtime - start, 3),
        "frames_decoded": frames, "frames_rendered": report["frames"],
    }, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
