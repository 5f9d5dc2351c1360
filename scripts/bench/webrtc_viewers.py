#!/usr/bin/env python3
"""Many WebRTC viewers of ``--serve`` at once, without browsers: does each keep up, does memory stay flat,
what do they cost the render?

Runs ``avatar-render render ... --serve 0`` (preview backend, examples/face.png, ``--seconds`` of
examples/talk.wav repeated) and, in one separate process, ``--viewers`` light viewers: aiortc peer
connections that each negotiate over /whep as the watch page does (an offer with H.264 and Opus,
receive-only) and count what they receive: every video frame reassembled from its RTP packets (and the
Opus packets), with its arrival time, without decoding it (aiortc's decoder thread is replaced by a
counter). Ten Chromium tabs would take the 2 cores of the development machine; these take a fraction.

Reported: per viewer, the video frames received against the frames sent after its first keyframe, frames
per second, and its delay (a frame's arrival minus the time the writer handed that frame over: status.json
polled every 20 ms, the frame known from the viewer's first frame and its RTP timestamp): median, p95, max;
the render's speed (its summary line) and CPU time; the CPU time of its sender (the child process that
sends to the viewers, sampled every 2 s); resident memory, the render's and its sender's together, every
2 s (after a minute, at the end, peak; slope per minute after the first minute); the viewers' process CPU
time. ``--viewers-nice 10`` runs the viewers below the render, as browsers on other machines would be.

    python scripts/bench/webrtc_viewers.py --seconds 300 --viewers 10
    python scripts/bench/webrtc_viewers.py --seconds 300 --viewers 0          # the same render, no viewer
    python scripts/bench/webrtc_viewers.py --seconds 300 --viewers 10 --paced -- chunk.chunk_frames=8 \\
        chunk.transition_frames=0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from served_render import cpu_s, print_figures, served_render

ROOT = Path(__file__).resolve().parents[2]
VIDEO_CLOCK = 90_000


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid: int, marker: str) -> list[int]:
    """The child processes of ``pid`` whose command line holds ``marker``."""
    found = []
    for listing in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids = listing.read_text().split()
        except OSError:
            continue
        for kid in kids:
            try:
                if marker in Path(f"/proc/{kid}/cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(kid))
            except OSError:
                pass
    return found


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# The viewers' process.

def viewers_main(url: str, count: int, out: Path, stop_after: float) -> None:
    """``count`` receive-only peer connections on ``url``'s /whep; at the end (the stream over, or
    ``stop_after`` seconds) writes, per viewer, its session and each video frame's (RTP time since its first
    frame, arrival time.time()) and the number of audio packets to ``out`` (JSON)."""
    import aiortc.rtcrtpreceiver as receiver_module
    from aiortc import RTCPeerConnection, RTCSessionDescription

    seen: dict[int, list] = {}  # id(the track's queue) -> [(kind, timestamp, arrival)]
    lock = threading.Lock()

    def counting_worker(loop, input_q, output_q, decode_error) -> None:  # (aiortc's decoder_worker, not decoding)
        got = []
        with lock:
            seen[id(output_q)] = got
        while (task := input_q.get()) is not None:
            codec, frame = task
            got.append((codec.name, frame.timestamp, time.time()))

    receiver_module.decoder_worker = counting_worker

    async def one(i: int) -> dict:
        pc = RTCPeerConnection()
        pc.addTransceiver("video", direction="recvonly")
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        request = urllib.request.Request(url + "whep", data=pc.localDescription.sdp.encode(), method="POST",
                                         headers={"Content-Type": "application/sdp"})
        reply = await asyncio.to_thread(urllib.request.urlopen, request, timeout=20)
        answer, location = reply.read().decode(), reply.headers["Location"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        return {"pc": pc, "session": location.rsplit("/", 1)[1], "joined": time.time()}

    async def run() -> None:
        viewers = await asyncio.gather(*(one(i) for i in range(count)))
        started = time.time()
        firsts: list = [None] * count  # the frame each viewer's picture starts at, once it has one

        def status(query: str = "") -> dict:
            with urllib.request.urlopen(url + "status.json" + query, timeout=2) as reply:
                return json.load(reply).get("webrtc") or {}

        lapses: list = [None] * count  # how often each lost its queue (it fell behind) and waited for a keyframe
        while time.time() - started < stop_after:
            await asyncio.sleep(1)
            try:
                for i, v in enumerate(viewers):
                    own = await asyncio.to_thread(status, f"?session={v['session']}")
                    firsts[i], lapses[i] = own.get("first_frame"), own.get("lapses")
                if (await asyncio.to_thread(status)).get("ended"):
                    await asyncio.sleep(1.0)  # the last packets
                    break
            except OSError:
                break  # (the server is gone)
        report = []
        for v, first, lapsed in zip(viewers, firsts, lapses):
            got = {}
            for r in v["pc"].getReceivers():
                got[r.track.kind] = seen.get(id(r.track._queue), [])
            report.append({"session": v["session"], "joined": v["joined"], "first_frame": first, "lapses": lapsed,
                           "video": [(ts, at) for _, ts, at in got.get("video", [])],
                           "audio_packets": len(got.get("audio", []))})
        out.write_text(json.dumps(report))
        await asyncio.gather(*(v["pc"].close() for v in viewers))

    asyncio.run(run())


# The render and the figures.

class Handovers(threading.Thread):
    """status.json polled: (newest frame, the time.time() the writer handed it over), each change once; and
    (the last frame sent, the number of frames sent by then)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.seen, self.sent, self.stop, self.last = url, [], [], threading.Event(), {}
        self.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with urllib.request.urlopen(self.url + "status.json", timeout=2) as r:
                    self.last = json.load(r).get("webrtc") or {}
                if self.last.get("newest_at") and (not self.seen or self.last["newest_frame"] > self.seen[-1][0]):
                    self.seen.append((self.last["newest_frame"], self.last["newest_at"]))
                sent = self.last.get("sent_frame", -1)
                if sent >= 0 and (not self.sent or sent > self.sent[-1][0]):
                    self.sent.append((sent, self.last["frames_sent"]))
            except OSError:
                pass
            time.sleep(0.02)

    def sent_since(self, frame: int) -> int | None:
        """Frames sent from ``frame`` on (to within the poll's 20 ms)."""
        import bisect

        i = bisect.bisect_left([f for f, _ in self.sent], frame)
        if not self.sent or i >= len(self.sent):
            return None
        before = self.sent[i][1] - (self.sent[i][0] - frame)  # (frames_sent when ``frame`` went: GOPs skip earlier)
        return self.sent[-1][1] - before + 1

    def handed_at(self, frame: int) -> float | None:
        import bisect

        i = bisect.bisect_left([f for f, _ in self.seen], frame)
        return self.seen[i][1] if i < len(self.seen) else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--viewers", type=int, default=10)
    ap.add_argument("--paced", action="store_true",
                    help="hold generation to real time, as a session's would be (an RTMP target on the loopback with "
                         "a 0.5-s queue), as webrtc_latency.py --paced does")
    ap.add_argument("--viewers-nice", type=int, default=0, metavar="N",
                    help="run the viewers' process at this niceness: the viewers stand for browsers on other "
                         "machines, so they take only the CPU the render leaves (0: they compete with it)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--client", nargs=3, metavar=("URL", "COUNT", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("render_args", nargs="*", help="more for the render, after --: options, config overrides")
    args = ap.parse_args()
    if args.client:
        viewers_main(args.client[0], int(args.client[1]), Path(args.client[2]), stop_after=args.seconds * 3 + 60)
        return 0
    work = Path(tempfile.mkdtemp(prefix="webrtc-viewers-"))  # (kept: the render's log)
    cmd, listener = served_render(args.seconds, args.size, args.render_args, work, paced=args.paced)
    figures: dict = {"seconds": args.seconds, "paced": args.paced, "viewers": args.viewers,
                     "viewers_nice": args.viewers_nice, "render_args": args.render_args,
                     "load_at_start": os.getloadavg()}
    start = time.time()
    log_path = work / "render.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        while not (found := re.search(r"http://\S+/", log_path.read_text())):
            if proc.poll() is not None:
                sys.exit(log_path.read_text())
            time.sleep(0.01)
        url = found.group(0)
        handovers = Handovers(url)
        client = None
        if args.viewers:
            client = subprocess.Popen(["nice", "-n", str(args.viewers_nice), sys.executable, __file__,
                                       "--seconds", str(args.seconds), "--client", url, str(args.viewers),
                                       str(work / "viewers.json")])
        rss, render_cpu, client_cpu, sender_cpu = [], None, None, 0.0
        # (the server stays up while it is asked for status.json: --serve-linger)
        while proc.poll() is None and not (handovers.last.get("ended")
                                           and (client is None or client.poll() is not None)):
            time.sleep(2)
            senders = children(proc.pid, "rtc_process")
            mb = rss_mb(proc.pid)
            rss.append((time.time() - start, mb and mb + sum(rss_mb(k) or 0.0 for k in senders)))
            render_cpu = cpu_s(proc.pid) or render_cpu
            sender_cpu = max(sender_cpu, sum(cpu_s(k) or 0.0 for k in senders))
            if client is not None:
                client_cpu = cpu_s(client.pid) or client_cpu
        handovers.stop.set()
        handovers.join()
        proc.wait(timeout=60)
        if client is not None:
            client.wait(timeout=120)
            figures["viewers_cpu_s"] = client_cpu
    wall = time.time() - start
    summary = [ln for ln in log_path.read_text().splitlines() if ln.startswith("Streamed")]
    speed = re.search(r"([\d.]+) fps generated, ([\d.]+)x real time", summary[-1]) if summary else None
    after = [(t, m) for t, m in rss if t >= 60 and m]
    slope = None
    if len(after) > 10:
        mt, mm = sum(t for t, _ in after) / len(after), sum(m for _, m in after) / len(after)
        slope = sum((t - mt) * (m - mm) for t, m in after) / max(1e-9, sum((t - mt) ** 2 for t, _ in after)) * 60
    figures.update(
        wall_s=round(wall, 1), summary=summary[-1] if summary else log_path.read_text()[-500:],
        generated_fps=float(speed.group(1)) if speed else None, realtime=float(speed.group(2)) if speed else None,
        render_cpu_s=render_cpu, sender_cpu_s=round(sender_cpu, 2), load_at_end=os.getloadavg(),
        frames_sent=handovers.last.get("frames_sent"), gops_skipped=handovers.last.get("dropped_gops"),
        rss_mb={"after_60_s": round(after[0][1]) if after else None,
                "last": next((round(m) for _, m in reversed(rss) if m), None),
                "max": round(max((m for _, m in rss if m), default=0)),
                "slope_mb_per_min_after_60_s": None if slope is None else round(slope, 2)})
    if args.viewers:
        per = []
        for v in json.loads((work / "viewers.json").read_text()):
            frames = v["video"]
            first = v["first_frame"]
            delays = []
            if first is not None:
                fps = 25
                for ts, at in frames:
                    frame = first + round(ts * fps / VIDEO_CLOCK)
                    if (h := handovers.handed_at(frame)) is not None:
                        delays.append(at - h)
            span = frames[-1][1] - frames[0][1] if len(frames) > 1 else 0
            per.append({"frames": len(frames), "frames_sent_since_first": None if first is None else
                        handovers.sent_since(first), "first_frame": first, "lapses": v["lapses"],
                        "audio_packets": v["audio_packets"],
                        "fps": round((len(frames) - 1) / span, 2) if span else None,
                        "delay_s": {"median": round(percentile(delays, 0.5), 3),
                                    "p95": round(percentile(delays, 0.95), 3),
                                    "max": round(max(delays), 3)} if delays else None})
        figures["per_viewer"] = per
    return print_figures(figures, listener, args.json, proc)


if __name__ == "__main__":
    sys.exit(main())
