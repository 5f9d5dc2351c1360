"""Synthesize small media files for tests, with PyAV only (no external binaries)."""

from __future__ import annotations

import struct
from pathlib import Path

import av
import numpy as np

_LAYOUTS = {1: "mono", 2: "stereo", 3: "2.1", 4: "quad", 5: "5.0", 6: "5.1", 7: "6.1", 8: "7.1"}
_VIDEO_FPS = 10
_VIDEO_SIZE = 64


def speech_like(seconds: float, rate: int, channels: int = 1, *, seed: int = 0) -> np.ndarray:
    """Syllable-like voiced bursts separated by pauses, float32 (channels, n), peak below 0.5.

    Bursts are 0.1-0.3 s harmonic tones (gliding pitch, a little noise) under a Hann envelope,
    so the loudness is modulated at roughly 3-6 Hz. Pauses are exact zeros, and one pause of
    0.6 s (cut at the clip's end) starts at min(1 s, 40 % of the clip).
    """
    rng = np.random.default_rng(seed)
    n = round(seconds * rate)
    env = np.zeros(n, np.float32)  # (n,) loudness envelope, 0 in pauses
    f0 = np.full(n, 150.0)  # (n,) pitch in Hz
    pause_start = min(1.0, 0.4 * seconds)
    t = 0.05
    while t < seconds:
        if pause_start <= t < pause_start + 0.6:
            t = pause_start + 0.6
            continue
        end = t + rng.uniform(0.1, 0.3)
        if t < pause_start:
            end = min(end, pause_start)
        a, b = round(t * rate), min(round(end * rate), n)
        if b - a > 2:
            env[a:b] = np.hanning(b - a) * rng.uniform(0.5, 1.0)
            f0[a:b] = np.linspace(rng.uniform(100, 220), rng.uniform(100, 220), b - a)
        t = end + rng.uniform(0.04, 0.15)
    phase = (2 * np.pi * np.cumsum(f0) / rate % (2 * np.pi)).astype(np.float32)  # (n,)
    noise = rng.standard_normal(n, np.float32)
    # Channel c shifts harmonic k by 0.3 * c * k radians: sin(x + s) = sin x cos s + cos x sin s.
    harmonics = [(k, np.sin(k * phase), np.cos(k * phase)) for k in range(1, 6)]
    out = np.empty((channels, n), np.float32)
    for c in range(channels):
        voiced = np.zeros(n, np.float32)
        for k, sin, cos in harmonics:
            voiced += sin * float(0.6 / k * np.cos(0.3 * c * k)) + cos * float(0.6 / k * np.sin(0.3 * c * k))
        out[c] = env * (voiced * (0.2 - 0.01 * c) + noise * 0.016)
    return out


def write_audio(path: Path, samples: np.ndarray, rate: int) -> Path:
    """Encode float samples (C, n) at ``rate``; codec and container follow the suffix.

    .wav pcm_s16le, .flac, .mp3 libmp3lame, .m4a aac, .ogg vorbis (stereo only unless libvorbis
    is available), .opus libopus (resampled to 48 kHz). .mp4 (aac), .mkv (flac) and .webm (opus)
    also get a small gray video stream, so they are real video files with an audio track.
    """
    path = Path(path)
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    suffix = path.suffix.lower()
    codec = {
        ".wav": "pcm_s16le",
        ".flac": "flac",
        ".mp3": "libmp3lame",
        ".m4a": "aac",
        ".ogg": _vorbis_encoder(),
        ".opus": "libopus",
        ".mp4": "aac",
        ".mkv": "flac",
        ".webm": "libopus",
    }.get(suffix)
    if codec is None:
        raise ValueError(f"no test encoder for {suffix!r}")
    channels = samples.shape[0]
    if codec == "vorbis" and channels != 2:
        raise ValueError("the built-in vorbis encoder only writes stereo")
    if codec == "libopus" and rate != 48000:
        samples, rate = _resample(samples, rate, 48000), 48000
    with_video = suffix in (".mp4", ".mkv", ".webm")
    with av.open(str(path), "w") as container:
        video = _add_video(container, suffix) if with_video else None
        audio = container.add_stream(codec, rate=rate, layout=_LAYOUTS[channels])
        if codec == "vorbis":
            audio.codec_context.options = {"strict": "-2"}
        container.start_encoding()  # so that a clip of zero samples still gets a header
        step = rate // _VIDEO_FPS  # audio samples muxed per video frame
        n = samples.shape[1]
        for i, start in enumerate(range(0, n, step)):
            frame = _audio_frame(samples[:, start : start + step])
            frame.sample_rate = rate
            frame.pts = start
            container.mux(audio.encode(frame))
            if video is not None:
                container.mux(video.encode(_gray_frame(i)))
        container.mux(audio.encode(None))
        if video is not None:
            container.mux(video.encode(None))
    return path


def write_video_without_audio(path: Path, seconds: float) -> Path:
    """A small gray video (mpeg4, or vp8 for .webm) with no audio stream."""
    path = Path(path)
    with av.open(str(path), "w") as container:
        video = _add_video(container, path.suffix.lower())
        for i in range(max(1, round(seconds * _VIDEO_FPS))):
            container.mux(video.encode(_gray_frame(i)))
        container.mux(video.encode(None))
    return path


def _vorbis_encoder() -> str:
    try:
        av.Codec("libvorbis", "w")
        return "libvorbis"
    except Exception:
        return "vorbis"


def _add_video(container: av.container.OutputContainer, suffix: str) -> av.VideoStream:
    video = container.add_stream("libvpx" if suffix == ".webm" else "mpeg4", rate=_VIDEO_FPS)
    video.width = video.height = _VIDEO_SIZE
    video.pix_fmt = "yuv420p"
    return video


def _gray_frame(i: int) -> av.VideoFrame:
    level = 64 + (i * 8) % 128
    image = np.full((_VIDEO_SIZE, _VIDEO_SIZE), level, np.uint8)  # (H, W)
    frame = av.VideoFrame.from_ndarray(image, format="gray")
    frame.pts = i
    return frame.reformat(format="yuv420p")


def _resample(samples: np.ndarray, rate: int, new_rate: int) -> np.ndarray:
    """(C, n) float32 at ``rate`` -> (C, m) float32 at ``new_rate``."""
    channels = samples.shape[0]
    resampler = av.AudioResampler(format="fltp", layout=_LAYOUTS[channels], rate=new_rate)
    frame = _audio_frame(samples)
    frame.sample_rate = rate
    frame.pts = 0
    out = [f.to_ndarray() for f in resampler.resample(frame) + resampler.resample(None)]
    return np.concatenate(out, axis=1) if out else np.zeros((channels, 0), np.float32)


def _audio_frame(samples: np.ndarray) -> av.AudioFrame:
    """(C, n) float32 -> an interleaved frame (PyAV mishandles planar frames of 8 channels)."""
    interleaved = np.ascontiguousarray(samples.T).reshape(1, -1)  # (1, n * C)
    return av.AudioFrame.from_ndarray(interleaved, format="flt", layout=_LAYOUTS[samples.shape[0]])


_WAV_FORMATS = {"u8": (1, 8), "s16": (1, 16), "f32": (3, 32), "f64": (3, 64)}  # sample format: (format tag, bits)


def write_wav(path: Path, samples: np.ndarray, rate: int, *, sample_format: str = "s16",
              format_tag: int | None = None) -> Path:
    """A plain RIFF/WAVE file of (C, n) float samples, written byte by byte: any rate, any channel count
    (no channel mask, so more than two channels are in no known order), NaN and infinity kept in float
    formats. ``format_tag`` overrides the codec field (e.g. one no decoder knows)."""
    tag, bits = _WAV_FORMATS[sample_format]
    channels = samples.shape[0]
    interleaved = np.ascontiguousarray(np.asarray(samples, np.float64).T)  # (n, C)
    if sample_format == "f32":
        data = interleaved.astype("<f4").tobytes()
    elif sample_format == "f64":
        data = interleaved.astype("<f8").tobytes()
    elif sample_format == "u8":
        data = np.round(np.clip(interleaved, -1, 1) * 127 + 128).astype(np.uint8).tobytes()
    else:
        data = np.round(np.clip(interleaved, -1, 1) * 32767).astype("<i2").tobytes()
    block = channels * bits // 8
    fmt = struct.pack("<HHIIHH", format_tag or tag, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    Path(path).write_bytes(b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks)
    return Path(path)


def decoded_samples(path: Path) -> tuple[int, int]:
    """(samples, rate) of the first audio stream, decoded plainly with PyAV, skipping bad packets."""
    n, rate = 0, 0
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        try:
            for packet in container.demux(stream):
                try:
                    frames = stream.codec_context.decode(packet)
                except av.FFmpegError:
                    continue
                for frame in frames:
                    n, rate = n + frame.samples, frame.sample_rate
        except av.FFmpegError:
            pass
    return n, rate


def played_samples(path: Path) -> tuple[int, int]:
    """``decoded_samples`` as a player plays them: up to an MP4's track length (its edit list: the encoder's
    padding after it is not played)."""
    n, rate = decoded_samples(path)
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        if container.format.name.startswith("mov") and stream.duration and rate:
            n = min(n, round(stream.duration * stream.time_base * rate))
    return n, rate
