"""Live publishing against real servers on the loopback, started here: an RTMP listener and an SRT
listener (the ffmpeg command), the built-in HLS server followed by FFmpeg's HLS demuxer and played by
Chromium (Playwright). Each checks that the first frame reached the viewer before the render ended,
that every frame and the whole audio arrived, that audio and video end within a frame of each other,
that timestamps only grow and that every segment (GOP) starts on a keyframe."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from avatar_render.io.encoder import ChunkEncoder
from avatar_render.io.fmp4 import MuxerState
from avatar_render.io.live.push import Pacing, PushSink
from avatar_render.io.live.targets import parse_target
from avatar_render.io.live.wire import OPEN_TIMEOUT_S
from avatar_render.io.spec import WriterSpec
from tests.live_util import (
    FFMPEG,
    env,
    free_port,
    held_render,
    needs_ffmpeg,
    probe,
    render_cmd,
    speech,
    wait_listening,
    wait_until,
)

FPS = 25.0
FRAME = 1 / FPS
CHROMIUM = shutil.which("chromium")


def _listener(*args: str) -> subprocess.Popen:
    """An ffmpeg listener (its URL among ``args``), once it listens."""
    proc = subprocess.Popen([FFMPEG, "-hide_banner", "-loglevel", "error", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = next(a for a in args if "://" in a)
    wait_listening(int(re.search(r":(\d+)", url.split("://", 1)[1]).group(1)), udp=url.startswith("srt"))
    return proc


def _check(received, file) -> None:
    """``received`` holds the file's packets: every frame and every audio packet, the same keyframes (a
    GOP, a segment, starts on each), timestamps that only grow, audio placed against the video as in the
    file (to the millisecond FLV keeps), and the file's audio and video end within a frame of each other."""
    assert received.frames == file.frames
    assert received.audio_packets == file.audio_packets
    assert received.keyframes == file.keyframes
    assert received.monotonic
    assert abs((received.audio_last - received.video_last) - (file.audio_last - file.video_last)) < 0.002
    assert abs(file.audio_end - file.video_end) < FRAME, (file.audio_end, file.video_end)


def _render(tmp: Path, seconds: float, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    audio = speech(tmp / "speech.wav", seconds)
    return subprocess.run(render_cmd("--audio", str(audio), *args), capture_output=True, text=True, env=env(),
                          timeout=timeout)


@pytest.mark.slow
@needs_ffmpeg
def test_rtmp_listener_gets_every_frame_paced_while_rendering(tmp_path: Path) -> None:
    port = free_port()
    url = f"rtmp://127.0.0.1:{port}/live/test"
    got = tmp_path / "got.flv"
    listener = _listener("-listen", "1", "-probesize", "32768", "-analyzeduration", "0", "-i", url, "-c", "copy",
                         "-flush_packets", "1", "-y", str(got))
    out, go = tmp_path / "out.mp4", tmp_path / "go"
    audio = speech(tmp_path / "speech.wav", 6.0)
    start = time.monotonic()
    render = held_render(go, 4, "--audio", str(audio), "-o", str(out), "--live", url, "-q", "video.width=128",
                         "video.height=128")
    try:  # seen while the render is held before its fourth chunk (3.8 s published), so before it ended
        wait_until(lambda: got.exists() and got.stat().st_size >= 4096, render)
        assert not out.exists() and not go.exists()
    finally:
        go.touch()
    _, stderr = render.communicate(timeout=240)
    assert render.returncode == 0, stderr
    listener.wait(timeout=30)
    file = probe(str(out), FPS)
    assert file.frames == 150
    _check(probe(str(got), FPS), file)
    assert time.monotonic() - start >= 6.0  # paced at wall-clock speed: six seconds of video take six seconds


@pytest.mark.slow
@needs_ffmpeg
def test_srt_listener_gets_every_frame(tmp_path: Path) -> None:
    """The listener has the stream's first bytes while the render is held before its fourth chunk (N0, N1,
    I0 published: 3.8 s), so before the output exists; no clock is compared."""
    port = free_port(2)  # UDP
    got = tmp_path / "got.ts"
    listener = _listener("-probesize", "32768", "-analyzeduration", "0", "-i", f"srt://127.0.0.1:{port}?mode=listener",
                         "-c", "copy", "-f", "mpegts", "-flush_packets", "1", "-y", str(got))
    out, go = tmp_path / "out.mp4", tmp_path / "go"
    audio = speech(tmp_path / "speech.wav", 5.0)
    render = held_render(go, 4, "--audio", str(audio), "-o", str(out), "--live", f"srt://127.0.0.1:{port}", "-q",
                         "video.width=128", "video.height=128")
    try:
        wait_until(lambda: got.exists() and got.stat().st_size >= 4096, render)
        assert not out.exists() and not go.exists()  # the render is still held
    finally:
        go.touch()
    _, stderr = render.communicate(timeout=240)
    assert render.returncode == 0, stderr
    listener.wait(timeout=30)
    _check(probe(str(got), FPS), probe(str(out), FPS))


@pytest.mark.slow
@needs_ffmpeg
def test_served_hls_followed_by_ffmpeg_while_rendering(tmp_path: Path) -> None:
    audio = speech(tmp_path / "speech.wav", 12.0)
    out, go = tmp_path / "out.mp4", tmp_path / "go"
    # held before its third chunk: the viewer gets the playlist while the render cannot have ended
    proc = held_render(go, 3, "--audio", str(audio), "-o", str(out), "--serve", "0", "--serve-linger", "5", "-q",
                       "chunk.transition_frames=0")  # 2 s chunks, each a segment
    url = re.search(r"http://\S+", proc.stdout.readline()).group(0)
    copy = tmp_path / "copy.mkv"
    try:
        wait_until(lambda: _get(url + "live/live.m3u8"), proc)  # the playlist appears with its first segment
        assert not out.exists() and not go.exists()
    finally:
        go.touch()
    follower = subprocess.run([FFMPEG, "-hide_banner", "-loglevel", "verbose", "-live_start_index", "0", "-i",
                               url + "live/live.m3u8",
                               "-c", "copy", "-y", str(copy)], capture_output=True, text=True, timeout=120)
    assert follower.returncode == 0, follower.stderr[-2000:]
    assert proc.wait(timeout=60) == 0, proc.communicate()
    _check(probe(str(copy), FPS), probe(str(out), FPS))
    opened = re.findall(r"Opening '([^']+\.m4s)' for reading", follower.stderr)
    assert opened[0].endswith("live-000000000.m4s") and len(opened) == 6  # a 2-s segment per GOP, each once


def _get(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
def test_watch_page_plays_in_chromium_while_rendering(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright (pip install -e '.[test]')")
    audio = speech(tmp_path / "speech.wav", 16.0)
    out, go = tmp_path / "out.mp4", tmp_path / "go"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update",
             "--disable-sync", "--no-first-run", "--autoplay-policy=no-user-gesture-required"]
    with sync_api.sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        browser = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=flags)
        page = browser.new_page()
        page.route("**/whep", lambda route: route.fulfill(status=503))  # the HLS player (WebRTC: test_webrtc.py)
        # held before its fourth chunk: the first frame shows while the render cannot have ended
        proc = held_render(go, 4, "--audio", str(audio), "-o", str(out), "--serve", "0", "--serve-linger", "2", "-q")
        url = re.search(r"http://\S+", proc.stdout.readline()).group(0)
        try:
            page.goto(url)
            page.wait_for_function("window.watch.firstFrameAt !== null", timeout=120_000)  # (a hang guard)
            assert not out.exists() and not go.exists()
        finally:
            go.touch()
        page.evaluate("document.getElementById('video').playbackRate = 2")  # (a quicker test)
        page.wait_for_function("window.watch.ended", timeout=120_000)
        seen = page.evaluate("""() => { const v = document.getElementById('video');
            const q = v.getVideoPlaybackQuality();
            return {first: window.watch.firstFrameAt, frames: q.totalVideoFrames, duration: v.duration,
                    buffered: v.buffered.end(v.buffered.length - 1), audio: v.webkitAudioDecodedByteCount,
                    errors: window.watch.errors}; }""")
        browser.close()
    assert proc.wait(timeout=60) == 0, proc.communicate()
    assert seen["frames"] == 400  # every frame decoded
    assert abs(seen["duration"] - 16.0) < FRAME and abs(seen["buffered"] - 16.0) < 2 * FRAME
    assert seen["audio"] > 0
    assert "fragParsingError" not in seen["errors"] and "bufferAppendError" not in seen["errors"]


@needs_ffmpeg
def test_fragmented_mp4_on_standard_output(tmp_path: Path) -> None:
    out = tmp_path / "out.mp4"
    audio = speech(tmp_path / "speech.wav", 4.0)
    piped = tmp_path / "piped.mp4"
    with piped.open("wb") as sink:
        result = subprocess.run(render_cmd("--audio", str(audio), "-o", str(out), "--live", "-", "video.width=64",
                                           "video.height=64"),
                                stdout=sink, stderr=subprocess.PIPE, text=True, env=env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Wrote" in result.stderr  # the human text moved to stderr
    _check(probe(str(piped), FPS), probe(str(out), FPS))


@needs_ffmpeg
def test_a_refusing_server_is_one_sentence(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = _render(tmp_path, 2.0, "--live", f"rtmp://127.0.0.1:{port}/live/key", "video.width=64", "video.height=64")
    assert result.returncode == 1
    assert result.stderr.strip() == (f"Error: Could not connect to the live target rtmp://127.0.0.1:{port}/live/…: "
                                     "connection refused.")


@pytest.mark.slow
def test_a_server_that_never_answers_the_handshake_is_one_sentence(tmp_path: Path) -> None:
    """A listener that accepts the TCP connection and then says nothing (a web server on the port, say):
    the render gives up on it after the handshake's time-out instead of waiting for ever."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.extend(server.accept() for _ in range(1)), daemon=True).start()
    try:
        port = server.getsockname()[1]
        result = _render(tmp_path, 2.0, "--live", f"rtmp://127.0.0.1:{port}/live/key", "video.width=64",
                         "video.height=64")
    finally:
        server.close()
    assert result.returncode == 1 and len(accepted) == 1, result.stderr
    assert result.stderr.strip() == (f"Error: Could not connect to the live target rtmp://127.0.0.1:{port}/live/…: "
                                     f"the server did not take the stream within {OPEN_TIMEOUT_S:g} s (it did not "
                                     "answer, or accepted the connection but not the RTMP handshake).")


@pytest.mark.slow
def test_bad_targets_and_options_are_one_sentence(tmp_path: Path) -> None:
    cases = {("--live", "http://x/y"): "http:// is not supported",
             ("--live", "out.flv"): "is not a live target",
             ("--live", "rtmp://127.0.0.1/nokey"): "must be rtmp://host[:port]/app/key",
             ("--live", str(tmp_path / "no" / "x.m3u8")): "does not exist",
             ("--serve", "80x"): "must be PORT or ADDR:PORT",
             ("--live", "-", "--live", "-"): "only once",
             ("--live", "-", "--underrun", "wait"): "is not one of stall, hold, preroll",
             ("--live", "-", "--resume"): "--resume needs -o"}
    for args, words in cases.items():
        result = _render(tmp_path, 1.0, *args, "video.width=64", "video.height=64", timeout=60)
        assert (result.returncode == 1 and words in result.stderr
                and "Traceback" not in result.stderr), (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.slow
@needs_ffmpeg
def test_ctrl_c_ends_every_stream_cleanly_and_hls_continues_on_resume(tmp_path: Path) -> None:
    audio = speech(tmp_path / "speech.wav", 12.0)
    out, playlist = tmp_path / "out.mp4", tmp_path / "hls" / "live.m3u8"
    playlist.parent.mkdir()
    args = ["--audio", str(audio), "-o", str(out), "--live", str(playlist), "-q", "--live-buffer", "1",
            "chunk.transition_frames=0",  # 2 s chunks, each a segment
            "--serve", "0", "--live", f"rtmp://127.0.0.1:{free_port()}/live/k"]
    # a paced push target slows the render to real time, so that it can be stopped half-way
    port = int(args[-1].split(":")[2].split("/")[0])
    listener = _listener("-listen", "1", "-i", args[-1], "-c", "copy", "-f", "null", "-")
    go = tmp_path / "go"
    proc = held_render(go, 4, *args)  # held before its fourth chunk: stopped half-way, whatever the machine's speed
    try:
        wait_until(lambda: playlist.exists() and playlist.read_text().count("#EXTINF") >= 2, proc)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: to the render's whole process group
    finally:
        go.touch()
    assert proc.wait(timeout=60) == 130, proc.communicate()
    said = proc.communicate()[1]  # the stop alone: its streams and their children ended by the render
    assert "lost the connection" not in said and "WebRTC" not in said, said
    listener.wait(timeout=30)
    stopped = playlist.read_text()
    assert "#EXT-X-ENDLIST" in stopped and not out.exists()
    listener = _listener("-listen", "1", "-i", f"rtmp://127.0.0.1:{port}/live/k", "-c", "copy", "-f", "null", "-")
    resumed = subprocess.run(render_cmd(*args, "--resume"), capture_output=True, text=True, env=env(), timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    listener.wait(timeout=30)
    text = playlist.read_text()
    assert text.startswith(stopped.replace("#EXT-X-ENDLIST\n", ""))  # appended to, not rewritten
    assert text.count("#EXT-X-ENDLIST") == 1 and text.count("#EXTINF") == 6
    _check(probe(str(playlist), FPS), probe(str(out), FPS))


# The push sink alone, fed by hand with a gap longer than the media it has: the underrun policies.

def _fragments(spec: WriterSpec, chunks: int, frames: int):
    encoder = ChunkEncoder(spec)
    rng = np.random.default_rng(0)
    for _k in range(chunks):
        n = round(frames * spec.audio_rate / spec.fps)
        yield encoder, encoder.encode(rng.integers(0, 256, (frames, spec.height, spec.width, 3), dtype=np.uint8),
                                      0.1 * rng.standard_normal((1, n)).astype(np.float32), opens_gop=True)
    yield encoder, encoder.finish(at_gop_start=True)


@pytest.mark.slow
@needs_ffmpeg
@pytest.mark.parametrize("policy", ["stall", "hold", "preroll"])
def test_underrun_policies_against_a_listener(tmp_path: Path, policy: str) -> None:
    spec = WriterSpec(None, 64, 48, Fraction(25), audio_rate=16000, audio_channels=1)
    url = f"rtmp://127.0.0.1:{free_port()}/live/policy"
    got = tmp_path / "got.flv"
    listener = _listener("-listen", "1", "-i", url, "-c", "copy", "-y", str(got))
    messages = []
    sink = PushSink(parse_target(url), Pacing(policy=policy, preroll_s=0.2), spec=spec,
                    say=lambda level, text: messages.append(text), total_seconds=lambda: 4.0)
    for i, (encoder, fragment) in enumerate(_fragments(spec, 4, 25)):  # four 1-s chunks, 2 s apart: half real time
        if i == 0:
            sink.open(encoder.tracks, MuxerState(), first_frame=0)
        elif fragment.video:
            sink.end_gop()
            time.sleep(2.0)
        sink.write(fragment)
    sink.close()
    listener.wait(timeout=30)
    received = probe(str(got), 25.0)  # (FLV has no durations: the last AAC frame counts whole, as it is at 16 kHz)
    assert received.monotonic and abs(received.audio_last + 1024 / 16000 - received.video_end) < 1 / 25
    s = sink.stats
    if policy == "stall":
        assert received.frames == 100 and s.stalls >= 1 and s.stalled_s > 0.5
    elif policy == "hold":  # the last frame (and silence) filled the waits, whole GOPs of it
        assert s.held_s >= 0.5 and received.frames == 100 + round(s.held_s * 25) and s.stalls == 0
        assert any("hold" in m for m in messages)
    else:  # started late enough to play through: no stall
        assert received.frames == 100 and s.stalls == 0 and s.preroll_s > 1.0
        assert any("pre-roll" in m for m in messages)


def test_a_live_preview_render_starts_with_a_short_chunk_a_file_render_does_not() -> None:
    from avatar_render.config import load_config
    from avatar_render.job.live import LIVE_FIRST_FRAMES, live_request
    from avatar_render.job.request import LiveOptions, RenderRequest

    def first(live: LiveOptions, *overrides: str) -> int:
        request = RenderRequest(reference="face.png", audio="talk.wav", output="out.mp4",
                                config=load_config(None, overrides), live=live)
        return live_request(request).config.chunk.first_frames

    assert first(LiveOptions(serve="0")) == first(LiveOptions(targets=("-",))) == LIVE_FIRST_FRAMES
    assert first(LiveOptions()) == 0  # a file render: its bytes stay as they were
    assert first(LiveOptions(serve="0"), "chunk.first_frames=20") == 20  # set by hand: kept
    assert first(LiveOptions(serve="0"), "chunk.chunk_frames=8", "chunk.transition_frames=0") == 0  # short anyway


def test_a_sessions_push_schedule_counts_from_its_clock_not_from_its_first_packet() -> None:
    """A real-time session's first packet comes after the render's set-up: the schedule is the session's
    clock plus the pre-roll (a late packet goes out as it comes), never the first packet plus the pre-roll."""
    spec = WriterSpec(None, 64, 48, Fraction(25), audio_rate=16000, audio_channels=1)
    clock = time.monotonic() - 1.5  # the session's time 0 was 1.5 s ago
    encoder, fragment = next(_fragments(spec, 1, 25))
    on_clock = PushSink(parse_target("rtmp://127.0.0.1:1/live/x"), Pacing(preroll_s=0.2, origin=lambda: clock),
                        spec=spec, say=lambda level, text: None)
    on_clock._start(fragment, time.monotonic())
    assert on_clock._due(on_clock._video_pts(0)) == pytest.approx(clock + 0.2)
    assert on_clock._due(on_clock._video_pts(25)) == pytest.approx(clock + 1.2)  # (due: it goes out at once)
    plain = PushSink(parse_target("rtmp://127.0.0.1:1/live/x"), Pacing(preroll_s=0.2), spec=spec,
                     say=lambda level, text: None)
    before = time.monotonic()
    plain._start(fragment, before)
    assert plain._due(plain._video_pts(0)) >= before + 0.2  # (a render's stream: from its first packet)


@pytest.mark.slow
@needs_ffmpeg
def test_a_dropped_connection_is_retried_and_the_file_completes(tmp_path: Path) -> None:
    port = free_port()
    url = f"rtmp://127.0.0.1:{port}/live/drop"
    got = tmp_path / "a.flv"
    first = _listener("-listen", "1", "-probesize", "32768", "-analyzeduration", "0", "-i", url, "-c", "copy",
                      "-flush_packets", "1", "-y", str(got))
    audio = speech(tmp_path / "speech.wav", 8.0)
    out, go = tmp_path / "out.mp4", tmp_path / "go"
    # held before its fourth chunk: the stream is cut and the server back before the render can have ended
    proc = held_render(go, 4, "--audio", str(audio), "-o", str(out), "--live", url, "--live-buffer", "1",
                       "video.width=64", "video.height=64")
    try:
        wait_until(lambda: got.exists() and got.stat().st_size >= 1024, proc)  # streaming to the first server
        first.kill()  # the server goes away mid-stream ...
        first.wait()
        second = _listener("-listen", "1", "-i", url, "-c", "copy", "-y", str(tmp_path / "b.flv"))  # ... comes back
    finally:
        go.touch()
    said, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    second.wait(timeout=30)
    assert "lost the connection" in err and "reconnected" in said
    assert probe(str(out), FPS).frames == 200  # the record is whole
    again = probe(str(tmp_path / "b.flv"), FPS)
    assert again.frames > 0 and again.keyframes[0] == 0 and again.monotonic  # goes on at a keyframe
