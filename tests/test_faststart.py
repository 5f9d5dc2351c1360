"""remux_faststart: the writer's fragmented file as a regular MP4 with its index in front, packet for
packet what FFmpeg's own stream copy makes of it, in memory that does not grow with the duration."""

from __future__ import annotations

import gc
import hashlib
import os
import shutil
import struct
import tempfile
import tracemalloc
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from avatar_render.errors import AvatarRenderError
from avatar_render.io import faststart
from avatar_render.io.writer import Mp4Writer, WriterSpec

W, H = 64, 48
CHROMIUM = shutil.which("chromium")


def _fragmented(path: Path, sizes: list[int], *, fps: Fraction = Fraction(25), rate: int = 16000,
                channels: int = 1, gop_seconds: float = 0.5) -> Path:
    """A writer's fragmented file: one fragment per chunk of ``sizes`` frames, with their audio."""
    rng = np.random.default_rng(0)
    spec = WriterSpec(path=path, width=W, height=H, fps=fps, audio_rate=rate, audio_channels=channels,
                      gop_seconds=gop_seconds)
    with Mp4Writer(spec) as writer:
        start = 0
        for size in sizes:
            x = (np.arange(W)[None, :, None] * 4 + 7 * (start + np.arange(size))[:, None, None]) % 256
            frames = (x[:, None] + rng.integers(0, 16, (size, H, W, 3))).astype(np.uint8)  # (T, H, W, 3)
            a, b = round(start * rate / fps), round((start + size) * rate / fps)
            t = np.arange(a, b) / rate
            audio = np.stack([0.2 * np.sin(2 * np.pi * (220 + 110 * c) * t) for c in range(channels)])
            writer.put(frames, audio.astype(np.float32))  # (C, n)
            writer.boundary()
            start += size
        writer.close(faststart=False)
    return path


def _ffmpeg_copy(src: Path, dst: Path) -> Path:
    """The same file as FFmpeg's mp4 muxer writes it with movflags=faststart (the reference)."""
    with av.open(str(src)) as source, av.open(str(dst), "w", format="mp4", options={"movflags": "faststart"}) as out:
        streams = {s.index: out.add_stream_from_template(s) for s in source.streams}
        for packet in source.demux():
            if packet.dts is not None:
                packet.stream = streams[packet.stream.index]
                out.mux(packet)
    return dst


def _packets(path: Path) -> list[tuple]:
    """Every packet as FFmpeg reads it back, stream by stream (the two files interleave them
    differently): stream, pts, dts, duration, keyframe, data."""
    with av.open(str(path)) as c:
        packets = [(p.stream.type, p.pts, p.dts, p.duration, p.is_keyframe, hashlib.sha256(bytes(p)).hexdigest())
                   for p in c.demux() if p.dts is not None]
    return sorted(packets, key=lambda p: p[0])  # (a stable sort: each stream's packets keep their order)


def _timing(path: Path) -> tuple:
    with av.open(str(path)) as c:
        return (c.start_time, c.duration, [(s.start_time, s.duration, s.frames) for s in c.streams])


def _top_boxes(path: Path) -> list[tuple[bytes, int]]:
    data, pos, found = path.read_bytes(), 0, []
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if size == 1:
            size = struct.unpack(">Q", data[pos + 8 : pos + 16])[0]
        found.append((kind, size))
        pos += size
    return found


@pytest.mark.parametrize("rate, channels, fps", [(16000, 1, Fraction(25)), (44100, 2, Fraction(30000, 1001))])
def test_the_same_packets_and_timing_as_ffmpegs_stream_copy(tmp_path: Path, rate: int, channels: int,
                                                            fps: Fraction) -> None:
    src = _fragmented(tmp_path / "frag.mp4", [10, 7, 13, 10, 4, 9], fps=fps, rate=rate, channels=channels)
    reference = _ffmpeg_copy(src, tmp_path / "ffmpeg.mp4")
    ours = tmp_path / "ours.mp4"
    faststart.remux_faststart(src, ours)
    assert _packets(ours) == _packets(reference)
    assert len([p for p in _packets(ours) if p[0] == "video"]) == 53
    assert _timing(ours) == _timing(reference)
    boxes = _top_boxes(ours)
    assert [kind for kind, _ in boxes] == [b"ftyp", b"moov", b"mdat"]  # the index in front, no fragments
    assert b"mvex" not in ours.read_bytes()[: boxes[0][1] + boxes[1][1]]
    with av.open(str(ours)) as c:  # every frame decodes
        assert sum(1 for _ in c.decode(video=0)) == 53


def test_in_place_and_with_offsets_past_32_bits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = _fragmented(tmp_path / "frag.mp4", [10, 10, 10])
    reference = _packets(_ffmpeg_copy(src, tmp_path / "ffmpeg.mp4"))
    # As if the file were over 4 GB: the chunk offsets (co64) and the mdat's size (64 bits) widen.
    monkeypatch.setattr(faststart, "OFFSET_LIMIT", 2000)
    faststart.remux_faststart(src, src)
    assert _packets(src) == reference
    boxes = _top_boxes(src)
    assert [kind for kind, _ in boxes] == [b"ftyp", b"moov", b"mdat"]
    data = src.read_bytes()
    assert b"co64" in data[: boxes[0][1] + boxes[1][1]] and data[boxes[0][1] + boxes[1][1] :][:8] == b"\0\0\0\1mdat"
    assert sorted(os.listdir(tmp_path)) == ["ffmpeg.mp4", "frag.mp4"]


@pytest.mark.parametrize("cut", ["torn", "no_init"])
def test_a_file_that_is_not_whole_fragments_is_one_sentence(tmp_path: Path, cut: str) -> None:
    whole = _fragmented(tmp_path / "whole.mp4", [10, 10]).read_bytes()
    src = tmp_path / "src.mp4"
    src.write_bytes(whole[:-300] if cut == "torn" else whole[2000:])
    dst = tmp_path / "out.mp4"
    dst.write_bytes(b"theirs")
    with pytest.raises(AvatarRenderError, match=r"^Could not finish .*out\.mp4.* from .*src\.mp4.*: [a-z].*\.$") as err:
        faststart.remux_faststart(src, dst)
    assert "\n" not in str(err.value)
    assert dst.read_bytes() == b"theirs" and sorted(os.listdir(tmp_path)) == ["out.mp4", "src.mp4", "whole.mp4"]


def test_what_it_holds_does_not_grow_as_it_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faststart, "_TABLE_BUFFER", 64)  # (its buffers fill up to this, then are written)
    fragments, held, seen = faststart._fragments, np.zeros(1000, np.int64), [0]  # (allocated beforehand)

    def watched(*args):  # what is allocated at each fragment, with Python's free lists emptied
        for fragment in fragments(*args):
            gc.collect()
            held[seen[0]] = tracemalloc.get_traced_memory()[0]
            seen[0] += 1
            yield fragment

    monkeypatch.setattr(faststart, "_fragments", watched)
    src = _fragmented(tmp_path / "frag.mp4", [10] * 120, gop_seconds=10.0)  # 1200 frames, 1876 audio frames
    tracemalloc.start()
    try:
        faststart.remux_faststart(src, tmp_path / "out.mp4")
    finally:
        tracemalloc.stop()
    with av.open(str(tmp_path / "out.mp4")) as c:
        assert c.streams.video[0].frames == 1200
    n = seen[0] // 2  # two passes over the fragments (120, and one with the audio's end)
    assert n >= 120 and seen[0] == 2 * n
    for first, rest in ((held[10], held[11:n]), (held[n + 10], held[n + 11 : 2 * n])):
        # 1000 frames and 1560 audio frames on: even 4 bytes kept for each would be 10 kB
        assert max(rest) - first < 1500, (first, max(rest))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (apt-get install chromium)")
def test_chromium_plays_the_file_to_its_end_and_seeks_in_it(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs Playwright (pip install -e '.[test]')")
    out = tmp_path / "out.mp4"
    faststart.remux_faststart(_fragmented(tmp_path / "frag.mp4", [25] * 8, rate=48000, channels=2), out)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             "--autoplay-policy=no-user-gesture-required"]
    with sync_api.sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        browser = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True, args=flags)
        page = browser.new_page()
        page.goto(out.as_uri())  # Chromium's own player page for a media file
        page.wait_for_function("document.querySelector('video') && document.querySelector('video').readyState >= 1",
                               timeout=60_000)
        page.evaluate("() => { const v = document.querySelector('video'); v.muted = true; v.playbackRate = 4;"
                      " v.play(); }")
        page.wait_for_function("document.querySelector('video').ended", timeout=60_000)
        played = page.evaluate("""() => { const v = document.querySelector('video');
            return {duration: v.duration, frames: v.getVideoPlaybackQuality().totalVideoFrames,
                    audio: v.webkitAudioDecodedByteCount, error: v.error && v.error.message}; }""")
        page.evaluate("() => { const v = document.querySelector('video'); v.currentTime = 5.5; }")
        page.wait_for_function("!document.querySelector('video').seeking", timeout=60_000)
        seeked = page.evaluate("document.querySelector('video').currentTime")
        browser.close()
    assert played["error"] is None and abs(played["duration"] - 8.0) < 0.04
    assert played["frames"] >= 190 and played["audio"] > 0  # (a fast playback may drop a few frames)
    assert abs(seeked - 5.5) < 0.04
