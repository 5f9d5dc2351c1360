"""The catalogue of hostile inputs: each gets one clear line and an exit code, or renders correctly;
no traceback, and no file that was there before is touched."""

from __future__ import annotations

import hashlib
import math
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from avatar_render.api import RenderRequest, render
from avatar_render.cli import app
from avatar_render.config import load_config
from avatar_render.io.reference import load_reference
from avatar_render.job.stop import RenderStopped
from avatar_render.pipeline.types import RequestInput
from avatar_render.preview.engine import build_preview
from avatar_render.telemetry import current_rss_mb
from tests.media import played_samples, speech_like, write_audio, write_video_without_audio

ROOT = Path(__file__).resolve().parents[1]
TINY = ("video.width=48", "video.height=48")


def snapshot(folder: Path) -> dict[str, tuple[int, int, str]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.iterdir()) if p.is_file()}


def run_cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(result, prefix: str) -> str:
    assert "Traceback" not in result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
    return lines[0]


def flat_png(path: Path, width: int, height: int) -> Path:
    """A one-colour RGB PNG written row by row (cheap at any size)."""
    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))
    comp = zlib.compressobj(1)
    row = b"\x00" + bytes((90, 120, 150)) * width
    body = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


@pytest.fixture(scope="module")
def media(tmp_path_factory, face_png):
    d = tmp_path_factory.mktemp("hostile")
    speech = write_audio(d / "talk.wav", speech_like(1.0, 16000), 16000)
    whole = speech.read_bytes()
    (d / "garbage.wav").write_bytes(bytes(range(256)) * 40)
    (d / "zero.wav").write_bytes(b"")
    (d / "header_only.wav").write_bytes(whole[:30])
    write_audio(d / "empty.wav", np.zeros((1, 0), np.float32), 16000)
    write_video_without_audio(d / "mute.mp4", 1.0)
    (d / "notes.png").write_text("not an image\n" * 10)
    Image.open(face_png).convert("RGB").resize((128, 128)).save(d / "face.png")
    png = (d / "face.png").read_bytes()
    (d / "cut.png").write_bytes(png[: len(png) // 2])
    Image.new("RGB", (1, 1)).save(d / "dot.png")
    (d / "zero.jpg").write_bytes(b"")
    write_audio(d / "voice.m4a", speech_like(1.0, 16000), 16000)
    Image.new("RGB", (200, 200), (120, 160, 200)).save(d / "wall.png")
    (d / "unknown.yaml").write_text("video:\n  width: 96\n  colour: red\n")
    (d / "list.yaml").write_text("- a\n- b\n")
    (d / "blocker").write_text("a file, not a folder")
    (d / "taken.mp4").write_bytes(b"my old video")
    return d


ERRORS = {  # case: (arguments after render --ref R --audio A -o O, with {d} the folder; words the error line holds)
    "audio: unreadable": (("--audio", "{d}/garbage.wav"), "is not a readable audio or video file"),
    "audio: zero bytes": (("--audio", "{d}/zero.wav"), "is empty (0 bytes); give an audio or video file"),
    "audio: truncated header": (("--audio", "{d}/header_only.wav"), "is not a readable audio or video file"),
    "audio: no samples": (("--audio", "{d}/empty.wav"), "holds no audio samples"),
    "audio: missing": (("--audio", "{d}/missing.wav"), "does not exist"),
    "audio: video without sound": (("--audio", "{d}/mute.mp4"), "has no audio track"),
    "reference: not an image": (("--ref", "{d}/notes.png"), "is not an image or video file"),
    "reference: truncated image": (("--ref", "{d}/cut.png"), "corrupt or truncated"),
    "reference: 1x1": (("--ref", "{d}/dot.png"), "must be at least 16x16"),
    "reference: empty file": (("--ref", "{d}/zero.jpg"), "is empty (0 bytes); give an image or video file"),
    "reference: no video stream": (("--ref", "{d}/voice.m4a"), "has no video stream"),
    "reference: no face, run.no_face=error": (("--ref", "{d}/wall.png", "run.no_face=error"), "No face was found"),
    "config: unknown key": (("preview.fsp=30",), "Unknown config key 'preview.fsp'"),
    "config: unknown key in YAML": (("-c", "{d}/unknown.yaml"), "Unknown config key 'video.colour'"),
    "config: YAML not a mapping": (("-c", "{d}/list.yaml"), "must hold a mapping"),
    "config: wrong type": (("video.width=wide",), "'video.width' has a wrong type"),
    "config: zero size": (("video.width=0",), "'video.width' must be an even number"),
    "config: negative size": (("video.height=-96",), "'video.height' must be an even number"),
    "config: zero chunk": (("chunk.chunk_frames=0",), "'chunk.chunk_frames' must be at least 1"),
    "config: fps 0": (("preview.fps=0",), "'preview.fps' must be between 1 and 120"),
    "config: bad no_face": (("run.no_face=maybe",), "'run.no_face' must be warn or error"),
    "output: a directory": (("-o", "{d}"), "is a folder"),
    "output: parent is a file": (("-o", "{d}/blocker/out.mp4"), "is not a folder"),
    "output: not .mp4": (("-o", "{d}/out.mov"), "must be a file name ending in .mp4"),
    "output: no suffix": (("-o", "{d}/out"), "must be a file name ending in .mp4"),
    "output: exists": (("-o", "{d}/taken.mp4"), "already exists; pass --force"),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_refused_with_one_line(media, case):
    extra, words = ERRORS[case]
    args = {"--ref": str(media / "face.png"), "--audio": str(media / "talk.wav"), "-o": str(media / "new.mp4")}
    rest = []
    extra = [a.format(d=media) for a in extra]
    while extra:
        if extra[0] in args and len(extra) > 1 and extra[0] != "-c":
            args[extra[0]], extra = extra[1], extra[2:]
        else:
            rest.append(extra.pop(0))
    before = snapshot(media)
    result = run_cli("render", *[x for kv in args.items() for x in kv], *TINY, *rest)
    assert result.exit_code == 1
    assert words in one_line(result, "Error: ")
    assert snapshot(media) == before


def test_read_only_output_folder(media, tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                                           capture_output=True).returncode:
        pytest.skip("needs a read-only mount (root)")
    try:
        result = run_cli("render", "--ref", media / "face.png", "--audio", media / "talk.wav", "-o", folder / "o.mp4",
                         *TINY)
        assert result.exit_code == 1 and "cannot take a new file" in one_line(result, "Error: ")
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_no_face_warns_by_default(media, tmp_path):
    result = run_cli("render", "--ref", media / "wall.png", "--audio", media / "talk.wav", "-o", tmp_path / "o.mp4",
                     *TINY)
    assert result.exit_code == 0
    assert "no face was found in the reference" in one_line(result, "Warning: ")
    assert (tmp_path / "o.mp4").is_file()


def decoded(path: Path) -> tuple[int, int, float]:
    """Video frames, audio channels and where the audio track ends (s, from its packets' timing)."""
    with av.open(str(path)) as c:
        frames = sum(1 for _ in c.decode(video=0))
    with av.open(str(path)) as c:
        stream = c.streams.audio[0]
        end = max(float((p.pts + p.duration) * stream.time_base) for p in c.demux(stream) if p.size)
        return frames, stream.codec_context.channels, end


def input_seconds(path: Path) -> float:
    n, rate = played_samples(path)
    return n / rate


def api(tmp_path: Path, ref: Path, audio: Path, *overrides, **kw):
    cfg = load_config(None, (*TINY, *overrides))
    out = tmp_path / "out.mp4"
    return out, render(RenderRequest(reference=ref, audio=audio, output=out, config=cfg), **kw)


@pytest.mark.parametrize("rate, channels", [(8000, 1), (11025, 3), (22050, 2), (44100, 8), (88200, 5), (96000, 8)])
def test_sample_rates_and_channels(media, tmp_path, rate, channels):
    audio = write_audio(tmp_path / "in.wav", speech_like(0.5, rate, channels), rate)
    out, rep = api(tmp_path, media / "face.png", audio)
    frames, out_channels, seconds = decoded(out)
    assert frames == rep.frames == math.ceil(0.5 * 25) and out_channels == min(channels, 2)
    assert abs(seconds - 0.5) <= 1 / 25


def test_video_file_as_audio_source(media, tmp_path):
    audio = write_audio(tmp_path / "clip.mp4", speech_like(1.2, 22050), 22050)
    out, rep = api(tmp_path, media / "face.png", audio)
    assert decoded(out)[0] == rep.frames == math.ceil(input_seconds(audio) * 25)


def test_truncated_audio_renders_what_decodes(media, tmp_path):
    whole = write_audio(tmp_path / "long.wav", speech_like(2.0, 16000), 16000).read_bytes()
    cut = tmp_path / "cut.wav"
    cut.write_bytes(whole[: len(whole) // 2 + 1])  # header still says 2 s; half the data, mid-sample
    out, rep = api(tmp_path, media / "face.png", cut)
    frames, _, seconds = decoded(out)
    assert frames == rep.frames == math.ceil(input_seconds(cut) * 25) and 0.9 < seconds < 1.1


def test_silence_gives_a_closed_mouth_that_blinks(media, tmp_path, face_png):
    audio = write_audio(tmp_path / "quiet.wav", np.zeros((1, 3 * 16000), np.float32), 16000)
    size = ("video.width=128", "video.height=128", "video.crf=0", "preview.head_motion=0", "preview.blink_interval_s=1")
    out, rep = api(tmp_path, face_png, audio, *size)
    with av.open(str(out)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)]).astype(np.int16)
    assert len(frames) == rep.frames == 75
    cfg = load_config(None, (*TINY, *size))
    layout = build_preview(cfg).prepare(RequestInput(reference=load_reference(face_png), reference_path=face_png,
                                                     width=128, height=128, seed=0)).rig.mesh.layout(detected=True)

    def change(box) -> np.ndarray:  # per frame: largest change from frame 0 in the box
        x0, y0 = int(box.x), int(box.y)
        region = frames[:, y0 : y0 + int(box.h) + 1, x0 : x0 + int(box.w) + 1]
        return np.abs(region - region[:1]).max(axis=(1, 2, 3))

    mouth, eyes = change(layout.mouth), change(layout.left_eye)
    assert mouth.max() <= 2  # the mouth never opens
    blinking = eyes > 20
    assert 0 < blinking.sum() < len(frames) // 2 and not blinking[0]  # some blinks, eyes open in between


def long_silent_wav(path: Path, seconds: int, rate: int = 8000) -> Path:
    """A 16-bit mono WAV of ``seconds`` of silence, written as a sparse file in no time."""
    data = seconds * rate * 2
    header = (b"RIFF" + struct.pack("<I", 36 + data) + b"WAVEfmt "
              + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16))
    with open(path, "wb") as f:
        f.write(header + b"data" + struct.pack("<I", data))
        f.truncate(44 + data)
    return path


def test_hours_of_audio_stream_in_constant_memory(media, tmp_path):
    audio = long_silent_wav(tmp_path / "three_hours.wav", 3 * 3600)
    seen, asked = [], [0]

    def stop() -> bool:  # asked before the first chunk, then at each keyframe (every chunk here): stop after four
        asked[0] += 1
        return asked[0] > 4

    rss = current_rss_mb()
    with pytest.raises(RenderStopped) as stopped:
        # four whole chunks
        api(tmp_path, media / "face.png", audio, "chunk.chunk_frames=25", "chunk.transition_frames=0",
            "video.gop_seconds=1", on_progress=seen.append, should_stop=stop)
    # Three hours decoded at once would be about 1 GB (0.7 GB even as 16-kHz mono float32); the margin is for
    # the allocator, whose resident size moves by tens of MB from chunk to chunk in a long test run.
    assert current_rss_mb() - rss < 400
    assert seen[-1].frames_total == 3 * 3600 * 25 and stopped.value.frames == seen[-1].frames_done == 100


@pytest.mark.slow
def test_huge_reference_does_not_exhaust_memory(media, tmp_path):
    big = flat_png(tmp_path / "big.png", 12_000, 12_000)  # 144 Mpx: 432 MB as RGB
    probe = ("import atexit, resource, sys\n"
             "atexit.register(lambda: print('peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))\n"
             "from avatar_render.cli import main\n"
             "sys.argv = ['avatar-render', *sys.argv[1:]]\nmain()\n")
    args = ["render", "--ref", str(big), "--audio", str(media / "talk.wav"), "-o", str(tmp_path / "o.mp4"), *TINY]
    done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "Traceback" not in done.stderr
    peak_mb = int(done.stdout.split("peak")[-1]) / 1024
    assert done.returncode in (0, 1) and peak_mb < 1600, (done.returncode, peak_mb, done.stderr)
