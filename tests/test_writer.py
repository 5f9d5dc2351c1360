"""Mp4Writer: contents, keyframes, reading while writing, abort / kill, and write failures."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import subprocess
import sys
import time
import weakref
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from avatar_render.errors import AvatarRenderError
from avatar_render.io.writer import Mp4Writer, WriterPosition, WriterResume, WriterSpec, remux_faststart, replay_start

ROOT = Path(__file__).resolve().parents[1]
W, H = 64, 48

# Reads a file with PyAV in a fresh process: decoded video frames and where the audio ends (s).
READ_SCRIPT = """
import json, sys, av
with av.open(sys.argv[1]) as c:
    frames = sum(1 for _ in c.decode(video=0))
with av.open(sys.argv[1]) as c:
    a = c.streams.audio[0]
    ends = [float((p.pts + p.duration) * a.time_base) for p in c.demux(a) if p.pts is not None]
print(json.dumps({"frames": frames, "audio_end": max(ends, default=0.0)}))
"""

# Writes 10-frame chunks, reporting each once it is on disk, then waits to be killed.
KILL_SCRIPT = """
import sys, time
from fractions import Fraction
from pathlib import Path
import numpy as np
from avatar_render.io.writer import Mp4Writer, WriterSpec
writer = Mp4Writer(WriterSpec(Path(sys.argv[1]), 64, 48, Fraction(25), audio_rate=16000, audio_channels=1))
rng = np.random.default_rng(0)
for k in range(3):
    writer.put(rng.integers(0, 256, (10, 48, 64, 3), dtype=np.uint8), np.zeros((1, 6400), np.float32))
    while writer.frames_written < 10 * (k + 1):
        time.sleep(0.005)
    print(writer.frames_written, flush=True)
time.sleep(60)
"""

# Writes noise until the file size limit stops it; prints the error the caller gets.
FSIZE_SCRIPT = """
import resource, signal, sys
from fractions import Fraction
from pathlib import Path
import numpy as np
from avatar_render.errors import AvatarRenderError
from avatar_render.io.writer import Mp4Writer, WriterSpec
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so write() fails with EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))
writer = Mp4Writer(WriterSpec(Path(sys.argv[1]), 64, 48, Fraction(25), audio_rate=16000, audio_channels=1))
rng = np.random.default_rng(0)
try:
    for _ in range(100):
        writer.put(rng.integers(0, 256, (10, 48, 64, 3), dtype=np.uint8), np.zeros((1, 6400), np.float32))
    writer.close()
except AvatarRenderError as exc:
    print(exc)
    sys.exit(3)
"""


def _run_script(script: str, path: Path, timeout: float = 20.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=timeout, env=env
    )


def _read_elsewhere(path: Path) -> dict:
    result = _run_script(READ_SCRIPT, path)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _spec(path: Path, fps: Fraction = Fraction(25), rate: int = 16000, channels: int = 1, **kw) -> WriterSpec:
    return WriterSpec(path=path, width=W, height=H, fps=fps, audio_rate=rate, audio_channels=channels, **kw)


def _chunks(sizes: list[int], fps: Fraction, rate: int, channels: int, seed: int = 0):
    """Chunks of frames (T, H, W, 3) with exactly the audio (C, n) of those frames."""
    rng = np.random.default_rng(seed)
    start = 0
    for size in sizes:
        frames = np.empty((size, H, W, 3), np.uint8)
        for i in range(size):  # a moving gradient with a little noise
            x = (np.arange(W) * 4 + 7 * (start + i)) % 256
            frames[i] = x[None, :, None] + rng.integers(0, 16, (H, W, 3))
        a, b = round(start * rate / fps), round((start + size) * rate / fps)
        t = np.arange(a, b) / rate
        audio = np.stack([0.2 * np.sin(2 * np.pi * (220 + 110 * c) * t) for c in range(channels)]).astype(np.float32)
        yield frames, audio
        start += size


def _contents(path: Path) -> tuple[list[bool], Fraction, float, float]:
    """Per-frame keyframe flags, average frame rate, audio end (s) and container duration (s)."""
    with av.open(str(path)) as c:
        video = c.streams.video[0]
        keys = [p.is_keyframe for p in c.demux(video) if p.size]
        rate = video.average_rate
    with av.open(str(path)) as c:
        audio = c.streams.audio[0]
        end = max(float((p.pts + p.duration) * audio.time_base) for p in c.demux(audio) if p.size)
        duration = c.duration / av.time_base
    return keys, rate, end, duration


@pytest.mark.parametrize(
    "fps, rate, channels",
    [(Fraction(25), 8000, 1), (Fraction(30), 44100, 2), (Fraction(30000, 1001), 48000, 2)],
)
def test_frames_audio_and_keyframes(tmp_path: Path, fps: Fraction, rate: int, channels: int) -> None:
    path = tmp_path / "out.mp4"
    sizes = [12, 7, 20, 1, 9]
    samples = 0
    with Mp4Writer(_spec(path, fps, rate, channels)) as writer:
        for frames, audio in _chunks(sizes, fps, rate, channels):
            writer.put(frames, audio)
            samples += audio.shape[1]
    stats = writer.close()  # already closed by the with block: returns the same stats
    assert (stats.frames, stats.audio_samples) == (sum(sizes), samples)
    assert stats.bytes == path.stat().st_size and stats.first_frame_on_disk_s is not None

    keys, avg_rate, audio_end, duration = _contents(path)
    assert len(keys) == sum(sizes)
    assert avg_rate == fps
    starts = set(np.cumsum([0] + sizes[:-1]).tolist())
    assert keys[0] and all(i in starts for i, key in enumerate(keys) if key)
    assert abs(audio_end - samples / rate) < 1 / fps
    assert abs(duration - sum(sizes) / fps) < 1 / fps
    assert list(tmp_path.iterdir()) == [path]


def test_keyframes_on_chunk_starts_about_every_ten_seconds(tmp_path: Path) -> None:
    path, fps = tmp_path / "keys.mp4", Fraction(25)
    sizes = [50] * 15  # 30 s
    with Mp4Writer(_spec(path, fps, 8000, 1)) as writer:
        for frames, audio in _chunks(sizes, fps, 8000, 1):
            writer.put(frames, audio)
            writer.boundary()  # as the chunk loop does at each checkpoint
    keys, *_ = _contents(path)
    assert [i for i, key in enumerate(keys) if key] == [0, 250, 500]


def test_audio_in_sync_with_video(tmp_path: Path) -> None:
    """A click at 1.0 s of input audio is decoded at 1.0 s (the AAC priming is cut)."""
    path, rate = tmp_path / "sync.mp4", 16000
    audio = np.zeros((1, 2 * rate), np.float32)
    audio[0, rate : rate + 16] = 0.9
    frames = np.zeros((50, H, W, 3), np.uint8)
    with Mp4Writer(_spec(path, rate=rate)) as writer:
        writer.put(frames[:25], audio[:, :rate])
        writer.put(frames[25:], audio[:, rate:])
    with av.open(str(path)) as c:
        decoded = [(f.pts * f.time_base, f.to_ndarray()[0]) for f in c.decode(audio=0)]
    assert decoded[0][0] == 0
    samples = np.concatenate([s for _, s in decoded])  # (n,)
    assert abs(np.argmax(np.abs(samples)) / rate - 1.0) < 0.002


def test_chunks_readable_while_writing(tmp_path: Path) -> None:
    path, rate, fps = tmp_path / "live.mp4", 16000, Fraction(25)
    writer = Mp4Writer(_spec(path, fps, rate))
    frames_put = samples_put = 0
    for frames, audio in _chunks([10, 10, 10], fps, rate, 1):
        writer.put(frames, audio)
        frames_put += len(frames)
        samples_put += audio.shape[1]
        deadline = time.monotonic() + 10
        while writer.frames_written < frames_put and time.monotonic() < deadline:
            time.sleep(0.005)
        seen = _read_elsewhere(path)
        assert seen["frames"] == frames_put  # the whole chunk, without waiting for the next one
        assert seen["audio_end"] >= (samples_put - 3072) / rate  # AAC holds back < 3 frames of 1024
    writer.close()
    assert _read_elsewhere(path)["frames"] == 30


def test_abort_leaves_complete_fragments(tmp_path: Path) -> None:
    path, fps = tmp_path / "aborted.mp4", Fraction(25)
    writer = Mp4Writer(_spec(path, fps))
    for frames, audio in _chunks([10, 10], fps, 16000, 1):
        writer.put(frames, audio)
    while writer.frames_written < 20:
        time.sleep(0.005)
    for frames, audio in _chunks([10, 10, 10], fps, 16000, 1, seed=1):
        writer.put(frames, audio)
    writer.abort()
    writer.abort()  # harmless
    frames = _read_elsewhere(path)["frames"]
    assert frames >= 20 and frames % 10 == 0 and frames < 50  # the queued chunks were dropped, not written
    with pytest.raises(AvatarRenderError):
        writer.put(*next(_chunks([1], fps, 16000, 1)))

    # A fragment cut short (the process died while writing it) loses at most that fragment.
    data = path.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) - 500])
    assert _read_elsewhere(cut)["frames"] >= frames - 10


def test_context_manager_aborts_on_exception(tmp_path: Path) -> None:
    path = tmp_path / "failed.mp4"
    with pytest.raises(RuntimeError):
        with Mp4Writer(_spec(path)) as writer:
            writer.put(*next(_chunks([5], Fraction(25), 16000, 1)))
            raise RuntimeError("generation failed")
    assert _read_elsewhere(path)["frames"] in (0, 5)


def test_file_readable_after_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "killed.mp4"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", KILL_SCRIPT, str(path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert [int(line) for line in lines] == [10, 20, 30]
    assert _read_elsewhere(path)["frames"] == 30


def test_unwritable_path(tmp_path: Path) -> None:
    with pytest.raises(AvatarRenderError, match="does not exist"):
        Mp4Writer(_spec(tmp_path / "missing" / "out.mp4"))
    with pytest.raises(AvatarRenderError, match="Could not create"):
        Mp4Writer(_spec(tmp_path))  # a folder
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(AvatarRenderError, match="permission denied"):
            Mp4Writer(_spec(locked / "out.mp4"))


def test_write_failure_reported_not_hung(tmp_path: Path) -> None:
    path = tmp_path / "full.mp4"
    result = _run_script(FSIZE_SCRIPT, path, timeout=30)
    assert result.returncode == 3, result.stderr
    assert result.stdout.strip() == f"Could not write '{path}': the file is larger than this system allows."
    assert "Traceback" not in result.stderr
    # The fragment that did not fit was cut off again: the file ends with a whole fragment.
    assert path.stat().st_size < 300_000 and _read_elsewhere(path)["frames"] % 10 == 0


def test_bad_input_and_spec(tmp_path: Path) -> None:
    with pytest.raises(AvatarRenderError, match="even"):
        WriterSpec(tmp_path / "a.mp4", 63, 48, Fraction(25))
    with pytest.raises(AvatarRenderError, match="Preset"):
        _spec(tmp_path / "a.mp4", preset="warp")
    with Mp4Writer(_spec(tmp_path / "a.mp4")) as writer:
        with pytest.raises(ValueError):
            writer.put(np.zeros((2, H, W + 2, 3), np.uint8), np.zeros((1, 10), np.float32))
        with pytest.raises(ValueError):
            writer.put(np.zeros((2, H, W, 3), np.uint8), np.zeros((2, 10), np.float32))


def _write_marked(path: Path, sizes: list[int], *, resume: WriterResume | None = None, skip: int = 0,
                  gop_seconds: float = 0.04) -> list[WriterPosition]:
    """Write chunks ``sizes[skip:]`` (of the deterministic _chunks stream), a mark after each chunk
    that ends a GOP; the positions (by default every chunk opens a GOP)."""
    positions: list[WriterPosition] = []
    with Mp4Writer(_spec(path, gop_seconds=gop_seconds), resume=resume) as writer:
        for i, (frames, audio) in enumerate(_chunks(sizes, Fraction(25), 16000, 1)):
            if i >= skip:
                writer.put(frames, audio)
                if writer.boundary():
                    writer.mark(positions.append)
        writer.close(faststart=False)
    return positions


def _decoded_audio(path: Path) -> np.ndarray:
    with av.open(str(path)) as c:
        return np.concatenate([f.to_ndarray() for f in c.decode(audio=0)], axis=1)


@pytest.mark.parametrize("cut", [1, 3, 7])  # 7: every chunk is in; only the final flush is missing
def test_resume_cuts_back_to_a_mark_and_appends(tmp_path: Path, cut: int) -> None:
    sizes = [10, 10, 7, 13, 10, 10, 4]
    whole = tmp_path / "whole.mp4"
    positions = _write_marked(whole, sizes)
    assert [p.frames for p in positions] == np.cumsum(sizes).tolist()
    assert ([p.sequence for p in positions] == list(range(1, len(sizes) + 1))
            and positions[-1].bytes < whole.stat().st_size)

    # The file of a render killed later than mark `cut`: everything, plus a torn fragment at the end.
    killed = tmp_path / "killed.mp4"
    killed.write_bytes(whole.read_bytes()[: positions[-1].bytes + 300])
    at = positions[cut - 1]
    all_audio = np.concatenate([a for _, a in _chunks(sizes, Fraction(25), 16000, 1)], axis=1)
    replay = all_audio[:, replay_start(at) : at.audio_samples]
    _write_marked(killed, sizes, resume=WriterResume(position=at, replay=replay), skip=cut)

    assert killed.read_bytes() == whole.read_bytes()  # resumed to the same bytes
    final = tmp_path / "final.mp4"
    remux_faststart(killed, final)
    keys, rate, audio_end, _ = _contents(final)
    # appended video starts with a keyframe
    assert len(keys) == sum(sizes) and (cut == len(sizes) or keys[sum(sizes[:cut])])
    assert abs(audio_end - all_audio.shape[1] / 16000) < 1 / 25
    expected, got = _decoded_audio(whole), _decoded_audio(final)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() < 0.02  # the two AAC encodes join without a gap or click


def test_resume_refuses_a_file_that_does_not_fit(tmp_path: Path) -> None:
    path = tmp_path / "a.mp4"
    at = _write_marked(path, [10, 10, 10])[1]
    replay = np.zeros((1, at.audio_samples - replay_start(at)), np.float32)
    other = WriterSpec(path=path, width=W + 2, height=H, fps=Fraction(25), audio_rate=16000, audio_channels=1)
    with pytest.raises(AvatarRenderError, match="other encoder settings"):
        Mp4Writer(other, resume=WriterResume(position=at, replay=replay))
    with pytest.raises(AvatarRenderError, match="does not match its journal"):
        Mp4Writer(_spec(path), resume=WriterResume(position=dataclasses.replace(at, bytes=at.bytes - 1), replay=replay))
    path.write_bytes(path.read_bytes()[: at.bytes - 100])
    with pytest.raises(AvatarRenderError, match="shorter than the journal says"):
        Mp4Writer(_spec(path), resume=WriterResume(position=at, replay=replay))
    with pytest.raises(AvatarRenderError, match="does not exist"):
        Mp4Writer(_spec(tmp_path / "gone.mp4"), resume=WriterResume(position=at, replay=replay))


def test_mark_failure_reaches_the_caller(tmp_path: Path) -> None:
    def fail(position: WriterPosition) -> None:
        raise AvatarRenderError("Could not write the journal.")

    writer = Mp4Writer(_spec(tmp_path / "m.mp4", gop_seconds=0.2))
    frames, audio = next(_chunks([5], Fraction(25), 16000, 1))
    writer.put(frames, audio)
    assert writer.boundary()
    writer.mark(fail)
    with pytest.raises(AvatarRenderError, match="Could not write the journal"):
        for _ in range(50):
            writer.put(frames, audio)
            time.sleep(0.01)
    writer.abort()


def test_gops_open_at_chunk_starts_and_a_resume_at_any_of_them_gives_the_same_bytes(tmp_path: Path) -> None:
    """GOPs of at least 1 s (25 frames) over chunks of 10, 7 and 13 frames: keyframes only at the chunk
    starts that open a GOP; resuming at each of those points writes the uninterrupted bytes."""
    sizes = [10, 10, 7, 13, 10, 10, 10, 4, 12, 10]
    whole = tmp_path / "whole.mp4"
    positions = _write_marked(whole, sizes, gop_seconds=1.0)
    starts = np.cumsum([0] + sizes[:-1]).tolist()
    keys, _, _, _ = _contents(whole)
    opened = [s for s, k in zip(range(sum(sizes)), keys) if k]
    assert opened == [0, 27, 60, 86]  # the first chunk start at least 25 frames after the last GOP's
    assert [p.frames for p in positions] == opened[1:]  # the end (frame 96) is 10 frames into a GOP: no mark
    all_audio = np.concatenate([a for _, a in _chunks(sizes, Fraction(25), 16000, 1)], axis=1)
    for at in positions[:3]:
        killed = tmp_path / f"killed{at.frames}.mp4"
        killed.write_bytes(whole.read_bytes()[: at.bytes + 500])  # a torn fragment after the mark
        replay = all_audio[:, replay_start(at) : at.audio_samples]
        skip = starts.index(at.frames)
        _write_marked(killed, sizes, resume=WriterResume(position=at, replay=replay), skip=skip, gop_seconds=1.0)
        assert killed.read_bytes() == whole.read_bytes(), f"resumed at frame {at.frames}"


def test_a_mark_off_a_gop_start_is_refused(tmp_path: Path) -> None:
    with Mp4Writer(_spec(tmp_path / "m.mp4", gop_seconds=1.0)) as writer:
        frames, audio = next(_chunks([5], Fraction(25), 16000, 1))
        assert writer.boundary()
        writer.put(frames, audio)
        assert not writer.boundary()
        with pytest.raises(AssertionError):
            writer.mark(lambda position: None)


def test_a_chunk_is_let_go_once_encoded_before_the_next_one_is_let_in(tmp_path: Path) -> None:
    """With a queue of one chunk the writer holds at most one chunk's frames: when ``put`` of the next one
    returns, the one before is no longer alive (counted with weak references, not timed)."""
    alive: dict[int, weakref.ref] = {}
    with Mp4Writer(_spec(tmp_path / "out.mp4", queue_chunks=1)) as writer:
        for i, (frames, audio) in enumerate(_chunks([5, 3, 6, 4, 5], Fraction(25), 16000, 1)):
            alive[i] = weakref.ref(frames)
            writer.put(frames, audio)
            del frames, audio  # (numpy arrays are freed by reference counting: no gc.collect() needed)
            assert [k for k, ref in alive.items() if ref() is not None and k < i] == [], f"after put {i}"
    gc.collect()
    assert all(ref() is None for ref in alive.values())


def test_each_chunk_hashed_as_encoded(tmp_path: Path) -> None:
    """``video_sha256(k)`` is the SHA-256 of the H.264 samples chunk k became in the file (the journal's record)."""
    import hashlib

    path, sizes = tmp_path / "out.mp4", [5, 6, 4]
    writer = Mp4Writer(_spec(path))
    for frames, audio in _chunks(sizes, Fraction(25), 16000, 1):
        writer.put(frames, audio)
    writer.close(faststart=False)
    with av.open(str(path)) as c:
        packets = [bytes(p) for p in c.demux(c.streams.video[0]) if p.size]
    assert len(packets) == sum(sizes)
    bounds = np.cumsum([0, *sizes])
    want = [hashlib.sha256(b"".join(packets[a:b])).hexdigest() for a, b in zip(bounds[:-1], bounds[1:])]
    assert [writer.video_sha256(k) for k in range(len(sizes))] == want
    assert len(set(want)) == len(sizes)


def test_a_chunk_put_in_parts_is_the_fragment_of_one_put(tmp_path: Path) -> None:
    """Frames given in parts as they are drawn (``more``), the audio with the last part: the file, the GOPs
    and each chunk's hash are those of the chunks put whole (a part of its own fragment would change them)."""
    sizes = [10, 7, 13, 10, 30, 4]

    def write(path: Path, parts: bool) -> list[str]:
        writer = Mp4Writer(_spec(path, gop_seconds=1.0))
        for frames, audio in _chunks(sizes, Fraction(25), 16000, 1):
            writer.boundary()
            if parts:
                cuts = [0, *range(3, len(frames), 4), len(frames)]
                for a, b in zip(cuts, cuts[1:]):
                    last = b == len(frames)
                    writer.put(frames[a:b], audio if last else audio[:, :0], more=not last)
            else:
                writer.put(frames, audio)
        writer.close(faststart=False)
        return [writer.video_sha256(k) for k in range(len(sizes))]

    whole, parts = tmp_path / "whole.mp4", tmp_path / "parts.mp4"
    assert write(parts, parts=True) == write(whole, parts=False)
    assert parts.read_bytes() == whole.read_bytes()
    keys, _, _, _ = _contents(parts)
    assert [i for i, k in enumerate(keys) if k] == [0, 30, 70]


def test_a_part_with_audio_or_a_boundary_inside_a_chunk_is_refused(tmp_path: Path) -> None:
    with Mp4Writer(_spec(tmp_path / "m.mp4", gop_seconds=0.2)) as writer:  # (GOPs of 5 frames or more)
        frames, audio = next(_chunks([6], Fraction(25), 16000, 1))
        with pytest.raises(ValueError, match="audio with its last part"):
            writer.put(frames[:3], audio, more=True)
        writer.put(frames[:3], audio[:, :0], more=True)
        with pytest.raises(AssertionError):
            writer.boundary()
        writer.put(frames[3:], audio)
        assert writer.boundary()
