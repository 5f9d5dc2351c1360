"""An audio file shorter or longer than its header says: one warning before the render, what is there rendered."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from avatar_render.io.audio_length import length_note
from tests.cli_util import cli
from tests.media import speech_like, write_audio

RATE = 16000


def _data_size_at(data: bytes) -> int:
    """The offset of a WAV's data size field."""
    return data.index(b"data") + 4


@pytest.mark.parametrize("suffix", [".wav", ".mp3", ".flac"])
def test_a_whole_file_gets_no_note(tmp_path: Path, suffix: str) -> None:
    path = write_audio(tmp_path / f"clip{suffix}", speech_like(6.0, RATE), RATE)
    assert length_note(path) is None


@pytest.mark.parametrize("suffix", [".wav", ".mp3", ".flac"])
def test_a_file_cut_short_is_named(tmp_path: Path, suffix: str) -> None:
    path = write_audio(tmp_path / f"clip{suffix}", speech_like(6.0, RATE), RATE)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 4 // 10])
    note = length_note(path)
    assert note is not None and "cut short" in note and "6.0 s" in note, note
    assert f"'{path}'" in note


def test_a_wav_header_that_gives_less_than_the_data_holds_is_named(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "clip.wav", speech_like(6.0, RATE), RATE)
    data = bytearray(path.read_bytes())
    at = _data_size_at(data)
    data[at : at + 4] = struct.pack("<I", 2 * RATE * 2)  # 2 s of 16-bit mono
    path.write_bytes(bytes(data))
    note = length_note(path)
    assert note is not None and "4.0 s more sound after the 2.0 s" in note and "-ignore_length 1" in note, note


def test_chunks_after_the_data_and_placeholder_sizes_are_not_faults(tmp_path: Path) -> None:
    path = write_audio(tmp_path / "clip.wav", speech_like(3.0, RATE), RATE)
    data = path.read_bytes()
    listed = tmp_path / "listed.wav"
    listed.write_bytes(data + b"LIST" + struct.pack("<I", 4) + b"INFO")  # (the RIFF size is left as it was)
    assert length_note(listed) is None
    for size in (0, 0xFFFFFFFF):  # (a writer on a pipe cannot go back to fill it in)
        streamed = bytearray(data)
        at = _data_size_at(streamed)
        streamed[at : at + 4] = struct.pack("<I", size)
        path.write_bytes(bytes(streamed))
        assert length_note(path) is None


def test_a_length_ffmpeg_guesses_is_no_promise(tmp_path: Path) -> None:
    """A VBR MP3 without a Xing frame, quiet at first: FFmpeg guesses its length from the first frames' bit rate,
    far past its end; it is not cut short (it was said to be)."""
    import av
    import numpy as np

    path = tmp_path / "vbr.mp3"
    samples = np.concatenate([np.zeros((1, 3 * RATE), np.float32), speech_like(8.0, RATE)], axis=1)
    with av.open(str(path), "w", options={"write_xing": "0"}) as out:
        stream = out.add_stream("libmp3lame", rate=RATE, layout="mono")
        stream.codec_context.qscale = 2
        for i in range(0, samples.shape[1], 1152):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, i : i + 1152]), format="flt",
                                               layout="mono")
            frame.sample_rate = RATE
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    with av.open(str(path)) as c:
        guessed = float(c.streams.audio[0].duration * c.streams.audio[0].time_base)
    assert guessed > 2 * 11.0  # (the guess is far off: the case this checks)
    assert length_note(path) is None


def test_not_audio_gets_no_note(tmp_path: Path) -> None:
    text = tmp_path / "notes.wav"
    text.write_bytes(b"RIFF\x10\x00\x00\x00WAVEdata")  # (a header cut inside its first chunk)
    assert length_note(text) is None
    (tmp_path / "plain.txt").write_text("hello")
    assert length_note(tmp_path / "plain.txt") is None


def test_the_render_and_its_dry_run_warn_of_a_cut_file(tmp_path: Path, face_png: Path) -> None:
    path = write_audio(tmp_path / "talk.wav", speech_like(5.0, RATE), RATE)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 5])  # 1 s of the 5
    small = ("video.width=64", "video.height=64")
    plan = cli("render", "--ref", face_png, "--audio", path, "-o", tmp_path / "out.mp4", "--dry-run", *small)
    assert plan.returncode == 0, plan.stderr
    assert "looks cut short" in plan.stdout + plan.stderr
    done = cli("render", "--ref", face_png, "--audio", path, "-o", tmp_path / "out.mp4", *small)
    assert done.returncode == 0, done.stderr
    assert "Warning: The audio" in done.stderr and "holds 1.0 s of sound where its header gives 5.0 s" in done.stderr
    assert (tmp_path / "out.mp4").is_file()
