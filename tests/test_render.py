"""End to end through the library API: formats, frame counts, audio, motion driven by the audio."""

import hashlib
import math
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from avatar_render.api import RenderRequest, render
from avatar_render.config import load_config
from avatar_render.files.render_paths import render_paths
from tests.media import played_samples, speech_like, write_audio

SMALL = ("video.width=128", "video.height=128", "chunk.chunk_frames=20")


def read_back(path: Path):
    """(frames (N, H, W, 3) uint8, audio seconds, video stream rate)."""
    with av.open(str(path)) as c:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])
    with av.open(str(path)) as c:
        stream = c.streams.audio[0]
        samples = sum(f.samples for f in c.decode(audio=0))
        rate = stream.codec_context.sample_rate
    with av.open(str(path)) as c:
        fps = c.streams.video[0].average_rate
    return frames, samples / rate, fps


def do_render(tmp_path, ref, audio, *overrides, name="out.mp4", **kw):
    cfg = load_config(None, (*SMALL, *overrides))
    out = tmp_path / name
    report = render(RenderRequest(reference=ref, audio=audio, output=out, config=cfg, **kw))
    return out, report


@pytest.mark.parametrize(
    "suffix,rate,channels,fps",
    [(".wav", 16000, 1, 25), (".wav", 8000, 1, 30), (".flac", 96000, 2, 25), (".mp3", 44100, 2, 25),
     (".m4a", 48000, 2, 25), (".ogg", 44100, 2, 25), (".opus", 48000, 1, 25), (".mp4", 22050, 1, 25),
     (".wav", 48000, 6, 29.97)],
)
def test_formats_frame_count_and_audio(tmp_path, face_png, suffix, rate, channels, fps):
    audio = write_audio(tmp_path / f"in{suffix}", speech_like(2.3, rate, channels), rate)
    n_in, in_rate = played_samples(audio)
    out, rep = do_render(tmp_path, face_png, audio, f"preview.fps={fps}")
    frames, audio_s, video_rate = read_back(out)
    fps_exact = Fraction(30000, 1001) if fps == 29.97 else Fraction(fps)
    expected = math.ceil(Fraction(n_in, in_rate) * fps_exact)
    assert len(frames) == rep.frames == expected
    assert video_rate == fps_exact
    assert abs(audio_s - n_in / in_rate) <= 1 / float(fps_exact)
    assert frames.shape[1:] == (128, 128, 3)
    assert not render_paths(out).partial.exists()


@pytest.mark.parametrize("kind", ["rgba_png", "gray_jpg", "webp", "odd_bmp", "video"])
def test_reference_kinds(tmp_path, face_png, kind):
    img = Image.open(face_png).convert("RGB")
    if kind == "rgba_png":
        ref = tmp_path / "ref.png"
        rgba = img.convert("RGBA")
        rgba.putalpha(200)
        rgba.save(ref)
    elif kind == "gray_jpg":
        ref = tmp_path / "ref.jpg"
        img.convert("L").save(ref)
    elif kind == "webp":
        ref = tmp_path / "ref.webp"
        img.save(ref)
    elif kind == "odd_bmp":
        ref = tmp_path / "ref.bmp"
        img.resize((301, 277)).save(ref)
    else:
        ref = tmp_path / "ref.mp4"
        with av.open(str(ref), "w") as c:
            s = c.add_stream("libx264", rate=10)
            s.width, s.height, s.pix_fmt = 256, 256, "yuv420p"
            for _i in range(3):
                for p in s.encode(av.VideoFrame.from_ndarray(np.asarray(img.resize((256, 256))), format="rgb24")):
                    c.mux(p)
            for p in s.encode(None):
                c.mux(p)
    audio = write_audio(tmp_path / "in.wav", speech_like(1.0, 16000), 16000)
    out, rep = do_render(tmp_path, ref, audio)
    assert rep.frames == 25 and len(read_back(out)[0]) == 25


def mouth_box(ref: Path, width: int, height: int):
    from avatar_render.io.reference import load_reference
    from avatar_render.pipeline.types import RequestInput
    from avatar_render.preview.engine import build_preview

    cfg = load_config(None, (f"video.width={width}", f"video.height={height}"))
    static = build_preview(cfg).prepare(RequestInput(reference=load_reference(ref), reference_path=ref, width=width,
                                                     height=height, seed=0))
    assert static.face_detected
    return static.rig.mesh.layout(detected=True).mouth


def mouth_activity(frames: np.ndarray, still: np.ndarray, box) -> np.ndarray:
    x, y, w, h = box
    def region(a):
        return a[..., y : y + h, x : x + w, :].astype(np.float32)
    return np.abs(region(frames) - region(still)[None]).mean(axis=(1, 2, 3))


def test_mouth_follows_speech_and_rests_in_silence(tmp_path, face_png):
    rate = 16000
    loud = speech_like(2.0, rate)[0]
    t = np.arange(rate) / rate
    tone = (0.4 * np.sin(2 * np.pi * 180 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
    samples = np.concatenate([np.zeros(rate, np.float32), tone, np.zeros(rate, np.float32), loud])[None]
    audio = write_audio(tmp_path / "in.wav", samples, rate)
    out, _ = do_render(tmp_path, face_png, audio, "preview.head_motion=0", "preview.blink_interval_s=0", "video.crf=0",
                       "video.width=256", "video.height=256")
    frames, _, _ = read_back(out)
    m = mouth_box(face_png, 256, 256)
    box = (int(m.x - 0.2 * m.w), int(m.y), int(1.4 * m.w), int(2.5 * m.h))
    act = mouth_activity(frames, frames[0], box)
    # Inside the two silent seconds, once the mouth has settled, it stays still: the reference's own mouth
    # before any speech, the lips closed in the pause after it.
    silent = np.r_[act[3:22], mouth_activity(frames[58:72], frames[58], box)]
    speaking = act[28:47]
    assert silent.max() < 2.0, silent
    assert speaking.mean() > 6.0 and speaking.mean() > 5 * (silent.mean() + 0.1), (speaking.mean(), silent.mean())


def test_motion_is_continuous_across_chunks(tmp_path, face_png):
    audio = write_audio(tmp_path / "in.wav", speech_like(4.0, 16000), 16000)
    # lossless, so that the comparison sees the motion rather than the codec
    out, _ = do_render(tmp_path, face_png, audio, "chunk.chunk_frames=10", "chunk.transition_frames=0",  # N seams only
                       "preview.blink_interval_s=0", "video.crf=0")
    frames = read_back(out)[0].astype(np.float32)
    step = np.abs(np.diff(frames, axis=0)).mean(axis=(1, 2, 3))  # change from frame i to i+1
    seams = step[9::10]
    assert seams.mean() < 2.5 * np.median(step) + 0.5, (seams, np.median(step))


def test_same_seed_same_frames(tmp_path, face_png):
    audio = write_audio(tmp_path / "in.wav", speech_like(2.0, 16000), 16000)
    digests = []
    for name in ("a.mp4", "b.mp4"):
        out, _ = do_render(tmp_path, face_png, audio, name=name)
        digests.append(hashlib.sha256(read_back(out)[0].tobytes()).hexdigest())
    assert digests[0] == digests[1]


def test_interpolation_chunks_keep_count_and_order(tmp_path, face_png):
    audio = write_audio(tmp_path / "in.wav", speech_like(3.1, 16000), 16000)
    out, rep = do_render(tmp_path, face_png, audio, "chunk.chunk_frames=16", "chunk.transition_frames=6",
                         report=tmp_path / "r.json")
    assert len(read_back(out)[0]) == rep.frames == math.ceil(3.1 * 25)
    import json

    chunks = json.loads((tmp_path / "r.json").read_text())["chunks"]
    starts = [c["start"] for c in chunks]
    assert starts == sorted(starts) and all(a["end"] == b["start"] for a, b in zip(chunks, chunks[1:]))
    assert {c["kind"] for c in chunks} == {"N", "I"}


def test_existing_output_is_kept_without_force(tmp_path, face_png):
    from avatar_render.errors import AvatarRenderError

    audio = write_audio(tmp_path / "in.wav", speech_like(1.0, 16000), 16000)
    out = tmp_path / "out.mp4"
    out.write_bytes(b"precious")
    with pytest.raises(AvatarRenderError, match="already exists"):
        do_render(tmp_path, face_png, audio)
    assert out.read_bytes() == b"precious"
    do_render(tmp_path, face_png, audio, force=True)
    assert len(read_back(out)[0]) == 25
