"""The render's fragmented MP4 rewritten as a regular MP4 with its index in front ("faststart"), in
memory that does not grow with the duration.

The file ``Fmp4Muxer`` writes is an init segment and moof + mdat pairs. Here each fragment's run of
one track becomes one chunk of that track, and the sample data is copied as it lies. A first pass over
the fragments' headers counts the index's entries, which fixes where everything goes; a second fills
the index in place while the data is copied. (FFmpeg's stream copy keeps some 70 bytes per sample in
memory until the end: 180 MB more for a ten-hour render.)
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, Optional, Union

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.files.write import open_own, place, remove, temp_beside
from avatar_render.io.codecs import write_error
from avatar_render.io.fmp4 import TFHD_FLAGS, TRUN_FLAGS, box, boxes, full_box

OFFSET_LIMIT = 0xFFFFFFFF  # the largest a 32-bit offset or box size holds (a test lowers it)
_COPY_BLOCK = 1 << 20
_TABLE_BUFFER = 1 << 16
_NON_SYNC = 0x00010000  # sample_is_non_sync_sample, in a trun's sample_flags
_FTYP = box(b"ftyp", b"isom", struct.pack(">I", 512), b"isomiso2avc1mp41")


def remux_faststart(src: Path, dst: Path) -> None:
    """Write the fragmented file ``src`` (as ``Fmp4Muxer`` writes it: whole fragments) as a regular MP4
    with its index in front to ``dst`` (``dst`` may be ``src``). Raises AvatarRenderError when it
    cannot be written.

    Fragmented MP4 makes FFmpeg-based players report the AAC priming as a negative start time (so
    the container duration runs long), and tools without fragment support cannot read it. The copy is
    written beside ``dst`` and moved over it, so a crash leaves ``src`` intact.
    """
    src, dst = Path(src), Path(dst)
    try:
        part = temp_beside(dst)
    except OSError as exc:
        raise AvatarRenderError(write_error(dst, exc)) from None
    try:
        with open(src, "rb") as source, open_own(part) as out:
            _defragment(source, out.fileno())
        place(part, dst, replace=True)
    except ValueError as exc:
        remove(part)
        raise AvatarRenderError(f"Could not finish {shown(dst)} from {shown(src)}: {exc}.") from None
    except OSError as exc:
        remove(part)
        raise AvatarRenderError(write_error(dst, exc)) from None
    except BaseException:
        remove(part)
        raise


@dataclass(frozen=True)
class _Run:
    """One track's samples in one fragment."""

    track: int
    decode_time: int
    at: int  # file offset of its first sample
    entries: array  # per sample: duration, size, flags ("I", native order)

    @property
    def size(self) -> int:
        return sum(self.entries[1::3])


@dataclass(frozen=True)
class _Fragment:
    data_at: int  # file offset of its mdat's payload
    data_size: int
    runs: tuple[_Run, ...]


@dataclass(frozen=True)
class _Trak:
    """What a track of the init segment keeps in the regular file."""

    track_id: int
    timescale: int
    tkhd: bytes  # box bodies (version and flags first) ...
    mdhd: bytes
    hdlr: bytes  # ... and whole boxes
    media_header: bytes  # vmhd or smhd
    dinf: bytes
    stsd: bytes
    media_time: int  # where its edit list starts playing (the AAC priming), in its timescale

    @property
    def is_aac(self) -> bool:
        return self.stsd[20:24] == b"mp4a"


class _Table:
    """A sample table box whose entries are put one by one: first only counted, then, once ``place``
    has fixed where it goes in the output, written there in the same order."""

    def __init__(self, kind: bytes, entry: str, lead: bytes = b""):
        self.kind, self.entry, self.lead = kind, struct.Struct(entry), lead
        self.count, self.expected = 0, None
        self._fd: Optional[int] = None
        self._at = 0
        self._buffer = bytearray()

    @property
    def size(self) -> int:
        return 16 + len(self.lead) + (self.count if self.expected is None else self.expected) * self.entry.size

    def place(self, fd: int, at: int) -> None:
        """Write the box header at ``at`` of ``fd``; the entries follow as they are put again."""
        _pwrite(fd, struct.pack(">I4sI", self.size, self.kind, 0) + self.lead + struct.pack(">I", self.count), at)
        self.expected, self.count = self.count, 0
        self._fd, self._at = fd, at + 16 + len(self.lead)

    def put(self, *values: int) -> None:
        self.count += 1
        if self._fd is not None:
            self._buffer += self.entry.pack(*values)
            self._flush(_TABLE_BUFFER)

    def put_all(self, values: array) -> None:
        """Put one-field entries of 32 bits each at once."""
        self.count += len(values)
        if self._fd is not None:
            values = array("I", values)
            if sys.byteorder == "little":
                values.byteswap()
            self._buffer += values.tobytes()
            self._flush(_TABLE_BUFFER)

    def close(self) -> None:
        if self._fd is not None:
            self._flush(0)
            if self.count != self.expected:
                raise ValueError("it changed while it was read")

    def _flush(self, at_least: int) -> None:
        if len(self._buffer) >= max(at_least, 1):
            _pwrite(self._fd, self._buffer, self._at)
            self._at += len(self._buffer)
            self._buffer.clear()


class _TrackIndex:
    """One track's sample tables, built run by run (one chunk per run)."""

    def __init__(self, trak: _Trak, tables: Optional[dict[bytes, _Table]] = None):
        self.trak = trak
        self.tables = tables or {
            b"stts": _Table(b"stts", ">II"),
            b"stss": _Table(b"stss", ">I"),
            b"stsc": _Table(b"stsc", ">III"),
            b"stsz": _Table(b"stsz", ">I", lead=bytes(4)),  # sample_size 0: each has its own
            b"stco": _Table(b"stco", ">I"),
        }
        self.samples = self.chunks = self.duration = 0
        self._run_duration, self._run_length = None, 0  # stts: the run of equal durations going on
        self._per_chunk = None  # stsc: the samples per chunk of its last entry

    def again(self) -> _TrackIndex:
        """The same index, to be built once more into the tables' places."""
        return _TrackIndex(self.trak, self.tables)

    def add(self, run: _Run, chunk_at: int) -> None:
        if run.decode_time != self.duration:
            raise ValueError(f"track {self.trak.track_id} has a gap at decode time {run.decode_time}")
        t = self.tables
        durations, sizes, flags = run.entries[0::3], run.entries[1::3], run.entries[2::3]
        self.chunks += 1
        if len(sizes) != self._per_chunk:
            t[b"stsc"].put(self.chunks, len(sizes), 1)
            self._per_chunk = len(sizes)
        for duration in durations:
            if duration != self._run_duration:
                if self._run_length:
                    t[b"stts"].put(self._run_length, self._run_duration)
                self._run_duration, self._run_length = duration, 0
            self._run_length += 1
        for i, f in enumerate(flags):
            if not f & _NON_SYNC:
                t[b"stss"].put(self.samples + i + 1)
        t[b"stsz"].put_all(sizes)
        t[b"stco"].put(chunk_at)
        self.samples += len(sizes)
        self.duration += sum(durations)

    def finish(self) -> None:
        if self._run_length:
            self.tables[b"stts"].put(self._run_length, self._run_duration)
            self._run_length = 0
        for table in self.tables.values():
            table.close()

    @property
    def all_sync(self) -> bool:
        return self.tables[b"stss"].count == self.samples

    def trak_box(self, movie_timescale: int) -> list:
        """The trak box as parts (bytes, and the tables to be filled in)."""
        trak, t = self.trak, self.tables
        edit = max(0, _movie_time(self.duration, trak, movie_timescale) - _movie_time(trak.media_time, trak,
                                                                                         movie_timescale))
        edts = []
        if self.samples:
            version = 0 if edit <= 0xFFFFFFFF else 1
            entry = struct.pack(">Iih" if version == 0 else ">Qqh", edit, trak.media_time, 1) + bytes(2)
            edts = [box(b"edts", full_box(b"elst", version, 0, struct.pack(">I", 1), entry))]
        tables = [t[b"stts"]] + ([] if self.all_sync else [t[b"stss"]]) + [t[b"stsc"], t[b"stsz"], t[b"stco"]]
        if trak.is_aac:  # each AAC frame needs the one before it decoded (FFmpeg writes the same)
            tables += [full_box(b"sgpd", 1, 0, b"roll", struct.pack(">IIh", 2, 1, -1)),
                       full_box(b"sbgp", 0, 0, b"roll", struct.pack(">III", 1, self.samples, 1))]
        stbl = _container(b"stbl", trak.stsd, *tables)
        minf = _container(b"minf", trak.media_header, trak.dinf, stbl)
        mdia = _container(b"mdia", _with_duration(b"mdhd", trak.mdhd, self.duration), trak.hdlr, minf)
        return _container(b"trak", _with_duration(b"tkhd", trak.tkhd, self.played(movie_timescale)), *edts, mdia)

    def played(self, movie_timescale: int) -> int:
        return _movie_time(max(0, self.duration - self.trak.media_time), self.trak, movie_timescale)


Part = Union[bytes, _Table]


def _defragment(source: BinaryIO, out: int) -> None:
    end = os.fstat(source.fileno()).st_size
    mvhd, traks, first = _read_init(source, end)
    movie_timescale = struct.unpack(">I", mvhd[20:24] if mvhd[0] == 1 else mvhd[12:16])[0]
    indexes = {t.track_id: _TrackIndex(t) for t in traks}
    payload = 0
    for fragment in _fragments(source, first, end):
        for run in fragment.runs:
            _index_of(indexes, run).add(run, 0)
        payload += fragment.data_size
    for index in indexes.values():
        index.finish()

    parts = _moov(mvhd, indexes.values(), movie_timescale)
    mdat_header = 8 if 8 + payload <= OFFSET_LIMIT else 16
    if len(_FTYP) + _size(parts) + mdat_header + payload > OFFSET_LIMIT:
        for index in indexes.values():
            index.tables[b"stco"].kind, index.tables[b"stco"].entry = b"co64", struct.Struct(">Q")
        parts = _moov(mvhd, indexes.values(), movie_timescale)
    at = len(_FTYP)
    _pwrite(out, _FTYP, 0)
    for part in parts:
        if isinstance(part, bytes):
            _pwrite(out, part, at)
        else:
            part.place(out, at)
        at += _size(part)
    if mdat_header == 8:
        _pwrite(out, struct.pack(">I4s", 8 + payload, b"mdat"), at)
    else:
        _pwrite(out, struct.pack(">I4sQ", 1, b"mdat", 16 + payload), at)
    at += mdat_header

    indexes = {track: index.again() for track, index in indexes.items()}
    for fragment in _fragments(source, first, end):
        for run in fragment.runs:
            _index_of(indexes, run).add(run, at + run.at - fragment.data_at)
        _copy(source.fileno(), fragment.data_at, fragment.data_size, out, at)
        at += fragment.data_size
    for index in indexes.values():
        index.finish()


def _index_of(indexes: dict[int, _TrackIndex], run: _Run) -> _TrackIndex:
    if run.track not in indexes:
        raise ValueError(f"it has samples of a track {run.track} its header does not describe")
    return indexes[run.track]


def _moov(mvhd: bytes, indexes, movie_timescale: int) -> list[Part]:
    traks = [index.trak_box(movie_timescale) for index in indexes]
    played = max((index.played(movie_timescale) for index in indexes), default=0)
    return _container(b"moov", _with_duration(b"mvhd", mvhd, played), *traks)


def _movie_time(duration: int, trak: _Trak, movie_timescale: int) -> int:
    """``duration`` in the movie's timescale, rounded up. (The edit list's duration is the rounded
    whole less the rounded start, the track's the rounded difference: as FFmpeg's muxer writes them,
    so players show the durations they did when FFmpeg wrote this file.)"""
    return -(-duration * movie_timescale // trak.timescale)


def _size(part: Union[Part, list[Part]]) -> int:
    if isinstance(part, list):
        return sum(_size(p) for p in part)
    return len(part) if isinstance(part, bytes) else part.size


def _container(kind: bytes, *children: Union[Part, list[Part]]) -> list[Part]:
    parts = [p for child in children for p in (child if isinstance(child, list) else [child])]
    size = 8 + _size(parts)
    if size > 0xFFFFFFFF:
        raise ValueError(f"its {kind.decode()} box would be over 4 GB")
    return [struct.pack(">I4s", size, kind), *parts]


def _with_duration(kind: bytes, body: bytes, duration: int) -> bytes:
    """The mvhd, tkhd or mdhd box of ``body`` (either version) with ``duration``; version 1 only where
    the duration needs it."""
    wide = body[0] == 1
    times = struct.unpack(">QQ" if wide else ">II", body[4 : 20 if wide else 12])
    middle = 8 if kind == b"tkhd" else 4  # track_ID and a reserved field, or the timescale
    start = 20 if wide else 12
    fields, rest = body[start : start + middle], body[start + middle + (8 if wide else 4) :]
    flags = int.from_bytes(body[1:4], "big")
    if duration <= 0xFFFFFFFF and max(times) <= 0xFFFFFFFF:
        return full_box(kind, 0, flags, struct.pack(">II", *times), fields, struct.pack(">I", duration), rest)
    return full_box(kind, 1, flags, struct.pack(">QQ", *times), fields, struct.pack(">Q", duration), rest)


def _read_init(source: BinaryIO, end: int) -> tuple[bytes, list[_Trak], int]:
    """The init segment's mvhd body, its tracks, and where the fragments begin."""
    found = boxes(source, 0, end)
    kinds = [next(found, None), next(found, None)]
    if [k and k[0] for k in kinds] != [b"ftyp", b"moov"]:
        raise ValueError("it does not begin with an init segment")
    _, _, moov_at, moov_end = kinds[1]
    source.seek(moov_at)
    moov = _pairs(source.read(moov_end - moov_at))
    mvhd = dict(moov).get(b"mvhd")
    if b"mvex" not in dict(moov) or mvhd is None:
        raise ValueError("it is not a fragmented MP4")
    return mvhd, [_trak(body) for kind, body in moov if kind == b"trak"], moov_end


def _trak(body: bytes) -> _Trak:
    trak = _children(body)
    mdia = _children(trak.get(b"mdia", b""))
    minf = _children(mdia.get(b"minf", b""))
    stbl = _children(minf.get(b"stbl", b""))
    media_header = next((k for k in (b"vmhd", b"smhd") if k in minf), None)
    if not {b"tkhd"} <= trak.keys() or not {b"mdhd", b"hdlr"} <= mdia.keys() or b"stsd" not in stbl \
            or media_header is None or b"dinf" not in minf:
        raise ValueError("its header does not fully describe a track")
    tkhd, mdhd = trak[b"tkhd"], mdia[b"mdhd"]
    track_id = struct.unpack(">I", tkhd[20:24] if tkhd[0] == 1 else tkhd[12:16])[0]
    timescale = struct.unpack(">I", mdhd[20:24] if mdhd[0] == 1 else mdhd[12:16])[0]
    media_time = 0
    elst = _children(trak.get(b"edts", b"")).get(b"elst")
    if elst is not None and struct.unpack(">I", elst[4:8])[0] >= 1:
        media_time = struct.unpack(">q", elst[16:24])[0] if elst[0] == 1 else struct.unpack(">i", elst[12:16])[0]
    return _Trak(track_id=track_id, timescale=timescale, tkhd=tkhd, mdhd=mdhd,
                 hdlr=box(b"hdlr", mdia[b"hdlr"]), media_header=box(media_header, minf[media_header]),
                 dinf=box(b"dinf", minf[b"dinf"]), stsd=box(b"stsd", stbl[b"stsd"]), media_time=max(0, media_time))


def _fragments(source: BinaryIO, start: int, end: int) -> Iterator[_Fragment]:
    found = boxes(source, start, end)
    for moof in found:
        mdat = next(found, None)
        if moof[0] != b"moof" or mdat is None or mdat[0] != b"mdat":
            raise ValueError("it is not whole moof + mdat fragments after its init segment")
        (_, base, moof_at, moof_end), (_, _, data_at, data_end) = moof, mdat
        source.seek(moof_at)
        runs = tuple(_run(body, base) for kind, body in _pairs(source.read(moof_end - moof_at)) if kind == b"traf")
        for run in runs:
            if run.at < data_at or run.at + run.size > data_end:
                raise ValueError(f"the fragment at byte {base} has samples outside it")
        yield _Fragment(data_at=data_at, data_size=data_end - data_at, runs=runs)


def _run(traf: bytes, moof_at: int) -> _Run:
    parts = _children(traf)
    tfhd, tfdt, trun = parts.get(b"tfhd"), parts.get(b"tfdt"), parts.get(b"trun")
    if tfhd is None or tfdt is None or trun is None or len(tfhd) < 8 or len(trun) < 12:
        raise ValueError(f"the fragment at byte {moof_at} lacks its track's timing")
    if int.from_bytes(tfhd[1:4], "big") != TFHD_FLAGS or int.from_bytes(trun[1:4], "big") != TRUN_FLAGS:
        raise ValueError(f"the fragment at byte {moof_at} is in a form this program does not write")
    decode_time = struct.unpack(">Q", tfdt[4:12])[0] if tfdt[0] == 1 else struct.unpack(">I", tfdt[4:8])[0]
    count, offset = struct.unpack(">Ii", trun[4:12])
    entries = array("I", trun[12 : 12 + 12 * count])
    if len(entries) != 3 * count:
        raise ValueError(f"the fragment at byte {moof_at} ends inside its sample list")
    if sys.byteorder == "little":
        entries.byteswap()
    return _Run(track=struct.unpack(">I", tfhd[4:8])[0], decode_time=decode_time, at=moof_at + offset,
                entries=entries)


def _pairs(data: bytes) -> list[tuple[bytes, bytes]]:
    """(kind, body) of each box in ``data``; the 32-bit sizes of an init segment or a moof."""
    pairs, pos = [], 0
    while pos + 8 <= len(data):
        size, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if size < 8 or pos + size > len(data):
            raise ValueError("a box does not fit in its parent")
        pairs.append((kind, data[pos + 8 : pos + size]))
        pos += size
    return pairs


def _children(data: bytes) -> dict[bytes, bytes]:
    return dict(_pairs(data))


def _copy(source: int, start: int, size: int, out: int, at: int) -> None:
    done = 0
    while done < size:
        block = os.pread(source, min(_COPY_BLOCK, size - done), start + done)
        if not block:
            raise ValueError("it ended while it was read")
        _pwrite(out, block, at + done)
        done += len(block)


def _pwrite(fd: int, data: Union[bytes, bytearray], at: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, at)
        view, at = view[written:], at + written
