"""Fragmented MP4 boxes (ISO/IEC 14496-12; H.264 per 14496-15, AAC per 14496-14).

``Fmp4Muxer`` writes an init segment (``ftyp`` + ``moov`` without samples), then one ``moof`` +
``mdat`` per call, each flushed to the operating system at once. Its counters (``MuxerState``) are
all it needs to go on appending to a file cut back to a fragment boundary; ``scan_fragments``
checks that a file holds whole fragments up to a given byte offset.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from fractions import Fraction
from typing import BinaryIO, Iterator, Optional

AAC_FRAME = 1024  # samples per AAC frame
AAC_PRIMING = 1024  # silent samples FFmpeg's native aac encoder puts before the first input sample
_MOVIE_TIMESCALE = 1000
_VIDEO_ID, _AUDIO_ID = 1, 2
_SYNC_SAMPLE, _NON_SYNC_SAMPLE = 0x02000000, 0x01010000  # trun sample_flags
TFHD_FLAGS = 0x020000  # default-base-is-moof, and no defaults
TRUN_FLAGS = 0x000701  # a data offset; per sample: duration, size, flags
_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)


@dataclass(frozen=True)
class Sample:
    data: bytes
    duration: int  # in the track's timescale
    key: bool


@dataclass(frozen=True)
class Tracks:
    """What the init segment describes: one H.264 and one AAC track."""

    width: int
    height: int
    fps: Fraction
    audio_rate: int
    audio_channels: int
    audio_bitrate: int
    avc_extradata: bytes  # Annex B SPS + PPS
    aac_extradata: bytes  # AudioSpecificConfig


@dataclass(frozen=True)
class MuxerState:
    sequence: int = 0  # fragments written
    video_time: int = 0  # decode time of the next video sample, video timescale
    audio_time: int = 0  # decode time of the next audio sample, audio timescale (priming included)


def video_timescale(fps: Fraction) -> tuple[int, int]:
    """The video track's timescale and one frame's duration in it. Like FFmpeg, tiny timescales (25)
    are scaled up so players need no rounding: 25 fps -> 12800."""
    scale = 1
    while fps.numerator * scale < 10000:
        scale *= 2
    return fps.numerator * scale, fps.denominator * scale


class Fmp4Muxer:
    """``file`` is where ``write_init`` and ``write_fragment`` write (None for a muxer whose caller
    writes the bytes of ``init_segment`` and ``fragment`` itself)."""

    def __init__(self, file: Optional[BinaryIO], tracks: Tracks, state: MuxerState = MuxerState()):
        self.file = file
        self.tracks = tracks
        self.video_timescale, self.frame_duration = video_timescale(tracks.fps)
        self.sequence = state.sequence
        self.video_time = state.video_time
        self.audio_time = state.audio_time

    @property
    def state(self) -> MuxerState:
        return MuxerState(sequence=self.sequence, video_time=self.video_time, audio_time=self.audio_time)

    def write_init(self) -> None:
        self._write(self.init_segment())

    def write_fragment(self, video: list[Sample], audio: list[Sample]) -> None:
        data = self.fragment(video, audio, advance=False)
        if data:
            self._write(data)
            self._advance(video, audio)

    def fragment(self, video: list[Sample], audio: list[Sample], *, advance: bool = True) -> bytes:
        """The next ``moof`` + ``mdat`` (b"" when both lists are empty); with ``advance`` the counters
        move past it."""
        runs = [(_VIDEO_ID, self.video_time, video), (_AUDIO_ID, self.audio_time, audio)]
        runs = [run for run in runs if run[2]]
        if not runs:
            return b""
        moof = self._moof(runs, 0)
        moof = self._moof(runs, len(moof) + 8)  # data offsets need the moof's own size
        mdat = b"".join(s.data for _, _, samples in runs for s in samples)
        if advance:
            self._advance(video, audio)
        return moof + struct.pack(">I4s", 8 + len(mdat), b"mdat") + mdat

    def _advance(self, video: list[Sample], audio: list[Sample]) -> None:
        self.sequence += 1
        self.video_time += sum(s.duration for s in video)
        self.audio_time += sum(s.duration for s in audio)

    def _write(self, data: bytes) -> None:
        """Write all of ``data`` to the (unbuffered) file; when that fails (a full disk), cut the file
        back to where it was, so that it still ends with a whole fragment."""
        start = self.file.tell()
        view = memoryview(data)
        try:
            while view:
                view = view[self.file.write(view) :]
        except OSError:
            try:
                self.file.truncate(start)
                self.file.seek(start)
            except OSError:
                pass
            raise

    def _moof(self, runs: list[tuple[int, int, list[Sample]]], data_offset: int) -> bytes:
        trafs = []
        for track_id, decode_time, samples in runs:
            entries = b"".join(
                struct.pack(">III", s.duration, len(s.data), _SYNC_SAMPLE if s.key else _NON_SYNC_SAMPLE)
                for s in samples
            )
            trafs.append(
                box(
                    b"traf",
                    full_box(b"tfhd", 0, TFHD_FLAGS, struct.pack(">I", track_id)),
                    full_box(b"tfdt", 1, 0, struct.pack(">Q", decode_time)),
                    full_box(b"trun", 0, TRUN_FLAGS, struct.pack(">Ii", len(samples), data_offset), entries),
                )
            )
            data_offset += sum(len(s.data) for s in samples)
        return box(b"moof", full_box(b"mfhd", 0, 0, struct.pack(">I", self.sequence + 1)), *trafs)

    def init_segment(self) -> bytes:
        t = self.tracks
        rate = t.audio_rate
        avc1 = box(
            b"avc1",
            bytes(6),
            struct.pack(">H", 1),  # data_reference_index
            bytes(16),
            struct.pack(">HHII", t.width, t.height, 0x480000, 0x480000),  # 72 dpi
            bytes(4),
            struct.pack(">H", 1),  # frame_count
            bytes(32),  # compressorname
            struct.pack(">Hh", 0x18, -1),
            _avcc_box(t.avc_extradata),
        )
        mp4a = box(
            b"mp4a",
            bytes(6),
            struct.pack(">H", 1),
            bytes(8),
            struct.pack(">HHHH", t.audio_channels, 16, 0, 0),
            struct.pack(">I", (rate if rate <= 0xFFFF else 0) << 16),
            _esds_box(t.aac_extradata, t.audio_bitrate),
        )
        # The edit list skips the AAC encoder's priming samples so audio starts with the first video
        # frame; a zero segment duration means "to the end" in a fragmented file.
        elst = full_box(b"elst", 0, 0, struct.pack(">IIihh", 1, 0, AAC_PRIMING, 1, 0))
        mvhd = full_box(
            b"mvhd",
            0,
            0,
            struct.pack(">IIIIIH", 0, 0, _MOVIE_TIMESCALE, 0, 0x10000, 0x100),  # duration 0, rate 1.0, volume 1.0
            bytes(10),
            _MATRIX,
            bytes(24),
            struct.pack(">I", _AUDIO_ID + 1),  # next_track_ID
        )
        trex = [full_box(b"trex", 0, 0, struct.pack(">5I", i, 1, 0, 0, 0)) for i in (_VIDEO_ID, _AUDIO_ID)]
        return box(b"ftyp", b"iso5", struct.pack(">I", 512), b"iso5iso6mp41") + box(
            b"moov",
            mvhd,
            self._trak(_VIDEO_ID, self.video_timescale, avc1, b""),
            self._trak(_AUDIO_ID, rate, mp4a, box(b"edts", elst)),
            box(b"mvex", *trex),
        )

    def _trak(self, track_id: int, timescale: int, entry: bytes, edts: bytes) -> bytes:
        is_video = track_id == _VIDEO_ID
        width, height = (self.tracks.width, self.tracks.height) if is_video else (0, 0)
        tkhd = full_box(
            b"tkhd",
            0,
            3,  # enabled, in movie
            struct.pack(">5I", 0, 0, track_id, 0, 0),  # times, track_ID, reserved, duration
            bytes(8),
            struct.pack(">hhhH", 0, 0, 0 if is_video else 0x100, 0),  # layer, group, volume
            _MATRIX,
            struct.pack(">II", width << 16, height << 16),
        )
        mdhd = full_box(b"mdhd", 0, 0, struct.pack(">4IHH", 0, 0, timescale, 0, 0x55C4, 0))  # language 'und'
        handler, name = (b"vide", b"VideoHandler\0") if is_video else (b"soun", b"SoundHandler\0")
        hdlr = full_box(b"hdlr", 0, 0, bytes(4), handler, bytes(12), name)
        header = full_box(b"vmhd", 0, 1, bytes(8)) if is_video else full_box(b"smhd", 0, 0, bytes(4))
        dinf = box(b"dinf", full_box(b"dref", 0, 0, struct.pack(">I", 1), full_box(b"url ", 0, 1)))
        empty = struct.pack(">I", 0)
        stbl = box(
            b"stbl",
            full_box(b"stsd", 0, 0, struct.pack(">I", 1), entry),
            full_box(b"stts", 0, 0, empty),
            full_box(b"stsc", 0, 0, empty),
            full_box(b"stsz", 0, 0, empty, empty),
            full_box(b"stco", 0, 0, empty),
        )
        minf = box(b"minf", header, dinf, stbl)
        return box(b"trak", tkhd, edts, box(b"mdia", mdhd, hdlr, minf))


def scan_fragments(file: BinaryIO, end: int) -> int:
    """Check that bytes [0, end) of ``file`` are an init segment followed by whole moof + mdat pairs;
    return the sequence number of the last fragment (0 if none). Reads box headers only.
    Raises ValueError naming what is wrong."""
    kinds, sequence = [], 0
    for kind, pos, _, box_end in boxes(file, 0, end):
        if kind == b"moof":
            sequence = _mfhd_sequence(file, pos, box_end - pos)
        kinds.append(kind)
    if kinds[:2] != [b"ftyp", b"moov"] or kinds[2:] != [b"moof", b"mdat"] * ((len(kinds) - 2) // 2):
        raise ValueError("the boxes are not an init segment followed by moof + mdat pairs")
    return sequence


def video_digests(file: BinaryIO, end: int) -> list[str]:
    """The SHA-256 of each fragment's video samples (in order, as ``Mp4Writer.video_sha256`` took them) in bytes
    [0, end) of a file this muxer wrote (``scan_fragments`` checked). Raises ValueError where a fragment is not
    as it writes them."""
    out = []
    for kind, pos, payload, box_end in boxes(file, 0, end):
        if kind != b"moof":
            continue
        runs = [_trun(file, child, child_end) for k, child, child_end in _children(file, payload, box_end, b"traf")]
        video = [run for track, run in runs if track == _VIDEO_ID]
        if len(video) != 1:
            raise ValueError(f"the fragment at byte {pos} has no video")
        offset, size = video[0]
        if pos + offset + size > end:
            raise ValueError(f"the fragment at byte {pos} points past its end")
        file.seek(pos + offset)
        out.append(hashlib.sha256(file.read(size)).hexdigest())
    return out


def _children(file: BinaryIO, start: int, end: int, kind: bytes) -> Iterator[tuple[bytes, int, int]]:
    """(kind, payload start, end) of the boxes of ``kind`` in bytes [start, end)."""
    return ((k, payload, box_end) for k, _, payload, box_end in boxes(file, start, end) if k == kind)


def _trun(file: BinaryIO, traf: int, traf_end: int) -> tuple[int, tuple[int, int]]:
    """(track ID, (data offset from the moof, bytes of its samples)) of a ``traf`` this muxer wrote."""
    tracks = [struct.unpack(">I", _read(file, at + 4, 4))[0] for _, at, _ in _children(file, traf, traf_end, b"tfhd")]
    runs = list(_children(file, traf, traf_end, b"trun"))
    if len(tracks) != 1 or len(runs) != 1:
        raise ValueError(f"the track fragment at byte {traf} is not one of ours")
    _, at, run_end = runs[0]
    flags, count, offset = struct.unpack(">IIi", _read(file, at, 12))
    if flags & 0xFFFFFF != TRUN_FLAGS or at + 12 + 12 * count > run_end:
        raise ValueError(f"the track run at byte {at} is not one of ours")
    entries = struct.unpack(f">{3 * count}I", _read(file, at + 12, 12 * count))
    return tracks[0], (offset, sum(entries[1::3]))


def _read(file: BinaryIO, at: int, n: int) -> bytes:
    file.seek(at)
    data = file.read(n)
    if len(data) != n:
        raise ValueError(f"the file ends inside a box at byte {at}")
    return data


def boxes(file: BinaryIO, start: int, end: int) -> Iterator[tuple[bytes, int, int, int]]:
    """(kind, start, payload start, end) of each box in bytes [start, end) of ``file``, read by their
    headers. Raises ValueError where a box does not end by ``end``."""
    pos = start
    while pos < end:
        file.seek(pos)
        header = file.read(16)
        if len(header) < 8:
            raise ValueError(f"the file ends inside a box header at byte {pos}")
        size, kind = struct.unpack(">I4s", header[:8])
        payload = pos + 8
        if size == 1 and len(header) == 16:
            size, payload = struct.unpack(">Q", header[8:])[0], pos + 16
        if size < payload - pos or pos + size > end:
            raise ValueError(f"the box at byte {pos} does not end at a fragment boundary")
        yield kind, pos, payload, pos + size
        pos += size


def _mfhd_sequence(file: BinaryIO, moof_pos: int, moof_size: int) -> int:
    file.seek(moof_pos + 8)
    head = file.read(16)  # mfhd: size, type, version+flags, sequence_number
    if moof_size < 24 or len(head) < 16 or head[4:8] != b"mfhd":
        raise ValueError(f"the fragment at byte {moof_pos} has no mfhd box")
    return struct.unpack(">I", head[12:16])[0]


def box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">I4s", 8 + len(body), kind) + body


def full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    return box(kind, struct.pack(">I", version << 24 | flags), *payload)


def _nal_units(annexb: bytes) -> list[bytes]:
    # Emulation prevention keeps 00 00 01 out of NAL payloads; a NAL never ends in a zero byte,
    # so trailing zeros belong to the next 4-byte start code (or are cabac_zero_words filler).
    return [nal.rstrip(b"\0") for nal in annexb.split(b"\0\0\1")[1:]]


def annexb_to_avcc(annexb: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(nal)) + nal for nal in _nal_units(annexb))


def _avcc_box(extradata: bytes) -> bytes:
    nals = _nal_units(extradata)
    sps = [n for n in nals if n[0] & 0x1F == 7]
    pps = [n for n in nals if n[0] & 0x1F == 8]
    body = bytes([1, sps[0][1], sps[0][2], sps[0][3], 0xFF, 0xE0 | len(sps)])
    body += b"".join(struct.pack(">H", len(n)) + n for n in sps)
    body += bytes([len(pps)]) + b"".join(struct.pack(">H", len(n)) + n for n in pps)
    if sps[0][1] not in (66, 77, 88):  # High profiles add chroma format (4:2:0) and bit depths (8)
        body += bytes([0xFC | 1, 0xF8, 0xF8, 0])
    return box(b"avcC", body)


def _descriptor(tag: int, payload: bytes) -> bytes:
    size = len(payload)
    length = bytes([0x80 | (size >> 21 & 0x7F), 0x80 | (size >> 14 & 0x7F), 0x80 | (size >> 7 & 0x7F), size & 0x7F])
    return bytes([tag]) + length + payload


def _esds_box(asc: bytes, bitrate: int) -> bytes:
    config = struct.pack(">BBBHII", 0x40, 0x15, 0, 0, bitrate, bitrate)  # AAC, audio stream, buffer, max, avg
    es = struct.pack(">HB", _AUDIO_ID, 0) + _descriptor(0x04, config + _descriptor(0x05, asc))
    return full_box(b"esds", 0, 0, _descriptor(0x03, es + _descriptor(0x06, b"\x02")))
