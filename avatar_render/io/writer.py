"""Streaming MP4 writer: H.264 + AAC in a fragmented MP4, encoded on its own thread.

Each chunk put into the writer becomes one MP4 fragment (``moof`` + ``mdat``) that is handed to
the operating system as soon as the chunk is encoded, so the file plays while it grows and stays
readable up to its last complete fragment if the process dies. ``close()`` then turns it into a
regular MP4 with its index in front (a quick stream copy), the most widely playable form.

The fragments are written here rather than by FFmpeg's ``mp4`` muxer because that muxer only
emits a fragment when the *next* one starts (PyAV has no call to flush it), which would keep every
chunk off the disk until the following chunk arrived.

Latency on disk: every video frame of a chunk is on disk once the chunk is processed (x264 runs
with zero latency; keyframes fall on chunk starts, about every ten seconds). Audio trails by less than three
AAC frames (< 3072 samples): the samples that do not fill a whole 1024-sample AAC frame wait for
the next chunk, and the AAC encoder holds two frames back (its priming frame plus one of
lookahead). ``close()`` writes all of it.
"""

from __future__ import annotations

import errno
import math
import os
import queue
import struct
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Optional

import av
import numpy as np

from avatar_render.errors import AvatarRenderError

PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow", "placebo")
AAC_RATES = (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200, 96000)

_AAC_FRAME = 1024  # samples per AAC frame
_AAC_PRIMING = 1024  # silent samples FFmpeg's native aac encoder puts before the first input sample
_MOVIE_TIMESCALE = 1000
_KEYINT_SECONDS = 10  # longest stretch without a keyframe when chunks are long
_VIDEO_ID, _AUDIO_ID = 1, 2
_SYNC_SAMPLE, _NON_SYNC_SAMPLE = 0x02000000, 0x01010000  # trun sample_flags
_MATRIX = struct.pack(">9I", 0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000)


@dataclass(frozen=True)
class WriterSpec:
    path: Path
    width: int
    height: int
    fps: Fraction
    crf: int = 20
    preset: str = "veryfast"
    audio_rate: int = 48000
    audio_channels: int = 2
    audio_bitrate: int = 128_000
    queue_chunks: int = 4  # bounded queue length; put() blocks when full

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if not isinstance(self.fps, Fraction):
            object.__setattr__(self, "fps", Fraction(self.fps).limit_denominator(1001))
        if self.width <= 0 or self.height <= 0 or self.width % 2 or self.height % 2:
            raise AvatarRenderError(f"Video size {self.width}x{self.height} must be positive and even.")
        if not 0 < self.fps <= 1000 or self.fps.numerator >= 2**31:
            raise AvatarRenderError(f"Frame rate {self.fps} must be a positive fraction up to 1000 fps.")
        if not 0 <= self.crf <= 51:
            raise AvatarRenderError(f"CRF {self.crf} must be between 0 and 51.")
        if self.preset not in PRESETS:
            raise AvatarRenderError(f"Preset '{self.preset}' is not one of {', '.join(PRESETS)}.")
        if self.audio_rate not in AAC_RATES:
            raise AvatarRenderError(f"Audio rate {self.audio_rate} Hz is not an AAC rate; use 16000, 44100 or 48000.")
        if self.audio_channels not in (1, 2):
            raise AvatarRenderError(f"Audio must have 1 or 2 channels, not {self.audio_channels}.")
        if self.audio_bitrate <= 0 or self.queue_chunks < 1:
            raise AvatarRenderError("Audio bitrate and writer queue length must be positive.")


@dataclass(frozen=True)
class WriterStats:
    frames: int
    audio_samples: int
    bytes: int
    first_frame_on_disk_s: Optional[float]  # time.perf_counter() when the first frame's fragment was flushed to disk
    encode_seconds: float  # time the writer thread spent encoding+muxing


@dataclass(frozen=True)
class _Chunk:
    frames: np.ndarray  # (T, H, W, 3) uint8 RGB
    audio: np.ndarray  # (C, n) float32


@dataclass(frozen=True)
class _Sample:
    data: bytes
    duration: int  # in the track's timescale
    key: bool


class _Aborted(Exception):
    pass


class Mp4Writer:
    """Encodes chunks of frames + audio into ``spec.path`` on a background thread.

    ``put`` copies its arrays, so the caller may reuse them at once. Usable as a context manager:
    the file is closed on normal exit and aborted on an exception.
    """

    def __init__(self, spec: WriterSpec):
        self.spec = spec
        self._queue: queue.Queue[Optional[_Chunk]] = queue.Queue(maxsize=spec.queue_chunks)
        self._abort = threading.Event()
        self._error: Optional[AvatarRenderError] = None
        self._stats: Optional[WriterStats] = None
        self._frames_put = 0
        self._samples_put = 0
        self._frames_encoded = 0
        self._key_every = math.ceil(_KEYINT_SECONDS * spec.fps)  # frames between forced keyframes
        self._last_key: int | None = None  # pts of the last forced keyframe
        self._frames_written = 0
        self._first_frame_on_disk: Optional[float] = None
        self._encode_seconds = 0.0

        try:
            self._file: BinaryIO = open(spec.path, "wb")
        except OSError as exc:
            raise AvatarRenderError(_create_error(spec.path, exc)) from None
        try:
            self._video = _open_video_encoder(spec)
            self._audio = _open_audio_encoder(spec)
            self._fifo = av.AudioFifo()
            self._audio_pts = 0  # samples sent to the AAC encoder
            self._muxer = _Fmp4Muxer(self._file, spec, self._video.extradata, self._audio.extradata)
            self._muxer.write_init()
        except BaseException as exc:
            self._file.close()
            spec.path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise AvatarRenderError(_write_error(spec.path, exc)) from None
            if isinstance(exc, av.error.FFmpegError):
                raise AvatarRenderError(f"Could not start the H.264/AAC encoders: {exc}.") from None
            raise

        self._thread = threading.Thread(target=self._run, name="mp4-writer", daemon=True)
        self._thread.start()

    @property
    def frames_written(self) -> int:
        """Frames in complete fragments on disk so far."""
        return self._frames_written

    def put(self, frames: np.ndarray, audio: np.ndarray) -> None:
        """Queue frames (T, H, W, 3) uint8 RGB and their audio (C, n) float; blocks while the queue is full."""
        spec = self.spec
        if frames.ndim != 4 or frames.shape[1:] != (spec.height, spec.width, 3) or frames.dtype != np.uint8:
            raise ValueError(f"frames must be uint8 (T, {spec.height}, {spec.width}, 3), got {frames.dtype} {frames.shape}")
        if audio.ndim != 2 or audio.shape[0] != spec.audio_channels:
            raise ValueError(f"audio must be ({spec.audio_channels}, n), got {audio.shape}")
        chunk = _Chunk(np.array(frames, order="C"), np.array(audio, dtype=np.float32, order="C"))
        self._enqueue(chunk)
        self._frames_put += len(chunk.frames)
        self._samples_put += chunk.audio.shape[1]

    def close(self) -> WriterStats:
        """Write everything queued, finish the file and return statistics."""
        if self._stats is None:
            try:
                self._enqueue(None)
            except AvatarRenderError:
                self._thread.join(timeout=10.0)
                raise
            self._thread.join()
            if self._error is not None:
                raise self._error
            self._stats = WriterStats(
                frames=self._frames_put,
                audio_samples=self._samples_put,
                bytes=os.path.getsize(self.spec.path),
                first_frame_on_disk_s=self._first_frame_on_disk,
                encode_seconds=self._encode_seconds,
            )
        return self._stats

    def abort(self) -> None:
        """Stop without writing what is queued; the file keeps its complete fragments. Never raises."""
        self._abort.set()
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout=10.0)

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _enqueue(self, item: Optional[_Chunk]) -> None:
        while True:
            if self._error is not None:
                raise self._error
            if self._abort.is_set() or self._stats is not None or not self._thread.is_alive():
                raise AvatarRenderError(f"The writer for '{self.spec.path}' is already closed.")
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    # Everything below runs on the writer thread.

    def _run(self) -> None:
        try:
            try:
                while True:
                    chunk = self._queue.get()
                    if chunk is None or self._abort.is_set():
                        break
                    start = time.perf_counter()
                    self._write_chunk(chunk)
                    self._encode_seconds += time.perf_counter() - start
                start = time.perf_counter()
                if not self._abort.is_set():
                    self._write_fragment(self._video_samples(self._video.encode(None)), self._encode_audio(final=True))
            finally:
                self._file.close()
            if not self._abort.is_set() and self._muxer.sequence:  # something to copy
                _remux_faststart(self.spec.path)
                self._encode_seconds += time.perf_counter() - start
        except _Aborted:
            pass
        except OSError as exc:
            self._error = AvatarRenderError(_write_error(self.spec.path, exc))
        except Exception as exc:  # an encoder failure; surfaced to the caller as one sentence
            self._error = AvatarRenderError(f"Could not encode '{self.spec.path}': {exc}.")

    def _write_chunk(self, chunk: _Chunk) -> None:
        video: list[_Sample] = []
        for i, rgb in enumerate(chunk.frames):
            if self._abort.is_set():
                raise _Aborted
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame = frame.reformat(format="yuv420p", dst_colorspace="ITU709", dst_color_range="MPEG")
            frame.pts = self._frames_encoded
            self._frames_encoded += 1
            if i == 0 and (self._last_key is None or frame.pts - self._last_key >= self._key_every):
                # An IDR at a chunk start, at most every _KEYINT_SECONDS: a keyframe per chunk would
                # show as a visible quality pulse at every seam.
                frame.pict_type = av.video.frame.PictureType.I  # with forced-idr=1: an IDR frame
                self._last_key = frame.pts
            video += self._video_samples(self._video.encode(frame))
        if chunk.audio.shape[1]:
            planar = av.AudioFrame.from_ndarray(chunk.audio, format="fltp", layout=self._audio.layout.name)
            planar.sample_rate = self.spec.audio_rate
            self._fifo.write(planar)
        audio = self._encode_audio(final=False)
        self._write_fragment(video, audio)

    def _video_samples(self, packets: list[av.Packet]) -> list[_Sample]:
        duration = self._muxer.frame_duration
        return [_Sample(_annexb_to_avcc(bytes(p)), duration, p.is_keyframe) for p in packets]

    def _encode_audio(self, final: bool) -> list[_Sample]:
        packets: list[av.Packet] = []
        while self._fifo.samples >= _AAC_FRAME or (final and self._fifo.samples):
            frame = self._fifo.read(min(_AAC_FRAME, self._fifo.samples))
            frame.pts = self._audio_pts
            frame.time_base = Fraction(1, self.spec.audio_rate)
            self._audio_pts += frame.samples
            packets += self._audio.encode(frame)
        if final:
            packets += self._audio.encode(None)
        # Packet durations count samples; the last packet's covers only the real samples it holds.
        return [_Sample(bytes(p), int(p.duration or _AAC_FRAME), True) for p in packets]

    def _write_fragment(self, video: list[_Sample], audio: list[_Sample]) -> None:
        if not video and not audio:
            return
        self._muxer.write_fragment(video, audio)
        self._frames_written += len(video)
        if video and self._first_frame_on_disk is None:
            self._first_frame_on_disk = time.perf_counter()


def _remux_faststart(path: Path) -> None:
    """Replace the fragmented file by a regular MP4 with its index in front (a stream copy).

    Fragmented MP4 makes FFmpeg-based players report the AAC priming as a negative start time
    (so the container duration runs long), and tools without fragment support cannot read it. The
    copy is written beside the file and moved over it, so a crash leaves the fragmented file intact.
    """
    part = path.with_name(path.stem + ".remux" + path.suffix)
    try:
        with av.open(str(path)) as src, av.open(str(part), "w", format="mp4", options={"movflags": "faststart"}) as dst:
            streams = {s.index: dst.add_stream_from_template(s) for s in src.streams}
            for packet in src.demux():
                if packet.dts is None:  # the demuxer's end-of-stream marker
                    continue
                packet.stream = streams[packet.stream.index]
                dst.mux(packet)
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def _open_video_encoder(spec: WriterSpec) -> av.VideoCodecContext:
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height = spec.width, spec.height
    codec.pix_fmt = "yuv420p"
    codec.time_base = 1 / spec.fps
    codec.framerate = spec.fps
    keyint = 2 * math.ceil(_KEYINT_SECONDS * spec.fps)  # a backstop for chunks longer than that
    # zerolatency: no B-frames, no lookahead, slice threads instead of frame threads, so each
    # frame's packet comes out of encode() at once. Keyframes are forced at chunk starts.
    params = f"keyint={keyint}:scenecut=0:forced-idr=1:colorprim=bt709:transfer=bt709:colormatrix=bt709"
    codec.options = {
        "preset": spec.preset,
        "tune": "zerolatency",
        "crf": str(spec.crf),
        "x264-params": params,
        "flags": "+global_header",  # SPS/PPS go to extradata (for avcC), not into the stream
    }
    if spec.crf > 0:  # lossless needs the High 4:4:4 profile, which x264 picks itself
        codec.options["profile"] = "high"
    codec.open()
    return codec


def _open_audio_encoder(spec: WriterSpec) -> av.AudioCodecContext:
    codec = av.CodecContext.create("aac", "w")
    codec.sample_rate = spec.audio_rate
    codec.layout = "mono" if spec.audio_channels == 1 else "stereo"
    codec.format = "fltp"
    codec.bit_rate = spec.audio_bitrate
    codec.time_base = Fraction(1, spec.audio_rate)
    codec.options = {"flags": "+global_header"}
    codec.open()
    return codec


def _create_error(path: Path, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError) and not Path(path).parent.is_dir():
        return f"Could not create '{path}': the folder '{Path(path).parent}' does not exist."
    if isinstance(exc, PermissionError):
        return f"Could not create '{path}': permission denied."
    return f"Could not create '{path}': {_reason(exc)}."


def _write_error(path: Path, exc: OSError) -> str:
    return f"Could not write '{path}': {_reason(exc)}."


def _reason(exc: OSError) -> str:
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno == errno.EFBIG:
        text = "the file is larger than this system allows"
    return text[:1].lower() + text[1:]


# Fragmented MP4 (ISO/IEC 14496-12 boxes, H.264 per 14496-15, AAC per 14496-14).


def _box(kind: bytes, *payload: bytes) -> bytes:
    body = b"".join(payload)
    return struct.pack(">I4s", 8 + len(body), kind) + body


def _full_box(kind: bytes, version: int, flags: int, *payload: bytes) -> bytes:
    return _box(kind, struct.pack(">I", version << 24 | flags), *payload)


def _nal_units(annexb: bytes) -> list[bytes]:
    # Emulation prevention keeps 00 00 01 out of NAL payloads; a NAL never ends in a zero byte,
    # so trailing zeros belong to the next 4-byte start code (or are cabac_zero_words filler).
    return [nal.rstrip(b"\0") for nal in annexb.split(b"\0\0\1")[1:]]


def _annexb_to_avcc(annexb: bytes) -> bytes:
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
    return _box(b"avcC", body)


def _descriptor(tag: int, payload: bytes) -> bytes:
    size = len(payload)
    length = bytes([0x80 | (size >> 21 & 0x7F), 0x80 | (size >> 14 & 0x7F), 0x80 | (size >> 7 & 0x7F), size & 0x7F])
    return bytes([tag]) + length + payload


def _esds_box(asc: bytes, bitrate: int) -> bytes:
    config = struct.pack(">BBBHII", 0x40, 0x15, 0, 0, bitrate, bitrate)  # AAC, audio stream, buffer, max, avg
    es = struct.pack(">HB", _AUDIO_ID, 0) + _descriptor(0x04, config + _descriptor(0x05, asc))
    return _full_box(b"esds", 0, 0, _descriptor(0x03, es + _descriptor(0x06, b"\x02")))


class _Fmp4Muxer:
    """Writes the init segment (ftyp + moov without samples), then one moof + mdat per call,
    each flushed to the operating system at once."""

    def __init__(self, file: BinaryIO, spec: WriterSpec, avc_extradata: bytes, aac_extradata: bytes):
        self.file = file
        self.spec = spec
        self.avc_extradata = avc_extradata
        self.aac_extradata = aac_extradata
        # Like FFmpeg, scale tiny timescales (25) up so players need no rounding: 25 fps -> 12800.
        scale = 1
        while spec.fps.numerator * scale < 10000:
            scale *= 2
        self.video_timescale = spec.fps.numerator * scale
        self.frame_duration = spec.fps.denominator * scale
        self.sequence = 0
        self.video_time = 0  # decode time of the next video sample, video timescale
        self.audio_time = 0  # decode time of the next audio sample, audio timescale (includes priming)

    def write_init(self) -> None:
        self._write(self._init_segment())

    def write_fragment(self, video: list[_Sample], audio: list[_Sample]) -> None:
        self.sequence += 1
        runs = [(_VIDEO_ID, self.video_time, video), (_AUDIO_ID, self.audio_time, audio)]
        runs = [run for run in runs if run[2]]
        moof = self._moof(runs, 0)
        moof = self._moof(runs, len(moof) + 8)  # data offsets need the moof's own size
        mdat = b"".join(s.data for _, _, samples in runs for s in samples)
        self._write(moof + struct.pack(">I4s", 8 + len(mdat), b"mdat") + mdat)
        self.video_time += sum(s.duration for s in video)
        self.audio_time += sum(s.duration for s in audio)

    def _write(self, data: bytes) -> None:
        self.file.write(data)
        self.file.flush()

    def _moof(self, runs: list[tuple[int, int, list[_Sample]]], data_offset: int) -> bytes:
        trafs = []
        for track_id, decode_time, samples in runs:
            entries = b"".join(
                struct.pack(">III", s.duration, len(s.data), _SYNC_SAMPLE if s.key else _NON_SYNC_SAMPLE)
                for s in samples
            )
            trafs.append(
                _box(
                    b"traf",
                    _full_box(b"tfhd", 0, 0x020000, struct.pack(">I", track_id)),  # default-base-is-moof
                    _full_box(b"tfdt", 1, 0, struct.pack(">Q", decode_time)),
                    # flags: data offset, and per sample: duration, size, flags
                    _full_box(b"trun", 0, 0x000701, struct.pack(">Ii", len(samples), data_offset), entries),
                )
            )
            data_offset += sum(len(s.data) for s in samples)
        return _box(b"moof", _full_box(b"mfhd", 0, 0, struct.pack(">I", self.sequence)), *trafs)

    def _init_segment(self) -> bytes:
        spec = self.spec
        rate = spec.audio_rate
        avc1 = _box(
            b"avc1",
            bytes(6),
            struct.pack(">H", 1),  # data_reference_index
            bytes(16),
            struct.pack(">HHII", spec.width, spec.height, 0x480000, 0x480000),  # 72 dpi
            bytes(4),
            struct.pack(">H", 1),  # frame_count
            bytes(32),  # compressorname
            struct.pack(">Hh", 0x18, -1),
            _avcc_box(self.avc_extradata),
        )
        mp4a = _box(
            b"mp4a",
            bytes(6),
            struct.pack(">H", 1),
            bytes(8),
            struct.pack(">HHHH", spec.audio_channels, 16, 0, 0),
            struct.pack(">I", (rate if rate <= 0xFFFF else 0) << 16),
            _esds_box(self.aac_extradata, spec.audio_bitrate),
        )
        # The edit list skips the AAC encoder's priming samples so audio starts with the first video
        # frame; a zero segment duration means "to the end" in a fragmented file.
        elst = _full_box(b"elst", 0, 0, struct.pack(">IIihh", 1, 0, _AAC_PRIMING, 1, 0))
        mvhd = _full_box(
            b"mvhd",
            0,
            0,
            struct.pack(">IIIIIH", 0, 0, _MOVIE_TIMESCALE, 0, 0x10000, 0x100),  # duration 0, rate 1.0, volume 1.0
            bytes(10),
            _MATRIX,
            bytes(24),
            struct.pack(">I", _AUDIO_ID + 1),  # next_track_ID
        )
        trex = [_full_box(b"trex", 0, 0, struct.pack(">5I", i, 1, 0, 0, 0)) for i in (_VIDEO_ID, _AUDIO_ID)]
        return _box(b"ftyp", b"iso5", struct.pack(">I", 512), b"iso5iso6mp41") + _box(
            b"moov",
            mvhd,
            self._trak(_VIDEO_ID, self.video_timescale, avc1, b""),
            self._trak(_AUDIO_ID, rate, mp4a, _box(b"edts", elst)),
            _box(b"mvex", *trex),
        )

    def _trak(self, track_id: int, timescale: int, entry: bytes, edts: bytes) -> bytes:
        is_video = track_id == _VIDEO_ID
        width, height = (self.spec.width, self.spec.height) if is_video else (0, 0)
        tkhd = _full_box(
            b"tkhd",
            0,
            3,  # enabled, in movie
            struct.pack(">5I", 0, 0, track_id, 0, 0),  # times, track_ID, reserved, duration
            bytes(8),
            struct.pack(">hhhH", 0, 0, 0 if is_video else 0x100, 0),  # layer, group, volume
            _MATRIX,
            struct.pack(">II", width << 16, height << 16),
        )
        mdhd = _full_box(b"mdhd", 0, 0, struct.pack(">4IHH", 0, 0, timescale, 0, 0x55C4, 0))  # language 'und'
        handler, name = (b"vide", b"VideoHandler\0") if is_video else (b"soun", b"SoundHandler\0")
        hdlr = _full_box(b"hdlr", 0, 0, bytes(4), handler, bytes(12), name)
        header = _full_box(b"vmhd", 0, 1, bytes(8)) if is_video else _full_box(b"smhd", 0, 0, bytes(4))
        dinf = _box(b"dinf", _full_box(b"dref", 0, 0, struct.pack(">I", 1), _full_box(b"url ", 0, 1)))
        empty = struct.pack(">I", 0)
        stbl = _box(
            b"stbl",
            _full_box(b"stsd", 0, 0, struct.pack(">I", 1), entry),
            _full_box(b"stts", 0, 0, empty),
            _full_box(b"stsc", 0, 0, empty),
            _full_box(b"stsz", 0, 0, empty, empty),
            _full_box(b"stco", 0, 0, empty),
        )
        minf = _box(b"minf", header, dinf, stbl)
        return _box(b"trak", tkhd, edts, _box(b"mdia", mdhd, hdlr, minf))
