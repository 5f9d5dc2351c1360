"""Whether an audio file holds the length its header promises: a file cut short in a copy or a download (or a
recorder that stopped before it wrote its header) renders what is there, and the user is told so before the render.

A WAV's header gives its data's size in bytes, which FFmpeg trusts over the file (it reads no further than the
size, and shortens the size to the file's): it is read here (``_wav_sizes``). Other formats' headers give a
duration (FLAC's stream info, an MP3's Xing, Info or VBRI frame, an MP4's or a Matroska file's boxes): the file is
opened again and its last second looked for (``_ends_early``); a seek to where it should be that finds the data end
well before is a cut file. Where no header gives the length (an MP3 without such a frame, ADTS, Ogg), FFmpeg
guesses it from the bit rate, and a guess is no promise: those are not checked.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Optional

import av

from avatar_render.files.names import shown

_SLACK_S = 1.5  # the data may end this much before the header's duration without a word (encoder padding)
_PACKETS = 200  # packets read after the seek at most (seconds of audio for any codec)
_PLACEHOLDERS = (0, 0xFFFFFFFF)  # data sizes a writer that could not go back to its header leaves
_STATED = ("flac", "mov", "matroska")  # formats whose header states the length (FFmpeg's names begin so)
_MP3_TAGS = (b"Xing", b"Info", b"VBRI")  # an MP3's first frame that states the frames it has


def length_note(path: Path) -> Optional[str]:
    """One sentence for the user when the audio file ``path`` is shorter or longer than its header says; else None."""
    try:
        with open(path, "rb") as f:
            sizes = _wav_sizes(f, path.stat().st_size)
        if sizes is not None:
            return _wav_note(path, *sizes)
        return _ends_early(path)
    except (OSError, av.FFmpegError, struct.error, ValueError):
        return None  # (what cannot be read here is the decoder's to report)


def _wav_note(path: Path, promised: int, present: int, byte_rate: int, more_chunks: bool) -> Optional[str]:
    if promised in _PLACEHOLDERS or byte_rate <= 0:
        return None
    said, held = promised / byte_rate, present / byte_rate
    if held < said - 0.1:
        return (f"The audio {shown(path)} holds {held:.1f} s of sound where its header gives {said:.1f} s: the file "
                "looks cut short; the video ends where its sound does.")
    if held > said + 0.1 and not more_chunks:
        return (f"The audio {shown(path)} holds {held - said:.1f} s more sound after the {said:.1f} s its header "
                "gives, which is not read: re-save it with its whole length (ffmpeg -ignore_length 1 -i IN.wav "
                "OUT.wav) to render all of it.")
    return None


def _wav_sizes(f: BinaryIO, size: int) -> Optional[tuple[int, int, int, bool]]:
    """(data bytes the header gives, data bytes in the file, bytes a second, whether a chunk follows the data) of a
    RIFF/RF64 WAV; None for any other file."""
    head = f.read(12)
    if len(head) < 12 or head[8:12] != b"WAVE" or head[:4] not in (b"RIFF", b"RIFX", b"RF64"):
        return None
    order = ">" if head[:4] == b"RIFX" else "<"
    long_size, byte_rate, at = None, 0, 12
    while at + 8 <= size:
        f.seek(at)
        cid, n = struct.unpack(order + "4sI", f.read(8))
        if cid == b"ds64":  # (RF64: the sizes that do not fit 32 bits: the RIFF's, then the data's)
            long_size = struct.unpack("<QQ", f.read(16))[1]
        elif cid == b"fmt ":
            byte_rate = struct.unpack(order + "HHII", f.read(12))[3]
        elif cid == b"data":
            if head[:4] == b"RF64" and n == 0xFFFFFFFF and long_size is not None:
                n = long_size
            start = at + 8
            end = start + n + (n & 1)
            f.seek(end)
            follows = f.read(4)
            more = len(follows) == 4 and all(32 <= c < 127 for c in follows)  # (a LIST or id3 chunk after the data)
            return n, max(size - start, 0), byte_rate, more
        at += 8 + n + (n & 1)
    return None


def _ends_early(path: Path) -> Optional[str]:
    """The note for a file whose data ends well before the duration its header gives (None: it does not, or
    cannot tell)."""
    with av.open(str(path), "r") as container:
        streams = container.streams.audio
        if not streams or not streams[0].duration or not streams[0].time_base:
            return None
        name = container.format.name
        if not (name.startswith(_STATED) or name == "mp3" and _mp3_states_length(path)):
            return None
        stream = streams[0]
        said = float(stream.duration * stream.time_base)
        if said < 2 * _SLACK_S:
            return None
        container.seek(int((said - 1.0) / stream.time_base), stream=stream, backward=True)
        last, packets = None, container.demux(stream)
        for _ in range(_PACKETS + 1):
            try:
                packet = next(packets)
            except (StopIteration, av.FFmpegError):  # (the end of the data, or a cut packet at it)
                break
            if packet.pts is not None:
                last = float((packet.pts + (packet.duration or 0)) * stream.time_base)
        else:
            return None  # (not at the end yet: the seek landed far before it)
        if last is None or last >= said - _SLACK_S:
            return None
    return (f"The audio {shown(path)} ends near {last:.1f} s where its header gives {said:.1f} s: the file looks "
            "cut short; the video ends where its sound does.")


def _mp3_states_length(path: Path) -> bool:
    """Whether the MP3 file's first frame (after an ID3v2 tag) is a Xing, Info or VBRI frame."""
    with open(path, "rb") as f:
        head = f.read(10)
        start = 0
        if len(head) == 10 and head[:3] == b"ID3":  # (its size: four 7-bit bytes, then a footer if flagged)
            start = 10 + sum((b & 0x7F) << (7 * (3 - i)) for i, b in enumerate(head[6:10])) + 10 * bool(head[5] & 0x10)
        f.seek(start)
        frame = f.read(4096)
    sync = next((i for i in range(len(frame) - 1) if frame[i] == 0xFF and frame[i + 1] & 0xE0 == 0xE0), None)
    return sync is not None and any(tag in frame[sync : sync + 200] for tag in _MP3_TAGS)
