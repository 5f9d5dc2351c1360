"""Audio that arrives as a stream: standard input, pieces pushed over HTTP, or a network listener.

A reader thread opens the stream with PyAV (any container it can read from a pipe: WAV with any
length in its header, fragmented MP4, Ogg, MPEG-TS; or raw PCM described by ``audio.raw``) and
puts the decoded frames in a bounded queue; when the queue is full the producer is held back (the
pipe or the HTTP request waits), so memory stays flat. ``AudioReader`` takes the frames from
``frames()`` as it needs them.

In real time (``realtime``) the session runs on the clock: time 0 is the first frame handed out, and
when the audio for time t has not come by ``t + slack_s`` on that clock, silence is handed out
instead (in the stream's own sample format). The silence is part of the session's audio, so the
video and the audio stay in sync by construction; audio that comes later follows it. Without real
time the frames are handed out as fast as they come and nothing is added.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator, Optional

import av
import numpy as np

from avatar_render.errors import AvatarRenderError

STDIN = "-"
PUSHED = "post:"  # the audio is pushed to the watch server (--serve): POST /audio, then POST /end
NETWORK = ("rtmp://", "srt://")  # listeners: RTMP opened by PyAV, SRT by the ffmpeg command (PyAV's FFmpeg has no SRT)
SRT_RAW = "s16le:48000:2"  # what the ffmpeg command hands on from an SRT listener
_QUEUE_FRAMES = 512  # decoded frames held ahead of the chunk loop (tens of seconds: 1024 to 4096 samples each)
_PAD_MIN_S = 0.02  # the smallest silence handed out at once in real time
_POLL_S = 0.1  # how often a wait looks at the stop request
_SILENCE = {"u8": (np.uint8, 128), "s16": (np.int16, 0), "s32": (np.int32, 0), "s64": (np.int64, 0),
            "flt": (np.float32, 0), "dbl": (np.float64, 0)}
_DECODED = {"u8": "u8", "s16": "s16", "s32": "s32", "f32": "flt", "f64": "dbl"}  # raw PCM -> its decoded format
_RAW_FORMATS = ("u8", "s16le", "s16be", "s32le", "s32be", "f32le", "f32be", "f64le", "f64be")


def is_stream(audio: object) -> bool:
    """Whether the ``--audio`` value names a stream (standard input, pushed pieces, a listener) and not a file."""
    text = str(audio)
    return text in (STDIN, PUSHED) or text.startswith(NETWORK)


def stream_name(audio: str) -> str:
    """The stream as a message names it."""
    if audio == STDIN:
        return "standard input"
    if audio == PUSHED:
        return "pushed audio"
    return audio


@dataclass(frozen=True)
class RawFormat:
    """Raw PCM on a stream: FORMAT:RATE:CHANNELS (``s16le:16000:1``)."""

    sample_format: str
    rate: int
    channels: int

    @staticmethod
    def parse(text: str) -> RawFormat:
        parts = text.split(":")
        ok = len(parts) == 3 and parts[0] in _RAW_FORMATS and parts[1].isdigit() and parts[2].isdigit()
        if not ok or not (4000 <= int(parts[1]) <= 768_000 and 1 <= int(parts[2]) <= 8):
            raise AvatarRenderError(
                f"audio.raw={text!r} is not a raw PCM format: give FORMAT:RATE:CHANNELS, e.g. s16le:16000:1 "
                f"(FORMAT one of {', '.join(_RAW_FORMATS)}, RATE 4000 to 768000 Hz, 1 to 8 channels).")
        return RawFormat(parts[0], int(parts[1]), int(parts[2]))


def _raw_frames(file, raw: RawFormat, closed: threading.Event) -> Iterator[av.AudioFrame]:
    """Raw PCM read as it comes: every whole sample that has arrived becomes a frame at once (a
    demuxer would hold a part-filled packet back until more came)."""
    kind = raw.sample_format[:3]
    dtype = np.dtype({"u8": "u1", "s16": "i2", "s32": "i4", "f32": "f4", "f64": "f8"}[kind])
    wire = dtype.newbyteorder("<" if raw.sample_format.endswith("le") or kind == "u8" else ">")
    step = dtype.itemsize * raw.channels
    layout = {1: "mono", 2: "stereo"}.get(raw.channels, f"{raw.channels}c")
    pending = b""
    while not closed.is_set():
        data = file.read(4096 * step)
        if not data:
            return
        pending += data
        whole = len(pending) // step * step
        if not whole:
            continue
        samples = np.frombuffer(pending[:whole], wire).astype(dtype)[None]  # (1, n * C), packed
        pending = pending[whole:]
        frame = av.AudioFrame.from_ndarray(samples, format=_DECODED[kind], layout=layout)
        frame.sample_rate = raw.rate
        yield frame


class _FdReader:
    """A file-like view of a pipe that returns what is there (``read`` never waits for a full block)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.received = 0  # bytes read so far

    def read(self, n: int) -> bytes:
        data = os.read(self.fd, n)
        self.received += len(data)
        return data


class Pieces:
    """A byte stream made of pieces pushed in from other threads (the HTTP endpoint), read like a pipe."""

    def __init__(self, *, max_bytes: int = 1 << 20) -> None:
        self._buffer = bytearray()
        self._ended = False
        self._cond = threading.Condition()
        self._max = max_bytes
        self.received = 0  # bytes pushed so far

    def push(self, data: bytes) -> None:
        """Add ``data``; waits while ``max_bytes`` are already waiting (the sender is held back)."""
        with self._cond:
            while len(self._buffer) >= self._max and not self._ended:
                self._cond.wait(_POLL_S)
            if self._ended:
                raise EOFError("the audio stream has ended")
            self._buffer += data
            self.received += len(data)
            self._cond.notify_all()

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    @property
    def ended(self) -> bool:
        return self._ended

    def read(self, n: int) -> bytes:
        with self._cond:
            while not self._buffer and not self._ended:
                self._cond.wait()
            out = bytes(self._buffer[:n])
            del self._buffer[:n]
            self._cond.notify_all()
            return out


class StreamedAudio:
    """Frames of an audio stream, decoded by a reader thread (see the module docstring).

    ``source``: a pipe's file descriptor, a ``Pieces`` buffer or a listener URL. ``should_stop()``
    turning true ends the stream as if its producer had closed it (what has come is kept)."""

    def __init__(self, source: int | Pieces | str, *, name: str, raw: Optional[RawFormat], realtime: bool,
                 slack_s: float = 0.25, should_stop: Callable[[], bool] = lambda: False,
                 process: Optional[subprocess.Popen] = None) -> None:
        self.name = name
        self.codec = f"pcm_{raw.sample_format}" if raw else "?"
        self.estimated_seconds: Optional[float] = None
        self.realtime = realtime
        self.padded_samples = 0  # silence handed out in real time, at the stream's rate
        self.idle: list[tuple[float, float]] = []  # (start, seconds) of each stretch of that silence
        self._slack = slack_s
        self._raw = raw
        self._should_stop = should_stop
        self._queue: queue.Queue = queue.Queue(maxsize=_QUEUE_FRAMES)
        self._closed = threading.Event()
        self._file: Optional[BinaryIO | Pieces | _FdReader] = (
            _FdReader(source) if isinstance(source, int) else source if isinstance(source, Pieces) else None)
        self._url = source if isinstance(source, str) else None
        self._ended = False
        self._t0: Optional[float] = None  # the session clock's time 0 (time.monotonic())
        self._position = 0.0  # seconds handed out so far
        self._last: Optional[av.AudioFrame] = None
        self._process = process  # the command that feeds ``source`` (ended on close)
        self._thread = threading.Thread(target=self._read, name="audio-stream", daemon=True)
        self._thread.start()

    def clock_origin(self) -> Optional[float]:
        """In real time, the time.monotonic() at which the session's time 0 was (None before its first frame,
        and without real time): a live sink paces from it, not from its own first packet."""
        return self._t0 if self.realtime else None

    # -- the reader thread --------------------------------------------------------------------

    def _open(self) -> av.container.InputContainer:
        if self._url is not None:
            return av.open(self._url, "r", options={"listen": "1"})
        # (a WAV header written by a pipe holds a wrong length: read to the end of the stream)
        return av.open(self._file, "r", options={"ignore_length": "1"}, buffer_size=4096)

    def _read(self) -> None:
        try:
            if self._raw is not None and self._file is not None:  # (audio.raw: read without a demuxer)
                for frame in _raw_frames(self._file, self._raw, self._closed):
                    if not self._put(frame):
                        return
                self._put(None)
                return
            try:
                container = self._open()
            except (av.FFmpegError, OSError, ValueError):
                if self._file is not None and not self._file.received:
                    raise AvatarRenderError(
                        f"The audio from {self.name} ended before its first byte: no audio came.") from None
                raise AvatarRenderError(
                    f"The audio from {self.name} is not an audio stream that can be read; give WAV, "
                    "fragmented MP4, Ogg, MPEG-TS or raw PCM with audio.raw=FORMAT:RATE:CHANNELS.") from None
            with container:
                streams = container.streams.audio
                if not streams or streams[0].codec_context is None:
                    raise AvatarRenderError(f"The stream on {self.name} holds no audio that can be decoded.")
                stream = streams[0]
                self.codec = stream.codec_context.codec.canonical_name
                came = False
                for frame in self._decoded(container, stream):
                    came = came or frame.samples > 0
                    if frame.samples > 0 and not self._put(frame):
                        return
                if not came and container.format.name.startswith("mov"):
                    raise AvatarRenderError(
                        f"The MP4 on {self.name} has its index after its sound, which a pipe cannot go back to; "
                        "give the file itself (--audio FILE), or one written with -movflags +faststart or "
                        "fragmented.")
        except BaseException as exc:  # handed to the chunk loop, which raises it
            self._put(exc)
            return
        self._put(None)

    def _decoded(self, container, stream) -> Iterator[av.AudioFrame]:
        packets = container.demux(stream)
        while not self._closed.is_set():
            try:
                packet = next(packets)
            except (StopIteration, av.FFmpegError):
                break
            try:
                yield from stream.codec_context.decode(packet)
            except av.FFmpegError:
                continue
        try:
            yield from stream.codec_context.decode(None)
        except av.FFmpegError:
            pass

    def _put(self, item: object) -> bool:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    # -- the chunk loop's side ----------------------------------------------------------------

    def frames(self) -> Iterator[av.AudioFrame]:
        """The stream's frames in order, with silence where real time needs it; ends with the stream."""
        while not self._ended:
            item = self._next()
            if item is None:
                self._ended = True
                return
            if isinstance(item, BaseException):
                self._ended = True
                raise item
            if self._t0 is None:
                self._t0 = time.monotonic()
            self._position += item.samples / item.sample_rate
            self._last = item
            yield item

    def _next(self) -> Optional[av.AudioFrame | BaseException]:
        """The next frame, silence (real time, when the audio is late), an error, or None at the end."""
        while True:
            if self._should_stop():  # the reader thread stops taking more; what it had is handed out
                self._closed.set()
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    return None
                return item if isinstance(item, av.AudioFrame) else None
            try:
                item = self._queue.get(timeout=self._wait())
            except queue.Empty:
                if self._late():
                    return self._silence()
                continue
            return item

    def _wait(self) -> float:
        if not self.realtime or self._t0 is None and self._raw is None:
            return _POLL_S
        t0 = self._t0 if self._t0 is not None else time.monotonic()
        return min(_POLL_S, max(0.001, t0 + self._position + self._slack - time.monotonic()))

    def _late(self) -> bool:
        if not self.realtime or (self._last is None and self._raw is None):
            return False  # (the format of the silence is known only from a frame or from audio.raw)
        if self._t0 is None:
            self._t0 = time.monotonic() - self._slack
        return time.monotonic() >= self._t0 + self._position + self._slack

    def _silence(self) -> av.AudioFrame:
        """Silence up to where the clock is now (at least 20 ms), in the stream's own format."""
        if self._last is not None:
            fmt, layout, rate = self._last.format.name, self._last.layout.name, self._last.sample_rate
            channels = self._last.layout.nb_channels
        else:
            fmt, rate, channels = _DECODED[self._raw.sample_format[:3]], self._raw.rate, self._raw.channels
            layout = {1: "mono", 2: "stereo"}.get(channels, f"{channels}c")
        behind = time.monotonic() - self._t0 - self._slack - self._position
        n = max(round(_PAD_MIN_S * rate), round(behind * rate))
        dtype, zero = _SILENCE[fmt.rstrip("p")]
        planar = fmt.endswith("p")
        data = np.full((channels, n) if planar else (1, n * channels), zero, dtype)
        frame = av.AudioFrame.from_ndarray(data, format=fmt, layout=layout)
        frame.sample_rate = rate
        self.padded_samples += n
        if self.idle and abs(sum(self.idle[-1]) - self._position) < 1e-9:
            self.idle[-1] = (self.idle[-1][0], self.idle[-1][1] + n / rate)
        else:
            self.idle.append((self._position, n / rate))
        return frame

    def close(self) -> None:
        self._closed.set()
        if isinstance(self._file, Pieces):
            self._file.end()
        if self._process is not None and self._process.poll() is None:
            self._process.kill()  # (it only feeds this stream; asked to end, it could wait on the pipe no one reads)
            self._process.wait()


def srt_listener(url: str) -> subprocess.Popen:
    """The ffmpeg command listening on ``url`` (srt://ADDR:PORT?mode=listener), its audio as raw PCM
    (``SRT_RAW``) on its standard output; it ends when the sender does."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise AvatarRenderError(
            "Reading audio from srt:// needs the ffmpeg command (e.g. apt-get install ffmpeg), which is not on the "
            "PATH.")
    raw = RawFormat.parse(SRT_RAW)
    return subprocess.Popen(
        [ffmpeg, "-nostdin", "-v", "error", "-analyzeduration", "200000", "-probesize", "16384",  # (start at once)
         "-i", url, "-vn", "-ac", str(raw.channels), "-ar", str(raw.rate), "-f", raw.sample_format,
         "-flush_packets", "1", "-"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True)
