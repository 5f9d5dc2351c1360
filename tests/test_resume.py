"""Resume: the rolling-state codec, exact resume of the chunk loop, renders killed at random chunks
and resumed, refusals, a full disk, and determinism."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from avatar_render.api import RenderRequest, render
from avatar_render.config import load_config
from avatar_render.distributed.device_mesh import single
from avatar_render.errors import AvatarRenderError
from avatar_render.files.render_paths import render_paths
from avatar_render.io.audio import AudioReader
from avatar_render.io.fmp4 import boxes
from avatar_render.io.reference import load_reference
from avatar_render.io.writer import WriterPosition, replay_start
from avatar_render.job.journal import Commit, Journal, read_safetensors, write_safetensors
from avatar_render.job.resume import replay_audio
from avatar_render.job.setup import build_pipeline
from avatar_render.job.stop import RenderStopped
from avatar_render.pipeline.state import Checkpoint, Flat, flatten, unflatten
from avatar_render.pipeline.types import Published, RequestInput
from avatar_render.preview.engine import build_preview
from avatar_render.preview.motion import MotionCarry
from tests.media import speech_like, write_audio

ROOT = Path(__file__).resolve().parents[1]
SMALL = ("video.width=96", "video.height=96", "chunk.chunk_frames=8", "chunk.transition_frames=2",
         "video.gop_seconds=0.3")
SECONDS = 3.0

# Runs the CLI with the preview's drawing patched to send this process a signal (argv[2]) before
# given segments (argv[1], comma-separated, 1-based; a segment listed twice gets two signals), sleeping
# argv[3] seconds per segment: a kill or stop at a chosen chunk, wherever the writer thread then is.
# argv[1] == "copy": the signal comes during the final copy into a regular MP4, after the last chunk.
DRIVER = """
import os, sys, time
from avatar_render.job import loop
from tests.decode_hook import before_each_segment
at, sig, delay = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
at = [] if at == "copy" else [int(v) for v in at.split(",")]
def signal_at(segment):
    time.sleep(delay)
    for _ in range(at.count(segment)):
        os.kill(os.getpid(), sig)
before_each_segment(signal_at)
if not at:
    loop.remux_faststart = lambda src, dst: os.kill(os.getpid(), sig)
from avatar_render.cli import main
sys.argv = ["avatar-render", *sys.argv[4:]]
main()
"""

# Runs the CLI under a file size limit (argv[1] bytes): writes past it fail with EFBIG.
FSIZE = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2)
from avatar_render.cli import main
sys.argv = ["avatar-render", *sys.argv[2:]]
main()
"""


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "avatar_render", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env(), timeout=120)


def driver(at: list[int] | str, sig: int, *args, cwd: Path, delay: float = 0.0) -> subprocess.CompletedProcess:
    argv = [at if isinstance(at, str) else ",".join(map(str, at)), str(int(sig)), str(delay), *map(str, args)]
    return subprocess.run([sys.executable, "-c", DRIVER, *argv], capture_output=True, text=True, cwd=cwd, env=env(),
                          timeout=120)


def render_args(face: Path, audio: Path, out: str, *extra) -> tuple:
    return ("render", "--ref", face, "--audio", audio, "-o", out, "--quiet", *SMALL, *extra)


def chunk_hashes(report: Path) -> list[tuple]:
    """(start, end, video_sha256, audio_sha256) of every published chunk in a JSON report."""
    return [(c["start"], c["end"], c["video_sha256"], c["audio_sha256"])
            for c in json.loads(report.read_text())["chunks"]]


def decode(path: Path) -> tuple[int, np.ndarray]:
    """Decoded video frames and audio samples (C, n) of an MP4."""
    with av.open(str(path)) as c:
        frames = sum(1 for _ in c.decode(video=0))
    with av.open(str(path)) as c:
        audio = np.concatenate([f.to_ndarray() for f in c.decode(audio=0)], axis=1)
    return frames, audio


def one_error_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr + done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def work(tmp_path_factory, face_png):
    """A speech clip and its uninterrupted render (CLI, own process) with the per-chunk hashes."""
    d = tmp_path_factory.mktemp("resume")
    audio = write_audio(d / "talk.wav", speech_like(SECONDS, 16000, seed=3), 16000)
    done = cli(*render_args(face_png, audio, "ref.mp4", "--report", "ref.json"), cwd=d)
    assert done.returncode == 0, done.stderr
    return d, audio, chunk_hashes(d / "ref.json"), decode(d / "ref.mp4")


def assert_same_as_reference(d: Path, name: str, reference) -> None:
    _, _, hashes, (frames, audio) = reference
    assert (d / f"{name}.mp4").read_bytes() == (d / "ref.mp4").read_bytes()  # the uninterrupted render's bytes
    assert chunk_hashes(d / f"{name}.json") == hashes
    got_frames, got_audio = decode(d / f"{name}.mp4")
    assert got_frames == frames == int(np.ceil(SECONDS * 25))
    assert got_audio.shape == audio.shape  # same duration, to the sample
    assert np.abs(got_audio - audio).max() < 0.03  # AAC noise only: no gap, click or shift at the join
    assert not render_paths(d / f"{name}.mp4").partial.exists() and not render_paths(d / f"{name}.mp4").journal.exists()


# -- the state codec -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Inner:
    a: np.ndarray
    b: float


@dataclasses.dataclass(frozen=True)
class Outer:
    inner: Inner
    items: tuple
    table: dict
    names: list
    rate: Fraction
    nothing: None = None


def test_state_round_trip_through_safetensors(tmp_path):
    tree = Outer(
        inner=Inner(a=np.arange(12, dtype=np.int16).reshape(3, 4), b=-0.1),
        items=(1, 2.5, True, "x", np.float32(1.25), np.zeros((0, 3), np.uint8), float("inf")),
        table={3: MotionCarry(mouth_ahead=((0.3, -0.1),), peak_db=-17.0, next_blink=42, blink_starts=(7, 30), blinks=2,
                                 nods=((12, 0.5),)), (1, 2): [None]},
        names=["a", {"k": np.ones(2, np.float64)}], rate=Fraction(30000, 1001),
    )
    flat = flatten(tree)
    write_safetensors(tmp_path / "s.safetensors", flat.arrays, {"skeleton": json.dumps(flat.skeleton)})
    arrays, meta = read_safetensors(tmp_path / "s.safetensors")
    back = unflatten(Flat(arrays=arrays, skeleton=json.loads(meta["skeleton"])))
    assert (type(back) is Outer and back.rate == tree.rate and back.table[3] == tree.table[3]
            and back.table[(1, 2)] == [None])
    assert back.inner.a.dtype == np.int16 and np.array_equal(back.inner.a, tree.inner.a) and back.inner.b == -0.1
    assert (back.items[:4] == (1, 2.5, True, "x") and back.items[4] == np.float32(1.25)
            and back.items[4].dtype == np.float32)
    assert back.items[5].shape == (0, 3) and back.items[6] == float("inf")
    assert np.array_equal(back.names[1]["k"], np.ones(2))
    st = pytest.importorskip("safetensors.numpy")  # the file is a standard safetensors file
    loaded = st.load_file(str(tmp_path / "s.safetensors"))
    assert set(loaded) == set(arrays) and all(np.array_equal(loaded[k], arrays[k]) for k in arrays)


def test_torch_tensors_round_trip():
    torch = pytest.importorskip("torch")
    tree = (torch.randn(2, 3).to(torch.bfloat16), torch.arange(5), [torch.ones(2, requires_grad=True)])
    back = unflatten(flatten(tree))
    assert back[0].dtype == torch.bfloat16 and torch.equal(back[0], tree[0])
    assert back[1].dtype == torch.int64 and torch.equal(back[1], tree[1]) and back[2][0].requires_grad


def test_unsaveable_state_is_named():
    @dataclasses.dataclass(frozen=True)
    class Local:
        x: int

    with pytest.raises(TypeError, match="inside a function"):
        flatten((Local(1),))
    with pytest.raises(TypeError, match=r"state\[0\]\.b: cannot save a object"):
        flatten((Inner(a=np.zeros(1), b=object()),))
    with pytest.raises(ValueError, match="not a loaded dataclass"):
        unflatten(Flat(arrays={}, skeleton={"dataclass": "os:path", "fields": {}}))


# -- the chunk loop resumes exactly ----------------------------------------------------------------


def chunk_loop(cfg, pipe, face: Path, audio_path: Path):
    """run(resume=None) -> every item the pipeline's chunk loop yields, checkpoints included."""
    w, h = cfg.video.width, cfg.video.height
    static = pipe.prepare(RequestInput(reference=load_reference(face), reference_path=face, width=w, height=h, seed=0))

    def run(resume=None):
        with AudioReader(audio_path, fps=cfg.fps, model_rate=pipe.audio_rate) as audio:
            return list(pipe.stream(static, audio, seed=0, resume=resume, checkpoints=True))

    return run


@pytest.mark.parametrize("transition", [0, 4])
def test_chunk_loop_resumes_exactly_from_every_checkpoint(tmp_path, face_png, transition):
    cfg = load_config(None, ("video.width=32", "video.height=32", "chunk.chunk_frames=10",
                             f"chunk.transition_frames={transition}"))
    run = chunk_loop(cfg, build_preview(cfg), face_png,
                     write_audio(tmp_path / "a.wav", speech_like(3.3, 16000, seed=1), 16000))
    full = run()
    checkpoints = [i for i, item in enumerate(full) if isinstance(item, Checkpoint)]
    assert len(checkpoints) == full[-1].plans_done > 3
    for i in checkpoints[:-1]:
        saved = flatten(full[i])
        saved = Flat(arrays=saved.arrays, skeleton=json.loads(json.dumps(saved.skeleton)))
        rest = run(resume=unflatten(saved))
        expected = full[i + 1 :]
        assert len(rest) == len(expected)
        for got, want in zip(rest, expected):
            assert type(got) is type(want)
            if isinstance(want, Published):
                assert got.start == want.start and np.array_equal(got.frames, want.frames) and np.array_equal(
                    got.audio, want.audio)
            else:
                assert got.plans_done == want.plans_done and got.last_plan == want.last_plan


@pytest.mark.slow
def test_fast_forward_keeps_the_audio_a_resumed_loop_reads(tmp_path, face_png):
    """Far into a long input, with wide audio margins (3 s each side, as diffusion backends use): the
    audio before the resume point is decoded and dropped, yet the writer's replay and the next chunks'
    windows are all there."""
    cfg = load_config(None, ("video.width=32", "video.height=32", "chunk.chunk_frames=10", "chunk.transition_frames=4"))
    pipe = dataclasses.replace(build_preview(cfg), audio_pad_s=3.0)
    audio_path = write_audio(tmp_path / "a.wav", speech_like(16.0, 16000, seed=2), 16000)
    static = pipe.prepare(RequestInput(reference=load_reference(face_png), reference_path=face_png, width=32, height=32,
                                       seed=0))
    with AudioReader(audio_path, fps=cfg.fps, model_rate=pipe.audio_rate) as audio:
        full = list(pipe.stream(static, audio, seed=0, checkpoints=True))
    i = next(i for i, item in enumerate(full) if isinstance(item, Checkpoint) and item.last_plan.start >= 300)
    published = np.concatenate([p.audio for p in full[:i] if isinstance(p, Published)], axis=1)  # (1, n) at 16 kHz
    samples = published.shape[1]
    position = WriterPosition(bytes=0, sequence=0, video_time=0, audio_time=(samples // 1024 - 1) * 1024,
                              frames=full[i].state.next_frame, audio_samples=samples)
    prior = Commit(plans_done=full[i].plans_done, frames=position.frames, audio_samples=samples, chunks=0,
                   log_bytes=0, state_file="", writer=position)
    with AudioReader(audio_path, fps=cfg.fps, model_rate=pipe.audio_rate) as audio:
        replay = replay_audio(audio, full[i], prior, pipe)
        assert np.array_equal(replay, published[:, replay_start(position):])
        assert audio.buffered_seconds < 10  # of 16 s: the start was dropped
        rest = list(pipe.stream(static, audio, seed=0, resume=full[i], checkpoints=True))
    tail = [p for p in full[i + 1 :] if isinstance(p, Published)]
    got = [p for p in rest if isinstance(p, Published)]
    assert [p.start for p in got] == [p.start for p in tail]
    assert all(np.array_equal(a.frames, b.frames) and np.array_equal(a.audio, b.audio) for a, b in zip(got, tail))


# -- killed renders, resumed -------------------------------------------------------------------------


@pytest.mark.slow
def test_sigkill_at_random_chunks_then_resume(work, face_png):
    d, audio, hashes, _ = work
    n = len(hashes)  # decode calls of a whole render
    positions = [1, random.Random(6).randrange(2, n), n, "copy"]  # first, any, last chunk; after the last
    for k in positions:
        name = f"kill{k}"
        killed = driver(k if k == "copy" else [k], signal.SIGKILL, *render_args(face_png, audio, f"{name}.mp4"), cwd=d)
        assert killed.returncode == -signal.SIGKILL
        done = cli(*render_args(face_png, audio, f"{name}.mp4", "--resume", "--report", f"{name}.json"), cwd=d)
        assert done.returncode == 0, done.stderr
        assert_same_as_reference(d, name, work)


@pytest.mark.slow
def test_killed_twice_then_resumed(work, face_png):
    d, audio, hashes, _ = work
    first, second = sorted(random.Random(7).sample(range(3, len(hashes) // 2), 2))
    assert (driver([first], signal.SIGKILL, *render_args(face_png, audio, "twice.mp4"), cwd=d).returncode
            == -signal.SIGKILL)
    again = driver([second], signal.SIGKILL, *render_args(face_png, audio, "twice.mp4", "--resume"), cwd=d)
    assert again.returncode == -signal.SIGKILL
    done = cli(*render_args(face_png, audio, "twice.mp4", "--resume", "--report", "twice.json"), cwd=d)
    assert done.returncode == 0, done.stderr
    assert_same_as_reference(d, "twice", work)


@pytest.mark.slow
def test_full_disk_ends_cleanly_and_resumes(work, face_png):
    d, audio, hashes, (frames, _) = work
    limit = (d / "ref.mp4").stat().st_size // 2
    full = subprocess.run([sys.executable, "-c", FSIZE, str(limit),
                           *map(str, render_args(face_png, audio, "disk.mp4"))],
                          capture_output=True, text=True, cwd=d, env=env(), timeout=120)
    assert full.returncode == 1
    line = one_error_line(full)
    assert "larger than this system allows" in line and "--resume" in line, line
    in_partial, _ = decode(d / "disk.partial.mp4")  # whole fragments only: it decodes to its end
    assert 0 < in_partial < frames
    done = cli(*render_args(face_png, audio, "disk.mp4", "--resume", "--report", "disk.json"), cwd=d)
    assert done.returncode == 0, done.stderr
    assert_same_as_reference(d, "disk", work)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")
def test_no_space_left_on_a_small_filesystem(work, face_png, tmp_path):
    d, audio, _, _ = work
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        full = cli(*render_args(face_png, audio, "out.mp4"), cwd=small)
        assert full.returncode == 1
        assert "no space left on device" in one_error_line(full).lower()
        copy = tmp_path / "copy"
        subprocess.run(["cp", "-r", str(small), str(copy)], check=True)
    finally:
        subprocess.run(["umount", str(small)], check=True)
    done = cli(*render_args(face_png, audio, "out.mp4", "--resume", "--report", "out.json"), cwd=copy)
    assert done.returncode == 0, done.stderr
    assert chunk_hashes(copy / "out.json") == work[2]
    assert (copy / "out.mp4").read_bytes() == (d / "ref.mp4").read_bytes()


# -- refusals and the journal's guard ------------------------------------------------------------------


def stop_after(chunks: int):
    calls = [0]

    def should_stop() -> bool:  # asked once before the loop, then after every chunk-plan entry
        calls[0] += 1
        return calls[0] > chunks + 1

    return should_stop


def api_render(d: Path, face: Path, audio: Path, name: str, *overrides, **kw):
    cfg = load_config(None, (*SMALL, *overrides))
    stop = kw.pop("should_stop", None)
    messages = []
    request = RenderRequest(reference=face, audio=audio, output=d / name, config=cfg, **kw)
    report = render(request, should_stop=stop, on_message=lambda level, text: messages.append((level, text)))
    return report, messages


def interrupted(d: Path, face: Path, audio: Path, name: str) -> int:
    with pytest.raises(RenderStopped) as stopped:
        api_render(d, face, audio, name, should_stop=stop_after(5))
    assert stopped.value.frames > 0 and render_paths(d / name).partial.exists()
    return stopped.value.frames


@pytest.mark.slow
def test_resume_refuses_other_inputs_or_config(work, face_png, tmp_path):
    d, audio, hashes, _ = work
    frames = interrupted(tmp_path, face_png, audio, "o.mp4")
    before = (tmp_path / "o.partial.mp4").read_bytes()
    with pytest.raises(AvatarRenderError, match=rf"interrupted after {frames} frames .*--resume.*--force"):
        api_render(tmp_path, face_png, audio, "o.mp4")
    with pytest.raises(AvatarRenderError, match=r"config key 'video.crf' was 20 and is now 30"):
        api_render(tmp_path, face_png, audio, "o.mp4", "video.crf=30", resume=True)
    with pytest.raises(AvatarRenderError, match=r"config key 'seed' was 0 and is now 5"):
        api_render(tmp_path, face_png, audio, "o.mp4", "seed=5", resume=True)
    other = write_audio(tmp_path / "other.wav", speech_like(SECONDS, 16000, seed=4), 16000)
    with pytest.raises(AvatarRenderError, match=r"the audio 'other.wav' is not the file it was started with"):
        api_render(tmp_path, face_png, other, "o.mp4", resume=True)
    with Journal.open(render_paths(tmp_path / "o.mp4").journal, create=False):  # as if another process rendered it
        with pytest.raises(AvatarRenderError, match="Another avatar-render process"):
            api_render(tmp_path, face_png, audio, "o.mp4", resume=True)
    assert (tmp_path / "o.partial.mp4").read_bytes() == before and not (tmp_path / "o.mp4").exists()
    # A key that cannot change the frames may differ, and an input may move (its content counts);
    # the result is the uninterrupted one.
    moved = tmp_path / "moved.wav"
    moved.write_bytes(Path(audio).read_bytes())
    report, _ = api_render(tmp_path, face_png, moved, "o.mp4", "run.queue_chunks=2", resume=True,
                           report=tmp_path / "o.json")
    assert report.resumed_frames == frames and chunk_hashes(tmp_path / "o.json") == hashes


@pytest.mark.slow
def test_damaged_partial_or_journal_is_refused_then_force_starts_over(work, face_png, tmp_path):
    d, audio, hashes, _ = work
    interrupted(tmp_path, face_png, audio, "b.mp4")
    partial = tmp_path / "b.partial.mp4"
    partial.write_bytes(partial.read_bytes()[:2000])
    with pytest.raises(AvatarRenderError, match="does not match its journal.*--force"):
        api_render(tmp_path, face_png, audio, "b.mp4", resume=True)
    (render_paths(tmp_path / "b.mp4").journal / "journal.json").write_text("{ not json")
    with pytest.raises(AvatarRenderError, match="journal is damaged.*--force"):
        api_render(tmp_path, face_png, audio, "b.mp4", resume=True)
    with pytest.raises(AvatarRenderError, match="journal is damaged; pass --force"):
        api_render(tmp_path, face_png, audio, "b.mp4")
    report, _ = api_render(tmp_path, face_png, audio, "b.mp4", force=True, report=tmp_path / "b.json")
    assert report.resumed_frames == 0 and chunk_hashes(tmp_path / "b.json") == hashes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "b.mp4"]


@pytest.mark.slow
def test_a_partial_changed_inside_its_chunks_is_refused_then_force_starts_over(work, face_png, tmp_path):
    """Bytes of a video sample overwritten (its size and boxes as they were): refused, naming the chunk, and the
    file left as it was; the resume had taken it in, and the finished file did not decode (a damaged disk)."""
    d, audio, hashes, _ = work
    interrupted(tmp_path, face_png, audio, "c.mp4")
    partial = tmp_path / "c.partial.mp4"
    data = bytearray(partial.read_bytes())
    with partial.open("rb") as f:
        ends = [end for kind, _, _, end in boxes(f, 0, len(data)) if kind == b"moof"]
    at = ends[1] + 8 + 8  # (the second chunk's mdat, whose video comes first)
    data[at : at + 16] = bytes(16)
    partial.write_bytes(bytes(data))
    with pytest.raises(AvatarRenderError, match=r"its chunk 2 is not what was written there.*--force"):
        api_render(tmp_path, face_png, audio, "c.mp4", resume=True)
    assert partial.read_bytes() == bytes(data)
    report, _ = api_render(tmp_path, face_png, audio, "c.mp4", force=True, report=tmp_path / "c.json")
    assert report.resumed_frames == 0 and chunk_hashes(tmp_path / "c.json") == hashes


@pytest.mark.slow
def test_an_interrupted_replacement_is_resumed_with_force_and_resume(work, face_png, tmp_path):
    """A render replacing an output (--force) stops: --resume alone says to add --force (it said only that the
    output exists, and --force alone throws the partial render away)."""
    d, audio, hashes, _ = work
    (tmp_path / "r.mp4").write_bytes(b"an older video")
    with pytest.raises(RenderStopped):
        api_render(tmp_path, face_png, audio, "r.mp4", force=True, should_stop=stop_after(5))
    with pytest.raises(AvatarRenderError, match=r"exists beside an interrupted render of it: pass --force --resume"):
        api_render(tmp_path, face_png, audio, "r.mp4", resume=True)
    assert (tmp_path / "r.mp4").read_bytes() == b"an older video"
    report, _ = api_render(tmp_path, face_png, audio, "r.mp4", force=True, resume=True, report=tmp_path / "r.json")
    assert report.resumed_frames > 0 and chunk_hashes(tmp_path / "r.json") == hashes


def test_resume_with_nothing_to_resume_starts_afresh(work, face_png, tmp_path):
    _, audio, hashes, _ = work
    report, messages = api_render(tmp_path, face_png, audio, "n.mp4", resume=True, report=tmp_path / "n.json")
    assert ("info", f"Nothing to resume for '{tmp_path / 'n.mp4'}'; starting from the beginning.") in messages
    assert report.frames == 75 and chunk_hashes(tmp_path / "n.json") == hashes
    with pytest.raises(AvatarRenderError, match=r"^Nothing to resume: '.*n.mp4' is complete \(no interrupted render "
                                                r"of it is left\); pass --force instead of --resume"):
        api_render(tmp_path, face_png, audio, "n.mp4", resume=True)  # finished: said so, not "already exists"


def test_journal_is_cheap_and_small(work, face_png, tmp_path):
    _, audio, _, _ = work
    interrupted(tmp_path, face_png, audio, "c.mp4")
    files = {p.name: p.stat().st_size for p in render_paths(tmp_path / "c.mp4").journal.iterdir()}
    assert set(files) == {"journal.json", "chunks.jsonl", "lock", ".avatar-render-journal",
                          next(n for n in files if n.startswith("state-"))}
    assert sum(files.values()) < 16_000  # identity, one line per chunk and the preview's small state


# -- determinism -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_same_inputs_same_frames_in_one_process_and_across_runs(work, face_png, tmp_path):
    _, audio, hashes, _ = work  # `hashes` come from a render in another process
    for name in ("d1", "d2"):
        api_render(tmp_path, face_png, audio, f"{name}.mp4", report=tmp_path / f"{name}.json")
        assert chunk_hashes(tmp_path / f"{name}.json") == hashes


@pytest.mark.slow
@pytest.mark.parametrize("more", [(), ("chunk.first_frames=4", "run.overlap_decode=true")])
def test_diffusion_loop_resumes_exactly_and_checkpoints_hold_latents_not_the_decoder_cache(tmp_path, face_png, more):
    """The tiny diffusion backend over 8 s (200 frames, 50 latents: past the decoder's 39-latent
    window, so resuming late rebuilds its cache from a window that starts mid-stream); also with a
    short first chunk (frame 0 published before it) and the decode beside the next chunk's sampling.
    Checkpoints keep neither the decoder's cache nor the cross-attention keys and values."""
    cfg = load_config(ROOT / "configs" / "tiny.yaml", ("model.steps=1", *more))
    run = chunk_loop(cfg, build_pipeline(cfg, single()), face_png,
                     write_audio(tmp_path / "a.wav", speech_like(8.0, 16000, seed=5), 16000))
    full = run()
    checkpoints = [i for i, item in enumerate(full) if isinstance(item, Checkpoint)]
    for i in (checkpoints[1], checkpoints[-2]):
        carry = full[i].state.decode_carry
        assert carry.cache is None and carry.recent.shape[1] == min(carry.decoded, 39)
        assert full[i].state.carries[1].kv is None
        rest = run(resume=unflatten(flatten(full[i])))
        want = [p for p in full[i + 1 :] if isinstance(p, Published)]
        got = [p for p in rest if isinstance(p, Published)]
        assert [p.start for p in got] == [p.start for p in want]
        assert all(np.array_equal(a.frames, b.frames) for a, b in zip(got, want))
    assert full[checkpoints[-2]].state.decode_carry.decoded > 39


def test_resume_under_other_live_options_is_refused_as_its_keyframes_would_change(work, face_png, tmp_path):
    """With video.gop_seconds unset a live render has a keyframe every 2 s and a file every 10 s; resumed
    without its live options the file's GOP would change at the resume point: refused in one sentence (the
    dry run says the same), then resumed with them."""
    from avatar_render.job.request import LiveOptions

    _, audio, _, _ = work
    (tmp_path / "hls").mkdir()
    live = LiveOptions(targets=(str(tmp_path / "hls" / "live.m3u8"),))
    with pytest.raises(RenderStopped):
        api_render(tmp_path, face_png, audio, "l.mp4", "video.gop_seconds=0", live=live, should_stop=stop_after(0))
    words = r"keyframe every 2 s and would now have one every 10 s .*resume with the live options it was started"
    with pytest.raises(AvatarRenderError, match=words):
        api_render(tmp_path, face_png, audio, "l.mp4", "video.gop_seconds=0", resume=True)
    done = cli("render", "--ref", face_png, "--audio", audio, "-o", tmp_path / "l.mp4", "--resume", "--dry-run",
               *SMALL, "video.gop_seconds=0", cwd=tmp_path)
    assert done.returncode == 1 and "would now have one every 10 s" in one_error_line(done)
    report, _ = api_render(tmp_path, face_png, audio, "l.mp4", "video.gop_seconds=0", resume=True, live=live)
    assert report.resumed_frames > 0 and report.frames == 75
