"""Streaming writer: H.264 + AAC encoded once on its own thread, the same fragments handed to every
sink: the fragmented MP4 file (the record) and the live sinks (``io.live``).

Each chunk put into the writer becomes one MP4 fragment (``moof`` + ``mdat``) that is handed to
the operating system as soon as the chunk is encoded, so the file plays while it grows and stays
readable up to its last complete fragment if the process dies. ``close()`` then turns it into a
regular MP4 with its index in front, the most widely playable form (``io.faststart``: the samples
copied as they lie, in memory that does not grow with the duration).

The fragments are written here (``io.fmp4``) rather than by FFmpeg's ``mp4`` muxer because that
muxer only emits a fragment when the *next* one starts (PyAV has no call to flush it), which would
keep every chunk off the disk until the following chunk arrived.

Latency on disk: every video frame of a chunk is on disk once the chunk is processed (x264 runs
with zero latency). Audio trails by less than three AAC frames (< 3072 samples): the samples that do
not fill a whole 1024-sample AAC frame wait for the next chunk, and the AAC encoder holds two frames
back (its priming frame plus one of lookahead). ``close()`` writes all of it.

Closed GOPs: a GOP can only start where the caller says a render could be resumed (``boundary()``,
at each checkpoint of the chunk loop), and starts at the first such point at least
``spec.gop_seconds`` after the previous GOP's start: a pure function of where the boundaries fall, so
the same in every run. Each GOP is encoded by fresh encoders (``io.encoder``), so what its bytes are
depends only on its own frames and audio. A GOP's end is told to the sinks as soon as ``boundary()``
knows it (an HLS segment is listed before the next chunk is generated).

Resuming: ``mark(callback)``, allowed only where the next chunk opens a GOP (``boundary()`` said so), reports
a ``WriterPosition`` once everything put before it is on disk. A new writer given that position cuts
the file back to it and appends, restarting its encoders exactly as the uninterrupted writer did at
that point: the resumed file is byte for byte the uninterrupted one.
"""

from __future__ import annotations

import hashlib
import math
import os
import queue
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Callable, Optional, Sequence, Union

import av
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.io.codecs import write_error
from avatar_render.io.encoder import Aborted, ChunkEncoder, Fragment, replay_from
from avatar_render.io.faststart import remux_faststart
from avatar_render.io.filesink import FileSink
from avatar_render.io.fmp4 import MuxerState
from avatar_render.io.memory import release_freed
from avatar_render.io.sink import Sink
from avatar_render.io.spec import WriterSpec

__all__ = ["Mp4Writer", "WriterPosition", "WriterResume", "WriterSpec", "WriterStats", "remux_faststart",
           "replay_start"]


@dataclass(frozen=True)
class WriterStats:
    frames: int
    audio_samples: int
    bytes: int  # of the file (0 without one)
    # time.perf_counter() when the first frame's fragment was handed to the sinks
    first_frame_on_disk_s: Optional[float]
    encode_seconds: float  # time the writer thread spent encoding+muxing


@dataclass(frozen=True)
class WriterPosition:
    """The file after a mark: whole fragments up to ``bytes``; all numbers JSON-friendly."""

    bytes: int
    sequence: int  # fragments in the file
    video_time: int  # muxer clocks (see io.fmp4.MuxerState)
    audio_time: int
    frames: int  # video frames in the file (all frames put so far: x264 holds none back)
    audio_samples: int  # input samples put so far, including those the AAC encoder still holds


@dataclass(frozen=True)
class WriterResume:
    position: WriterPosition
    replay: np.ndarray  # (C, position.audio_samples - replay_start(position)) float32: input audio to encode again
    video_sha256: tuple[str, ...] = ()  # of each chunk's video in the file, checked before it is continued


def replay_start(position: WriterPosition) -> int:
    """Index of the first input sample a writer resuming at ``position`` must be given again."""
    return replay_from(position.audio_time)


@dataclass(frozen=True)
class _Chunk:
    frames: np.ndarray  # (T, H, W, 3) uint8 RGB
    audio: np.ndarray  # (C, n) float32
    opens_gop: bool  # its first frame starts a GOP: fresh encoders, an IDR frame
    more: bool  # a part of a chunk that goes on in the next put


@dataclass(frozen=True)
class _Mark:
    callback: Callable[[WriterPosition], None]


@dataclass(frozen=True)
class _GopEnd:
    pass


@dataclass(frozen=True)
class _Close:
    at_gop_start: bool  # the stream ends at a resume point


class Mp4Writer:
    """Encodes chunks of frames + audio on a background thread into ``spec.path`` (no file when it is
    None) and ``sinks``.

    ``put`` keeps the frames it is given until they are encoded and no longer (it copies the audio
    only), so the caller must leave them unchanged. Usable as a context manager:
    the file is closed on normal exit and aborted on an exception. With ``resume``, the existing file
    is cut back to ``resume.position`` and continued; the sinks are opened where it stands.
    """

    def __init__(self, spec: WriterSpec, *, resume: Optional[WriterResume] = None, sinks: Sequence[Sink] = ()):
        self.spec = spec
        self._queue: queue.Queue[Union[_Chunk, _Mark, _GopEnd, _Close, None]] = queue.Queue()
        self._room = threading.Semaphore(spec.queue_chunks)  # chunks (not marks) that may wait in the queue
        self._abort = threading.Event()
        self._error: Optional[AvatarRenderError] = None
        self._stats: Optional[WriterStats] = None
        self._faststart = True
        start = resume.position if resume is not None else WriterPosition(0, 0, 0, 0, 0, 0)
        self._frames_put = self._frames_written = start.frames
        self._samples_put = start.audio_samples
        self._gop_frames = math.ceil(spec.gop_seconds * spec.fps)  # shortest GOP
        self._gop_start: int | None = None  # (main thread) first frame of the GOP being put
        self._next_opens = True  # (main thread) the next chunk put opens a GOP
        self._in_chunk = False  # (main thread) the last put was a part of a chunk that goes on
        self._first_frame_on_disk: Optional[float] = None
        self._encode_seconds = 0.0
        self._sinks: list[Sink] = []
        self._video_sha256: list[str] = []  # (writer thread) of each chunk encoded, in the order put

        position = None if resume is None else (start.bytes, start.sequence, resume.video_sha256)
        self._file = None if spec.path is None else FileSink(spec, resume=position)
        try:
            self._encoder = ChunkEncoder(spec, frames=start.frames, samples=start.audio_samples,
                                         audio_time=start.audio_time)
            state = MuxerState(start.sequence, start.video_time, start.audio_time)
            if self._file is not None:
                self._file.open(self._encoder.tracks, state, first_frame=start.frames)
            if resume is not None:
                self._encoder.resume(resume.replay)
            for sink in sinks:
                sink.open(self._encoder.tracks, state, first_frame=start.frames)
                self._sinks.append(sink)
        except BaseException as exc:
            for sink in self._sinks:
                sink.abort()
            if self._file is not None:
                self._file.discard()
            if isinstance(exc, OSError):
                raise AvatarRenderError(write_error(spec.path, exc)) from None
            if isinstance(exc, av.error.FFmpegError):
                raise AvatarRenderError(f"Could not start the H.264/AAC encoders: {exc}.") from None
            raise

        self._thread = threading.Thread(target=self._run, name="mp4-writer", daemon=True)
        self._thread.start()

    def video_sha256(self, chunk: int) -> str:
        """SHA-256 of the H.264 samples (AVCC) the ``chunk``-th chunk put into this writer was encoded to:
        known on the writer thread once the chunk is encoded (a ``mark`` callback after it), and after ``close``."""
        return self._video_sha256[chunk]

    @property
    def frames_written(self) -> int:
        """Frames handed to the sinks (in complete fragments on disk) so far."""
        return self._frames_written

    def put(self, frames: np.ndarray, audio: np.ndarray, *, more: bool = False) -> None:
        """Queue frames (T, H, W, 3) uint8 RGB and their audio (C, n) float; blocks while the queue is full.
        The frames are not copied (hundreds of MB a chunk at 720p): leave them unchanged once put.

        ``more``: the chunk goes on in the next put (its frames given as they are drawn, each part taking a
        place in the queue; its audio with its last part): the chunk is one fragment all the same, the bytes
        of one put with all its frames."""
        spec = self.spec
        if more and audio.shape[-1]:
            raise ValueError("a chunk given in parts has its audio with its last part")
        if frames.ndim != 4 or frames.shape[1:] != (spec.height, spec.width, 3) or frames.dtype != np.uint8:
            raise ValueError(
                f"frames must be uint8 (T, {spec.height}, {spec.width}, 3), got {frames.dtype} {frames.shape}")
        if audio.ndim != 2 or audio.shape[0] != spec.audio_channels:
            raise ValueError(f"audio must be ({spec.audio_channels}, n), got {audio.shape}")
        opens = self._next_opens and not self._in_chunk
        chunk = _Chunk(np.ascontiguousarray(frames), np.array(audio, dtype=np.float32, order="C"), opens_gop=opens,
                       more=more)
        self._enqueue(chunk)
        self._next_opens, self._in_chunk = False, more
        if opens:
            self._gop_start = self._frames_put
        self._frames_put += len(chunk.frames)
        self._samples_put += chunk.audio.shape[1]

    def boundary(self, *, last: bool = False) -> bool:
        """A point where a render could be resumed (between two chunks put). True when a GOP opens
        here: then the next chunk starts one, and a ``mark`` here is a point a resumed writer joins
        byte for byte. The sinks are told at once that a GOP ended, except at the ``last`` boundary,
        where ``close`` ends it (with the audio the encoder still holds)."""
        assert not self._in_chunk, "a boundary falls between chunks"
        if self._gop_start is None or self._frames_put - self._gop_start >= self._gop_frames:
            if not self._next_opens and not last:
                self._enqueue(_GopEnd())
            self._next_opens = True
        return self._next_opens

    def mark(self, callback: Callable[[WriterPosition], None]) -> None:
        """Call ``callback(position)`` on the writer thread once everything put so far is on disk;
        only where the next chunk opens a GOP, and only with a file. An exception the callback raises
        (an AvatarRenderError) stops the writer and reaches the caller."""
        assert self._next_opens, "a resume point must fall on a GOP start"
        assert self._file is not None, "a resume point needs the file"
        self._enqueue(_Mark(callback))

    def close(self, *, faststart: bool = True) -> WriterStats:
        """Write everything queued, end every sink's stream, finish the file and return statistics.
        With ``faststart`` the fragmented file is then replaced by a regular MP4 (see ``remux_faststart``)."""
        if self._stats is None:
            self._faststart = faststart
            try:
                self._enqueue(_Close(at_gop_start=self._next_opens))
            except AvatarRenderError:
                self._thread.join(timeout=10.0)
                raise
            self._thread.join()
            if self._error is not None:
                raise self._error
            self._stats = WriterStats(
                frames=self._frames_put,
                audio_samples=self._samples_put,
                bytes=0 if self.spec.path is None else os.path.getsize(self.spec.path),
                first_frame_on_disk_s=self._first_frame_on_disk,
                encode_seconds=self._encode_seconds,
            )
        return self._stats

    def abort(self) -> None:
        """Stop without writing what is queued; the file keeps its complete fragments, the live
        streams end at once. Never raises."""
        self._abort.set()
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        self._queue.put_nowait(None)
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

    def _enqueue(self, item: Union[_Chunk, _Mark, _GopEnd, _Close]) -> None:
        while True:
            if self._error is not None:
                raise self._error
            if self._abort.is_set() or self._stats is not None or not self._thread.is_alive():
                raise AvatarRenderError(f"The writer for {self._name} is already closed.")
            if not isinstance(item, _Chunk) or self._room.acquire(timeout=0.1):
                self._queue.put(item)
                return

    @property
    def _name(self) -> str:
        return "the live stream" if self.spec.path is None else shown(self.spec.path)

    # Everything below runs on the writer thread.

    def _run(self) -> None:
        ended = False
        try:
            try:
                while True:
                    item = self._queue.get()
                    if item is None or self._abort.is_set():
                        break
                    if isinstance(item, _Mark):
                        item.callback(self._position())
                    elif isinstance(item, _GopEnd):
                        for sink in self._sinks:
                            sink.end_gop()
                    elif isinstance(item, _Close):
                        start = time.perf_counter()
                        self._send(self._encoder.finish(at_gop_start=item.at_gop_start))
                        self._encode_seconds += time.perf_counter() - start
                        for sink in self._sinks:
                            sink.close()
                        ended = True
                        break
                    else:
                        start = time.perf_counter()
                        fragment = self._encoder.encode(item.frames, item.audio, opens_gop=item.opens_gop,
                                                        more=item.more, abort=self._abort)
                        if fragment is not None:
                            digest = hashlib.sha256()
                            for sample in fragment.video:
                                digest.update(sample.data)
                            self._video_sha256.append(digest.hexdigest())
                            self._send(fragment)
                        whole = fragment is not None
                        item = fragment = None  # the frames freed (unless the caller still holds them) ...
                        if whole:
                            release_freed()  # ... and, a chunk done, their pages returned before the next is let in
                        self._room.release()
                        self._encode_seconds += time.perf_counter() - start
            finally:
                if not ended:
                    for sink in self._sinks:
                        sink.abort()
                if self._file is not None:
                    self._file.close()
            if ended and self._faststart and self._file is not None and self._file.muxer.sequence:  # something to copy
                start = time.perf_counter()
                remux_faststart(self.spec.path, self.spec.path)
                self._encode_seconds += time.perf_counter() - start
        except Aborted:
            pass
        except AvatarRenderError as exc:
            self._error = exc
        except OSError as exc:
            self._error = AvatarRenderError(write_error(self.spec.path, exc))
        except Exception as exc:  # an encoder failure; surfaced to the caller as one sentence
            self._error = AvatarRenderError(f"Could not encode {self._name}: {exc}.")

    def _position(self) -> WriterPosition:
        assert self._frames_written == self._encoder.frames, "x264 runs with zero latency"
        m = self._file.muxer.state
        return WriterPosition(bytes=self._file.bytes, sequence=m.sequence, video_time=m.video_time,
                              audio_time=m.audio_time, frames=self._frames_written, audio_samples=self._encoder.samples)

    def _send(self, fragment: Fragment) -> None:
        if not fragment.video and not fragment.audio:
            return
        if self._file is not None:
            self._file.write(fragment)
        self._frames_written += len(fragment.video)
        if fragment.video and self._first_frame_on_disk is None:
            self._first_frame_on_disk = time.perf_counter()
        for sink in self._sinks:
            sink.write(fragment)
        if self._file is None and self._sinks and all(sink.failed for sink in self._sinks):
            raise self._sinks[0].failed
