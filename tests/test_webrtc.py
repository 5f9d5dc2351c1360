"""WebRTC: the watch page played by Debian's Chromium (Playwright) over WHEP from ``--serve``, its fall-back
to HLS, and the hub's rules for a viewer that joins late or falls behind."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.live_util import env, render_cmd, speech

CHROMIUM = shutil.which("chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--autoplay-policy=no-user-gesture-required"]
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
SEEN = """() => { const v = document.getElementById('video');
    return {via: window.watch.via, frames: v.getVideoPlaybackQuality().totalVideoFrames, errors: window.watch.errors,
            audioTracks: v.srcObject ? v.srcObject.getAudioTracks().length : null,
            audioBytes: v.webkitAudioDecodedByteCount, delay: window.watch.delay,
            text: document.getElementById('via').textContent}; }"""
AUDIO_IN = """async () => { const s = await rtc.pc.getStats(); let n = 0;
    for (const r of s.values()) if (r.type === 'inbound-rtp' && r.kind === 'audio') n += r.packetsReceived;
    return n; }"""


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright (pip install -e '.[test]')")
    with sync_api.sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield context
        context.close()


def _serve(tmp: Path, seconds: float) -> tuple[subprocess.Popen, str]:
    audio = speech(tmp / "speech.wav", seconds)
    proc = subprocess.Popen(render_cmd("--audio", str(audio), "--serve", "0", "--serve-linger", "2", "-q",
                                       "video.width=128", "video.height=128"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    return proc, re.search(r"http://\S+", proc.stdout.readline()).group(0)


@pytest.mark.slow
@needs_browser
def test_the_page_plays_over_webrtc_with_two_viewers(tmp_path: Path, browser) -> None:
    pytest.importorskip("aiortc", reason="needs aiortc (pip install -e '.[webrtc]')")
    proc, url = _serve(tmp_path, 4.0)
    pages = [browser.new_page(), browser.new_page()]
    try:
        for page in pages:
            page.goto(url)
        for page in pages:
            page.wait_for_function("document.getElementById('video').getVideoPlaybackQuality().totalVideoFrames > 10",
                                   timeout=60_000)
        seen = [page.evaluate(SEEN) for page in pages]
        audio_packets = [page.evaluate(AUDIO_IN) for page in pages]
        with urllib.request.urlopen(url + "status.json", timeout=5) as r:
            status = json.load(r)
        for page in pages:  # (the browser may hold the last frame back: the page still sees the end)
            page.bring_to_front()  # (a page in the background is not drawn: no frame is shown there)
            page.wait_for_function("window.watch.ended", timeout=60_000)
        players = [page.evaluate("document.getElementById('player').textContent") for page in pages]
    finally:
        for page in pages:
            page.close()
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
    for s, packets in zip(seen, audio_packets):
        assert s["via"] == "webrtc" and s["text"] == "WebRTC", s
        assert s["frames"] > 10 and s["audioTracks"] == 1 and packets > 0, (s, packets)
        assert s["delay"] is not None and s["delay"] >= 0
    assert status["webrtc"]["viewers"] == 2 and "first_frame" not in status["webrtc"]  # (its viewer's own only)
    assert players == ["0:04 (ended)"] * 2, players  # (the video's own clock, not the connection's)


@pytest.mark.slow
@needs_browser
def test_a_render_stopped_at_once_while_watched_removes_its_watch_folder(tmp_path: Path, browser) -> None:
    """Two SIGTERMs while a viewer watches: the render stops at once, and the folder of the segments it served
    goes with it (the server's closing, which waits for its viewers, was cut short before the folder's removal)."""
    pytest.importorskip("aiortc", reason="needs aiortc (pip install -e '.[webrtc]')")
    temp = tmp_path / "tmp"
    temp.mkdir()
    audio = speech(tmp_path / "speech.wav", 8.0)
    proc = subprocess.Popen(render_cmd("--audio", str(audio), "--serve", "0", "-q"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**env(), "TMPDIR": str(temp)})
    url = re.search(r"http://\S+", proc.stdout.readline()).group(0)
    page = browser.new_page()
    try:
        page.goto(url)
        page.wait_for_function("document.getElementById('video').getVideoPlaybackQuality().totalVideoFrames > 10",
                               timeout=60_000)
        watched = [p.name for p in temp.iterdir()]
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        page.close()
        if proc.poll() is None:
            proc.kill()
    assert any(name.startswith("avatar-render-live-") for name in watched), watched
    assert list(temp.iterdir()) == [], proc.stdout.read()


@pytest.mark.slow
@needs_browser
def test_the_page_falls_back_to_hls_when_webrtc_is_refused(tmp_path: Path, browser) -> None:
    proc, url = _serve(tmp_path, 4.0)
    page = browser.new_page()
    page.route("**/whep", lambda route: route.fulfill(status=503, body="no WebRTC here"))
    try:
        page.goto(url)
        page.wait_for_function("document.getElementById('video').getVideoPlaybackQuality().totalVideoFrames > 10",
                               timeout=60_000)
        seen = page.evaluate(SEEN)
    finally:
        page.close()
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
    assert seen["via"] == "hls" and seen["text"] == "HLS", seen
    assert "webrtc: whep answered 503" in seen["errors"]
    assert seen["frames"] > 10 and seen["audioBytes"] > 0


class _Track:
    def __init__(self, limit: int) -> None:
        self.queue: asyncio.Queue = asyncio.Queue(limit)


def test_a_viewer_starts_at_a_keyframe_and_one_that_falls_behind_waits_for_the_next() -> None:
    pytest.importorskip("aiortc", reason="needs aiortc (pip install -e '.[webrtc]')")
    from avatar_render.io.live.webrtc import _Item, _Viewer

    viewer = _Viewer(None, _Track(3), _Track(10))

    def item(frame: int, key: bool = False, video: bool = True) -> _Item:
        return _Item(frame / 25, object(), video, key, frame if video else -1)

    for i in (7, 8):  # joined mid-GOP: nothing until a keyframe
        viewer.offer(item(i))
    viewer.offer(item(8, video=False))
    assert viewer.video.queue.empty() and viewer.audio.queue.empty() and viewer.first_frame is None
    viewer.offer(item(10, key=True))
    viewer.offer(item(10, video=False))
    viewer.offer(item(11))
    assert viewer.first_frame == 10 and viewer.video.queue.qsize() == 2 and viewer.audio.queue.qsize() == 1
    viewer.offer(item(12))
    viewer.offer(item(13))  # its queue is full (it is behind): what it holds goes, it waits for a keyframe
    assert viewer.waiting and viewer.drops == 1 and viewer.video.queue.empty() and viewer.audio.queue.empty()
    viewer.offer(item(14))
    assert viewer.video.queue.empty()
    viewer.offer(item(20, key=True))
    assert not viewer.waiting and viewer.video.queue.qsize() == 1 and viewer.first_frame == 10


def test_the_stream_waits_for_a_viewer_on_its_way_then_makes_up_the_wait_at_a_keyframe() -> None:
    """The page was asked for: the first frame is held until its viewer is connected, so that it sees
    frame 0; the time held is made up at the next keyframe (the frames before it skipped)."""
    pytest.importorskip("aiortc", reason="needs aiortc (pip install -e '.[webrtc]')")
    import time
    from types import SimpleNamespace

    from avatar_render.io.live.webrtc import WebRtcHub, _Item, _Viewer

    def items(frames: range, key: int) -> list:
        return [_Item(f / 25, f, True, f == key, f) for f in frames]

    hub = WebRtcHub(host="127.0.0.1", buffer_s=10, say=lambda *m: None)
    pc = SimpleNamespace(connectionState="new")
    viewer = _Viewer(pc, _Track(100), _Track(100))
    try:
        hub.coming()
        hub._loop.run(asyncio.sleep(0), timeout=10)  # (its aiortc import is done)
        hub._viewers["v"] = viewer
        hub._loop.soon(hub._append, items(range(10), key=0))
        time.sleep(0.3)
        assert hub.sent_frame == -1 and viewer.video.queue.empty()  # held while the viewer connects

        async def connect_then_more() -> None:
            pc.connectionState = "connected"
            while hub.sent_frame < 0:
                await asyncio.sleep(0.001)
            hub._append(items(range(10, 20), key=10))  # the next GOP comes while frame 1 waits for its time

        hub._loop.run(connect_then_more(), timeout=10)
        deadline = time.monotonic() + 10
        while hub.sent_frame < 19 and time.monotonic() < deadline:
            time.sleep(0.05)
        got = [viewer.video.queue.get_nowait() for _ in range(viewer.video.queue.qsize())]
    finally:
        hub._viewers.clear()  # (no peer connection to close)
        hub.shutdown()
    assert got == [0, *range(10, 20)] and viewer.first_frame == 0


class WhipEndpoint:
    """A WHIP endpoint on the loopback built here on aiortc (Debian has no WHIP server to run): it
    answers an offer with 201, decodes what arrives and counts the video frames and audio samples."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from avatar_render.io.live.rtc_loop import RtcLoop

        self.loop = RtcLoop("whip-endpoint")
        self.frames, self.samples, self.sizes, self.deleted = 0, 0, set(), False
        self.pcs: list = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                offer = self.rfile.read(int(self.headers["Content-Length"])).decode()
                answer = endpoint.loop.run(endpoint._answer(offer), timeout=10)
                self.send_response(201)
                self.send_header("Content-Type", "application/sdp")
                self.send_header("Location", "/whip/session")
                self.end_headers()
                self.wfile.write(answer.encode())

            def do_DELETE(self) -> None:  # noqa: N802
                endpoint.deleted = True
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"whip://127.0.0.1:{self.httpd.server_address[1]}/whip"

    async def _answer(self, offer: str) -> str:
        from aiortc import RTCSessionDescription
        from aiortc.mediastreams import MediaStreamError

        from avatar_render.io.live.rtc_loop import peer_connection

        pc = peer_connection(["127.0.0.1"])
        self.pcs.append(pc)

        async def take(track) -> None:
            try:
                while True:
                    frame = await track.recv()
                    if track.kind == "video":
                        self.frames += 1
                        self.sizes.add((frame.width, frame.height))
                    else:
                        self.samples += frame.samples
            except MediaStreamError:
                pass

        pc.on("track", lambda track: asyncio.ensure_future(take(track)))
        await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        return pc.localDescription.sdp

    def close(self) -> None:
        async def close_all() -> None:
            for pc in self.pcs:
                await pc.close()

        self.loop.close(close_all)
        self.httpd.shutdown()


@pytest.mark.slow
def test_whip_push_reaches_an_endpoint_frames_and_audio(tmp_path: Path) -> None:
    pytest.importorskip("aiortc", reason="needs aiortc (pip install -e '.[webrtc]')")
    endpoint = WhipEndpoint()
    audio = speech(tmp_path / "speech.wav", 3.0)
    try:
        result = subprocess.run(render_cmd("--audio", str(audio), "--live", endpoint.url, "-q", "--preroll", "0.2",
                                           "video.width=128", "video.height=128"),
                                capture_output=True, text=True, env=env(), timeout=120)
    finally:
        endpoint.close()
    assert result.returncode == 0, result.stderr
    assert endpoint.deleted  # the session was ended at the endpoint
    assert endpoint.sizes == {(128, 128)}
    assert endpoint.frames >= 70, endpoint.frames  # 75 sent; RTP on the loopback may lose one under load
    assert endpoint.samples >= 2.5 * 48000, endpoint.samples  # 3 s of audio, less the jitter buffer's last frames


def test_a_refused_whip_endpoint_is_one_sentence(tmp_path: Path) -> None:
    pytest.importorskip("aiortc", reason="needs aiortc (pip install -e '.[webrtc]')")
    from tests.live_util import free_port

    port = free_port()
    audio = speech(tmp_path / "speech.wav", 1.0)
    result = subprocess.run(render_cmd("--audio", str(audio), "--live", f"http://127.0.0.1:{port}/whip",
                                       "video.width=64", "video.height=64"),
                            capture_output=True, text=True, env=env(), timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"Error: Could not connect to the live target http://127.0.0.1:{port}/whip: "
                                     "connection refused.")


async def _viewer_offer() -> str:
    """A receive-only offer, as the watch page makes."""
    from avatar_render.io.live.rtc_loop import peer_connection

    pc = peer_connection(["127.0.0.1"])
    pc.addTransceiver("video", direction="recvonly")
    pc.addTransceiver("audio", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    await pc.close()
    return pc.localDescription.sdp


def test_whep_answers_an_offer_hangs_up_and_refuses_garbage(tmp_path: Path) -> None:
    pytest.importorskip("aiortc", reason="needs aiortc (pip install -e '.[webrtc]')")
    from avatar_render.io.live.rtc_loop import RtcLoop
    from avatar_render.io.live.server import WatchServer
    from avatar_render.io.live.webrtc import WebRtcHub

    def call(url: str, method: str, body: bytes = b"") -> tuple[int, dict, bytes]:
        request = urllib.request.Request(url, data=body or None, method=method,
                                         headers={"Content-Type": "application/sdp"})
        try:
            with urllib.request.urlopen(request, timeout=15) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    client = RtcLoop("whep-client")
    messages: list = []
    hub = WebRtcHub(host="127.0.0.1", buffer_s=10, say=lambda *m: messages.append(m))
    server = WatchServer("127.0.0.1", 0, tmp_path, "live.m3u8", served=frozenset, webrtc=hub)
    plain = WatchServer("127.0.0.1", 0, tmp_path, "live.m3u8", served=frozenset)
    try:
        sdp = client.run(_viewer_offer(), timeout=15)
        code, headers, answer = call(server.url + "whep", "POST", sdp.encode())
        assert code == 201 and headers["Content-Type"] == "application/sdp", (code, answer)
        assert "H264" in answer.decode() and "opus" in answer.decode()
        assert "a=candidate" in answer.decode() and "127.0.0.1" in answer.decode()
        with urllib.request.urlopen(server.url + "status.json", timeout=5) as r:
            assert json.load(r)["webrtc"]["viewers"] == 1
        session = headers["Location"].rsplit("/", 1)[1]
        with urllib.request.urlopen(server.url + "status.json?session=" + session, timeout=5) as r:
            assert json.load(r)["webrtc"]["first_frame"] is None  # (no frame sent yet)
        assert call(server.url + headers["Location"].lstrip("/"), "DELETE")[0] == 200
        assert call(server.url + headers["Location"].lstrip("/"), "DELETE")[0] == 404
        assert hub.status()["viewers"] == 0
        assert call(server.url + "whep", "POST", b"v=0 not an offer")[0] == 503
        assert call(plain.url + "whep", "POST", sdp.encode())[0] == 501  # no WebRTC: the page plays HLS
    finally:
        server.close()
        plain.close()
        client.close()


def test_the_viewers_process_answers_offers_and_is_given_up_once_when_it_ends() -> None:
    """The viewers are served by a child process: an offer is answered there and its figures come back;
    a child that ends is given up with one warning, and then offers are refused (the page plays HLS)
    while the writer's calls go on without waiting."""
    pytest.importorskip("aiortc", reason="needs aiortc (pip install -e '.[webrtc]')")
    import os
    import time

    from avatar_render.io.live.rtc_loop import RtcLoop
    from avatar_render.io.live.rtc_process import WebRtcProcess
    from avatar_render.io.live.webrtc import Refused

    def until(test, what: str) -> None:
        deadline = time.monotonic() + 20
        while not test():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    client = RtcLoop("whep-client")
    messages: list = []
    viewers = WebRtcProcess(host="127.0.0.1", buffer_s=10, say=lambda *m: messages.append(m))
    try:
        sdp = client.run(_viewer_offer(), timeout=15)
        session, answer = viewers.answer(sdp)
        assert "H264" in answer and "opus" in answer
        assert viewers._proc.pid != os.getpid()
        until(lambda: viewers.status()["viewers"] == 1, "the child's figures never came")
        assert viewers.status(session)["first_frame"] is None
        assert viewers.hang_up(session) and not viewers.hang_up(session)
        until(lambda: viewers.status()["viewers"] == 0, "the hang-up never showed")

        viewers._proc.kill()  # (the child, started by this test)
        until(lambda: messages, "no warning when the child ended")
        with pytest.raises(Refused, match="the viewers' process ended"):
            viewers.answer(sdp)
        viewers.coming()
        viewers.close()
        time.sleep(0.2)
        assert messages == [("warning", "live: WebRTC: the viewers' process ended; the page plays HLS instead.")]
    finally:
        viewers.shutdown()
        client.close()
