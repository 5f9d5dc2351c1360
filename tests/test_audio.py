"""Tests for avatar_render.io.audio: formats, exact lengths, padding, probing, bounded memory, errors."""

from __future__ import annotations

import math
import wave
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from avatar_render.errors import AvatarRenderError
from avatar_render.io.audio import AudioReader
from tests.media import decoded_samples, speech_like, write_audio, write_video_without_audio, write_wav

FPS = Fraction(25)
NTSC = Fraction(30000, 1001)
LOSSLESS = {".wav", ".flac", ".mkv"}
EDITED = {".m4a", ".mp4"}  # the MP4 edit list gives the track's exact length: the encoder's padding after it is cut
CODECS = {".wav": "pcm_s16le", ".flac": "flac", ".mp3": "mp3", ".m4a": "aac", ".ogg": "vorbis", ".opus": "opus"}
CODECS |= {".mp4": "aac", ".mkv": "flac", ".webm": "opus"}


def stream_all(reader: AudioReader, chunk: int = 7, *, release: bool = True) -> tuple[np.ndarray, np.ndarray, float]:
    """Read the whole file the way the pipeline does; return (output (C, n), model (n,), peak buffered s)."""
    outputs, models, peak, frame = [], [], 0.0, 0
    while reader.total_frames is None or frame < reader.total_frames:
        end = reader.probe(frame + chunk)
        assert end > frame
        outputs.append(reader.output_audio(frame, end))
        models.append(reader.model_audio(frame, end))
        peak = max(peak, reader.buffered_seconds)
        if release:
            reader.release(frame)
        frame = end
    return np.concatenate(outputs, axis=1), np.concatenate(models), peak


CASES = [
    (".wav", 8000, 1, FPS),
    (".wav", 22050, 2, NTSC),
    (".wav", 44100, 6, FPS),
    (".wav", 48000, 1, NTSC),
    (".wav", 96000, 2, FPS),
    (".flac", 44100, 2, NTSC),
    (".flac", 96000, 6, FPS),
    (".mp3", 8000, 1, FPS),
    (".mp3", 22050, 1, NTSC),
    (".mp3", 44100, 2, FPS),
    (".m4a", 48000, 2, FPS),
    (".m4a", 44100, 6, NTSC),
    (".ogg", 44100, 2, FPS),
    (".opus", 48000, 2, NTSC),
    (".opus", 22050, 1, FPS),  # written resampled to 48 kHz
    (".mp4", 44100, 2, FPS),
    (".mkv", 96000, 6, NTSC),
    (".webm", 48000, 2, FPS),
]


@pytest.mark.parametrize(("suffix", "rate", "channels", "fps"), CASES, ids=lambda v: str(v))
def test_formats_have_exact_lengths(tmp_path: Path, suffix: str, rate: int, channels: int, fps: Fraction) -> None:
    seconds = 1.3
    path = write_audio(tmp_path / f"clip{suffix}", speech_like(seconds, rate, channels), rate)
    n, in_rate = decoded_samples(path)
    if suffix in LOSSLESS:
        assert n == round(seconds * rate)
    else:  # codec priming/padding may remain
        assert abs(n / in_rate - seconds) < 0.1
    if suffix in EDITED:
        assert n > round(seconds * rate)  # (the decoder hands out the padding too)
        n = round(seconds * rate)

    with AudioReader(path, fps=fps) as reader:
        info = reader.info
        assert info.codec == CODECS[suffix] and info.path == path
        assert (info.sample_rate, info.channels) == (in_rate, channels)
        assert (info.output_rate, info.output_channels) == (in_rate, min(channels, 2))
        assert info.estimated_seconds == pytest.approx(seconds, abs=0.1)
        assert reader.total_frames is None
        output, model, _ = stream_all(reader)

    assert reader.total_frames == math.ceil(Fraction(n) * fps / in_rate)
    if suffix in LOSSLESS:
        assert reader.total_frames == math.ceil(Fraction(round(seconds * rate)) * fps / rate)
    assert output.dtype == np.float32 and output.shape == (info.output_channels, n)
    assert model.dtype == np.float32
    assert len(model) == round(Fraction(reader.total_frames) / fps * 16000)
    assert np.count_nonzero(model[round(Fraction(n, in_rate) * 16000) + 1 :]) == 0  # zeros past the end
    assert 0.05 < np.abs(output).max() < 1.0 and 0.05 < np.abs(model).max() < 1.0


def test_unsupported_rate_is_resampled_to_48k(tmp_path: Path) -> None:
    rate, seconds = 37800, 1.0
    path = write_audio(tmp_path / "odd.wav", speech_like(seconds, rate, 2), rate)
    with AudioReader(path, fps=FPS) as reader:
        assert (reader.info.output_rate, reader.info.output_channels) == (48000, 2)
        output, _, _ = stream_all(reader, chunk=4)
    assert output.shape == (2, 48000)
    assert reader.total_frames == 25


def test_many_channels_and_unnamed_layouts_downmix_to_stereo(tmp_path: Path) -> None:
    eight = write_audio(tmp_path / "eight.wav", speech_like(1.0, 48000, 8), 48000)
    three = tmp_path / "three.wav"  # plain PCM header: three channels with no layout
    with wave.open(str(three), "wb") as out:
        out.setnchannels(3)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes((speech_like(1.0, 16000, 3).T * 32767).astype("<i2").tobytes())
    for path, channels, rate in ((eight, 8, 48000), (three, 3, 16000)):
        with AudioReader(path, fps=FPS) as reader:
            assert (reader.info.channels, reader.info.output_channels) == (channels, 2)
            output, model, _ = stream_all(reader)
        assert output.shape == (2, rate) and len(model) == 16000
        assert np.abs(output).max() > 0.05 and np.abs(model).max() > 0.05


@pytest.mark.parametrize("channels", [9, 32])
def test_channels_in_no_known_order_are_averaged(tmp_path: Path, channels: int) -> None:
    """FFmpeg cannot mix 9 or 32 channels without a layout; the reader takes their mean instead of failing."""
    weights = np.linspace(0.1, 0.9, channels)[:, None]  # (C, 1)
    tone = np.sin(2 * np.pi * 200 * np.arange(16000) / 16000)[None]  # (1, n)
    path = write_wav(tmp_path / "many.wav", weights * tone * 0.5, 16000)
    with AudioReader(path, fps=FPS) as reader:
        assert (reader.info.channels, reader.info.output_channels) == (channels, 2)
        output, model, _ = stream_all(reader)
    expected = (np.round(weights * tone * 0.5 * 32767) / 32768).mean(axis=0)  # (n,) the mean of the stored samples
    assert output.shape == (2, 16000) and np.allclose(output, expected[None], atol=1e-4)
    assert np.allclose(model, expected, atol=1e-4)


@pytest.mark.slow
def test_a_minute_of_mp3_streams_whole(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "minute.mp3", speech_like(60.0, 44100, 2), 44100)
    with AudioReader(path, fps=FPS) as reader:
        output, _, _ = stream_all(reader, chunk=25)
    assert output.shape[1] == decoded_samples(path)[0]


def test_views_match_input_and_each_other(tmp_path: Path) -> None:
    signal = speech_like(2.0, 16000, 1, seed=3)
    path = write_audio(tmp_path / "clip.wav", signal, 16000)
    with AudioReader(path, fps=FPS) as reader:
        output, model, _ = stream_all(reader, chunk=3)
    quantized = np.round(signal * 32767) / 32767
    np.testing.assert_allclose(output, quantized, atol=2e-4)
    np.testing.assert_allclose(model, quantized[0], atol=2e-4)


def test_views_stay_in_sync_after_resampling(tmp_path: Path) -> None:
    rate = 44100
    signal = np.zeros((2, 3 * rate), np.float32)
    t = np.arange(rate // 2) / rate
    signal[:, rate : rate + rate // 2] = 0.5 * np.sin(2 * np.pi * 440 * t)  # a tone from 1.0 s to 1.5 s
    path = write_audio(tmp_path / "tone.wav", signal, rate)
    with AudioReader(path, fps=FPS) as reader:
        output, model, _ = stream_all(reader, chunk=5)
    onset_out = np.flatnonzero(np.abs(output[0]) > 0.05)[0] / rate
    onset_model = np.flatnonzero(np.abs(model) > 0.05)[0] / 16000
    assert onset_out == pytest.approx(1.0, abs=0.002)
    assert onset_model == pytest.approx(1.0, abs=0.002)


def test_chunked_model_audio_equals_one_read(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "clip.mp3", speech_like(3.0, 44100, 2), 44100)
    with AudioReader(path, fps=NTSC) as reader:
        _, chunked, _ = stream_all(reader, chunk=5, release=False)
    with AudioReader(path, fps=NTSC) as reader:
        reader.probe(10**6)
        whole = reader.model_audio(0, reader.total_frames)
    np.testing.assert_array_equal(chunked, whole)


def test_model_audio_padding(tmp_path: Path) -> None:
    signal = speech_like(1.0, 16000, 1)
    path = write_audio(tmp_path / "clip.wav", signal, 16000)
    with AudioReader(path, fps=FPS) as reader:
        start = reader.model_audio(0, 5, pad_s=0.5)
        assert start.shape == (3200 + 2 * 8000,)
        assert np.count_nonzero(start[:8000]) == 0
        np.testing.assert_allclose(start[8000:], np.round(signal[0, :11200] * 32767) / 32767, atol=2e-4)

        middle = reader.model_audio(10, 12, pad_s=0.1)
        np.testing.assert_allclose(middle, np.round(signal[0, 4800:9280] * 32767) / 32767, atol=2e-4)

        end = reader.model_audio(20, 30, pad_s=0.25)  # audio ends at frame 25
        assert end.shape == (6400 + 8000,)
        np.testing.assert_allclose(end[:7200], np.round(signal[0, 8800:] * 32767) / 32767, atol=2e-4)
        assert np.count_nonzero(end[7200:]) == 0
        assert reader.total_frames == 25


def test_probe_near_the_end(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "clip.wav", speech_like(1.3, 16000, 1), 16000)  # 32.5 frames at 25 fps
    with AudioReader(path, fps=FPS, lookahead_s=0.5) as reader:
        assert reader.probe(10) == 10
        assert reader.total_frames is None  # 0.9 s is enough, the end is not known yet
        assert reader.probe(30) == 30  # 1.7 s needed: decodes to the end
        assert reader.total_frames == 33
        assert reader.probe(33) == 33
        assert reader.probe(40) == 33
        assert reader.output_audio(0, 40).shape == (1, 20800)
    with AudioReader(path, fps=FPS, lookahead_s=0.0) as reader:
        assert reader.probe(32) == 32
        assert reader.probe(34) == 33


def test_last_chunk_returns_the_real_end(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "clip.wav", speech_like(1.01, 8000, 1), 8000)  # 8080 samples, 26 frames
    with AudioReader(path, fps=FPS) as reader:
        first = reader.output_audio(0, 25)
        last = reader.output_audio(25, 26)
        assert reader.total_frames == 26
    assert first.shape == (1, 8000) and last.shape == (1, 80)


def test_long_file_streams_in_bounded_memory(tmp_path: Path) -> None:
    rate = 8000
    path = write_audio(tmp_path / "long.wav", speech_like(600.0, rate, 1), rate)
    with AudioReader(path, fps=FPS) as reader:
        frame, total, peak = 0, 0, 0.0
        while reader.total_frames is None or frame < reader.total_frames:
            end = reader.probe(frame + 25)
            total += reader.output_audio(frame, end).shape[1]
            reader.model_audio(frame, end, pad_s=0.2)
            reader.release(frame)
            peak = max(peak, reader.buffered_seconds)
            frame = end
    assert total == 600 * rate
    assert reader.total_frames == 15000
    assert peak < 1.0 + 0.5 + 1.0 + 0.5  # chunk + lookahead + release margin + decoder slack


def test_released_samples_cannot_be_read(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "clip.wav", speech_like(5.0, 16000, 1), 16000)
    with AudioReader(path, fps=FPS) as reader:
        reader.probe(100)
        reader.release(100)
        assert reader.model_audio(75, 100).shape == (16000,)  # inside the 1 s margin
        with pytest.raises(ValueError):
            reader.model_audio(0, 10)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(AvatarRenderError, match=r"nope\.wav' does not exist"):
        AudioReader(tmp_path / "nope.wav", fps=FPS)


def test_text_file_named_wav(tmp_path: Path) -> None:
    path = tmp_path / "notes.wav"
    path.write_text("these are not samples\n" * 20)
    with pytest.raises(AvatarRenderError, match=r"notes\.wav' is not a readable"):
        AudioReader(path, fps=FPS)


def test_empty_wav(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "empty.wav", np.zeros((1, 0), np.float32), 16000)
    with pytest.raises(AvatarRenderError, match=r"empty\.wav' holds no audio samples"):
        AudioReader(path, fps=FPS)


def test_video_without_audio(tmp_path: Path) -> None:
    path = write_video_without_audio(tmp_path / "silent.mp4", 1.0)
    with pytest.raises(AvatarRenderError, match=r"silent\.mp4' has no audio track"):
        AudioReader(path, fps=FPS)


@pytest.mark.parametrize("suffix", [".wav", ".mp3", ".flac", ".mkv"])
def test_truncated_file_decodes_what_is_there(tmp_path: Path, suffix: str) -> None:
    rate = 44100
    path = write_audio(tmp_path / f"clip{suffix}", speech_like(4.0, rate, 2), rate)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with AudioReader(path, fps=FPS) as reader:
        output, _, _ = stream_all(reader, chunk=10)
    seconds = output.shape[1] / rate
    assert 1.0 < seconds < 3.0
    assert reader.total_frames == math.ceil(Fraction(output.shape[1]) * FPS / rate)


def test_truncated_m4a_without_its_index_is_a_clear_error(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "clip.m4a", speech_like(4.0, 44100, 2), 44100)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the sample index is written at the end
    with pytest.raises(AvatarRenderError, match=r"clip\.m4a' is not a readable"):
        AudioReader(path, fps=FPS)


def test_corrupt_bytes_mid_file_are_skipped(tmp_path: Path) -> None:
    rate = 44100
    path = write_audio(tmp_path / "clip.mp3", speech_like(4.0, rate, 2), rate)
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 1500] = np.random.default_rng(0).integers(0, 256, 1500, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    with AudioReader(path, fps=FPS) as reader:
        output, _, _ = stream_all(reader, chunk=10)
    assert output.shape[1] / rate > 3.5


def test_a_downmix_past_full_scale_is_bent_under_it(tmp_path: Path, monkeypatch) -> None:
    """Six channels of the same loud speech mixed to stereo: FFmpeg's matrix adds them up to 2.4 times full scale
    (a player's decoder clipped it); the output view's peaks are bent under 1 dB below full scale. Quiet sound is left
    as FFmpeg mixes it."""
    import avatar_render.io.audio as audio

    voice = speech_like(2.0, 48000)
    voice /= np.abs(voice).max()

    def mixed(level: float, name: str) -> np.ndarray:
        path = write_wav(tmp_path / name, np.repeat(voice * level, 6, axis=0), 48000)
        with AudioReader(path, fps=FPS) as reader:
            reader.probe(10**6)
            return reader.output_audio(0, reader.total_frames)

    knee, ceiling = audio._KNEE, audio._CEILING
    loud, quiet = mixed(0.8, "loud.wav"), mixed(0.2, "quiet.wav")
    monkeypatch.setattr(audio, "_KNEE", 1e9)  # (FFmpeg's mix alone)
    plain_loud, plain_quiet = mixed(0.8, "loud.wav"), mixed(0.2, "quiet.wav")
    assert np.abs(plain_loud).max() > 1.5 and np.abs(loud).max() <= ceiling < 1.0
    under = np.abs(plain_loud) <= knee
    assert np.array_equal(loud[under], plain_loud[under])  # (only the peaks are bent)
    assert np.all(np.abs(loud[~under]) > knee)
    assert np.array_equal(quiet, plain_quiet) and np.abs(quiet).max() < knee
