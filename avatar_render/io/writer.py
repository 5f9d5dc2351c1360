"""Streaming MP4 writer: H.264 + AAC in a fragmented MP4, encoded on its own thread.

Each chunk put into the writer becomes one MP4 fragment (``moof`` + ``mdat``) that is handed to
the operating system as soon as the chunk is encoded, so the file plays while it grows and stays
readable up to its last complete fragment if the process dies. ``close()`` then turns it into a
regular MP4 with its index in front (a quick stream copy), the most widely playable form.

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
the same in every run. Each GOP is encoded by fresh
encoders: x264 from scratch from an IDR frame, the AAC encoder restarted a few frames before the
first sample missing from the file (``replay_start``), its packets that the file already holds
dropped, so the two encodes join without a click. What a GOP's bytes are therefore depends only on
its own frames and audio, not on how the encoders got there.

Resuming: ``mark(callback)``, allowed only where the next chunk opens a GOP (``boundary()`` said so), reports
a ``WriterPosition`` once everything put before it is on disk. A new writer given that position cuts
the file back to it and appends, restarting its encoders exactly as the uninterrupted writer did at
that point: the resumed file is byte for byte the uninterrupted one.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from types import TracebackType
from typing import BinaryIO, Callable, Optional, Union

import av
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.files import create_new, open_own, shown
from avatar_render.io.codecs import (
    create_error,
    open_audio_encoder,
    open_video_encoder,
    remux_faststart,
    write_error,
)
from avatar_render.io.fmp4 import (
    AAC_FRAME,
    AAC_PRIMING,
    Fmp4Muxer,
    MuxerState,
    Sample,
    Tracks,
    annexb_to_avcc,
    scan_fragments,
)
from avatar_render.io.spec import WriterSpec

_PREROLL_FRAMES = 4  # AAC frames a restarted encoder re-encodes before the join (2 suffice for a clean join)
# Input samples kept for a restart: the pre-roll, plus what the file does not hold yet (the FIFO's
# part of a frame and the encoder's two held-back frames), with room to spare.
_HISTORY_SAMPLES = 16 * AAC_FRAME


@dataclass(frozen=True)
class WriterStats:
    frames: int
    audio_samples: int
    bytes: int
    first_frame_on_disk_s: Optional[float]  # time.perf_counter() when the first frame's fragment was flushed to disk
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


def replay_start(position: WriterPosition) -> int:
    """Index of the first input sample a writer resuming at ``position`` must be given again."""
    assert position.audio_time % AAC_FRAME == 0, "a mark never follows the final, short AAC packet"
    in_file = max(0, position.audio_time - AAC_PRIMING)  # input samples whose packets are in the file
    return max(0, in_file - _PREROLL_FRAMES * AAC_FRAME)


@dataclass(frozen=True)
class _Chunk:
    frames: np.ndarray  # (T, H, W, 3) uint8 RGB
    audio: np.ndarray  # (C, n) float32
    opens_gop: bool  # its first frame starts a GOP: fresh encoders, an IDR frame


class _AudioHistory:
    """The last ``size`` input samples, kept for the AAC restart at a GOP start."""

    def __init__(self, channels: int, size: int) -> None:
        self.data = np.zeros((channels, 0), np.float32)  # (C, <= size)
        self.end = 0  # index of the sample after the last one kept
        self.size = size

    def add(self, audio: np.ndarray) -> None:
        self.data = np.concatenate([self.data, audio], axis=1)[:, -self.size :]
        self.end += audio.shape[1]

    def since(self, start: int) -> np.ndarray:
        """Samples [start, end) as (C, end - start)."""
        assert self.end - self.data.shape[1] <= start <= self.end, "the AAC restart reaches back further than kept"
        return self.data[:, start - self.end + self.data.shape[1] :]


@dataclass(frozen=True)
class _Mark:
    callback: Callable[[WriterPosition], None]


class _Aborted(Exception):
    pass


class Mp4Writer:
    """Encodes chunks of frames + audio into ``spec.path`` on a background thread.

    ``put`` keeps the frames it is given until they are encoded (it copies the audio only), so the
    caller must leave them unchanged. Usable as a context manager:
    the file is closed on normal exit and aborted on an exception. With ``resume``, the existing file
    is cut back to ``resume.position`` and continued.
    """

    def __init__(self, spec: WriterSpec, *, resume: Optional[WriterResume] = None):
        self.spec = spec
        self._queue: queue.Queue[Union[_Chunk, _Mark, None]] = queue.Queue()
        self._room = threading.Semaphore(spec.queue_chunks)  # chunks (not marks) that may wait in the queue
        self._abort = threading.Event()
        self._error: Optional[AvatarRenderError] = None
        self._stats: Optional[WriterStats] = None
        self._faststart = True
        start = resume.position if resume is not None else WriterPosition(0, 0, 0, 0, 0, 0)
        self._frames_put = self._frames_encoded = self._frames_written = start.frames
        self._samples_put = self._samples_done = start.audio_samples
        self._gop_frames = math.ceil(spec.gop_seconds * spec.fps)  # shortest GOP
        self._gop_start: int | None = None  # (main thread) first frame of the GOP being put
        self._next_opens = True  # (main thread) the next chunk put opens a GOP
        self._fresh = True  # (writer thread) the encoders have encoded nothing yet
        self._history = _AudioHistory(spec.audio_channels, _HISTORY_SAMPLES)
        self._first_frame_on_disk: Optional[float] = None
        self._encode_seconds = 0.0

        try:
            # A new file is created, never opened over anything there; a resumed one is never followed through a link.
            self._file: BinaryIO = create_new(spec.path) if resume is None else open_own(spec.path, "r+b")
        except OSError as exc:
            raise AvatarRenderError(create_error(spec.path, exc)) from None
        try:
            self._video = open_video_encoder(spec)
            self._audio = open_audio_encoder(spec)
            self._fifo = av.AudioFifo()
            self._audio_pts = 0  # samples sent to the AAC encoder
            self._audio_skip = 0  # packets of a restarted AAC encoder that the file already holds
            tracks = Tracks(spec.width, spec.height, spec.fps, spec.audio_rate, spec.audio_channels,
                            spec.audio_bitrate, self._video.extradata, self._audio.extradata)
            state = MuxerState(start.sequence, start.video_time, start.audio_time)
            self._muxer = Fmp4Muxer(self._file, tracks, state)
            if resume is None:
                self._muxer.write_init()
            else:
                self._cut_back(resume)
        except BaseException as exc:
            self._file.close()
            if resume is None:
                spec.path.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise AvatarRenderError(write_error(spec.path, exc)) from None
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
        """Queue frames (T, H, W, 3) uint8 RGB and their audio (C, n) float; blocks while the queue is full.
        The frames are not copied (hundreds of MB a chunk at 720p): leave them unchanged once put."""
        spec = self.spec
        if frames.ndim != 4 or frames.shape[1:] != (spec.height, spec.width, 3) or frames.dtype != np.uint8:
            raise ValueError(f"frames must be uint8 (T, {spec.height}, {spec.width}, 3), got {frames.dtype} {frames.shape}")
        if audio.ndim != 2 or audio.shape[0] != spec.audio_channels:
            raise ValueError(f"audio must be ({spec.audio_channels}, n), got {audio.shape}")
        opens = self._next_opens
        chunk = _Chunk(np.ascontiguousarray(frames), np.array(audio, dtype=np.float32, order="C"), opens_gop=opens)
        self._enqueue(chunk)
        self._next_opens = False
        if opens:
            self._gop_start = self._frames_put
        self._frames_put += len(chunk.frames)
        self._samples_put += chunk.audio.shape[1]

    def boundary(self) -> bool:
        """A point where a render could be resumed (between two chunks put). True when a GOP opens
        here: then the next chunk starts one, and a ``mark`` here is a point a resumed writer joins
        byte for byte."""
        if self._gop_start is None or self._frames_put - self._gop_start >= self._gop_frames:
            self._next_opens = True
        return self._next_opens

    def mark(self, callback: Callable[[WriterPosition], None]) -> None:
        """Call ``callback(position)`` on the writer thread once everything put so far is on disk;
        only where the next chunk opens a GOP. An exception the callback raises (an
        AvatarRenderError) stops the writer and reaches the caller."""
        assert self._next_opens, "a resume point must fall on a GOP start"
        self._enqueue(_Mark(callback))

    def close(self, *, faststart: bool = True) -> WriterStats:
        """Write everything queued, finish the file and return statistics. With ``faststart`` the
        fragmented file is then replaced by a regular MP4 (see ``remux_faststart``)."""
        if self._stats is None:
            self._faststart = faststart
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

    def _enqueue(self, item: Union[_Chunk, _Mark, None]) -> None:
        while True:
            if self._error is not None:
                raise self._error
            if self._abort.is_set() or self._stats is not None or not self._thread.is_alive():
                raise AvatarRenderError(f"The writer for {shown(self.spec.path)} is already closed.")
            if not isinstance(item, _Chunk) or self._room.acquire(timeout=0.1):
                self._queue.put(item)
                return

    def _cut_back(self, resume: WriterResume) -> None:
        """Check the file against ``resume``, cut it to the position and load the AAC pre-roll."""
        position, path = resume.position, self.spec.path
        init = self._muxer.init_segment()
        if self._file.read(len(init)) != init:
            raise AvatarRenderError(f"The partial video {shown(path)} was written with other encoder settings or versions.")
        try:
            if os.fstat(self._file.fileno()).st_size < position.bytes:
                raise ValueError("it is shorter than the journal says")
            sequence = scan_fragments(self._file, position.bytes)
        except ValueError as exc:
            raise AvatarRenderError(f"The partial video {shown(path)} does not match its journal: {exc}.") from None
        if sequence != position.sequence:
            raise AvatarRenderError(f"The partial video {shown(path)} does not match its journal: it ends at fragment {sequence}, not {position.sequence}.")
        self._file.truncate(position.bytes)
        self._file.seek(position.bytes)
        start = replay_start(position)
        if resume.replay.shape != (self.spec.audio_channels, position.audio_samples - start):
            raise ValueError(f"replay audio must be {(self.spec.audio_channels, position.audio_samples - start)}, got {resume.replay.shape}")
        replay = np.array(resume.replay, dtype=np.float32, order="C")
        self._history.end = start
        self._history.add(replay)
        self._replay_audio(position, replay)

    def _replay_audio(self, position: WriterPosition, replay: np.ndarray) -> None:
        """Feed a fresh AAC encoder the samples from ``replay_start(position)`` on; drop its packets
        that the file already holds."""
        self._audio_skip = position.audio_time // AAC_FRAME - replay_start(position) // AAC_FRAME
        self._fifo_write(replay)

    # Everything below runs on the writer thread.

    def _run(self) -> None:
        try:
            try:
                while True:
                    item = self._queue.get()
                    if item is None or self._abort.is_set():
                        break
                    if isinstance(item, _Mark):
                        item.callback(self._position())
                        continue
                    start = time.perf_counter()
                    self._write_chunk(item)
                    self._room.release()
                    self._encode_seconds += time.perf_counter() - start
                start = time.perf_counter()
                if not self._abort.is_set():
                    if self._next_opens and not self._fresh:  # a resume point at the end: flush as a resumed writer would
                        self._restart_encoders()
                    self._write_fragment(self._video_samples(self._video.encode(None)), self._encode_audio(final=True))
            finally:
                self._file.close()
            if not self._abort.is_set() and self._faststart and self._muxer.sequence:  # something to copy
                remux_faststart(self.spec.path, self.spec.path)
                self._encode_seconds += time.perf_counter() - start
        except _Aborted:
            pass
        except AvatarRenderError as exc:
            self._error = exc
        except OSError as exc:
            self._error = AvatarRenderError(write_error(self.spec.path, exc))
        except Exception as exc:  # an encoder failure; surfaced to the caller as one sentence
            self._error = AvatarRenderError(f"Could not encode {shown(self.spec.path)}: {exc}.")

    def _position(self) -> WriterPosition:
        assert self._frames_written == self._frames_encoded, "x264 runs with zero latency"
        m = self._muxer.state
        return WriterPosition(bytes=self._file.tell(), sequence=m.sequence, video_time=m.video_time,
                              audio_time=m.audio_time, frames=self._frames_written, audio_samples=self._samples_done)

    def _write_chunk(self, chunk: _Chunk) -> None:
        if chunk.opens_gop and not self._fresh:
            self._restart_encoders()
        self._fresh = False
        video: list[Sample] = []
        for i, rgb in enumerate(chunk.frames):
            if self._abort.is_set():
                raise _Aborted
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame = frame.reformat(format="yuv420p", dst_colorspace="ITU709", dst_color_range="MPEG")
            frame.pts = self._frames_encoded
            self._frames_encoded += 1
            if i == 0 and chunk.opens_gop:
                frame.pict_type = av.video.frame.PictureType.I  # with forced-idr=1: an IDR frame
            video += self._video_samples(self._video.encode(frame))
        self._fifo_write(chunk.audio)
        self._history.add(chunk.audio)
        self._samples_done += chunk.audio.shape[1]
        self._write_fragment(video, self._encode_audio(final=False))

    def _restart_encoders(self) -> None:
        """Fresh encoders for a new GOP, started as a resumed writer starts them at this point."""
        position = self._position()
        left = self._video.encode(None)  # zero latency: nothing is held back
        assert not left, "x264 held frames back"
        self._video = open_video_encoder(self.spec)
        self._audio = open_audio_encoder(self.spec)
        self._fifo = av.AudioFifo()
        self._audio_pts = 0
        self._replay_audio(position, self._history.since(replay_start(position)))

    def _fifo_write(self, audio: np.ndarray) -> None:
        if audio.shape[1]:
            planar = av.AudioFrame.from_ndarray(audio, format="fltp", layout=self._audio.layout.name)
            planar.sample_rate = self.spec.audio_rate
            self._fifo.write(planar)

    def _video_samples(self, packets: list[av.Packet]) -> list[Sample]:
        duration = self._muxer.frame_duration
        return [Sample(annexb_to_avcc(bytes(p)), duration, p.is_keyframe) for p in packets]

    def _encode_audio(self, final: bool) -> list[Sample]:
        packets: list[av.Packet] = []
        while self._fifo.samples >= AAC_FRAME or (final and self._fifo.samples):
            frame = self._fifo.read(min(AAC_FRAME, self._fifo.samples))
            frame.pts = self._audio_pts
            frame.time_base = Fraction(1, self.spec.audio_rate)
            self._audio_pts += frame.samples
            packets += self._audio.encode(frame)
        if final:
            packets += self._audio.encode(None)
        if self._audio_skip:
            skipped, self._audio_skip = min(self._audio_skip, len(packets)), max(0, self._audio_skip - len(packets))
            packets = packets[skipped:]
        # Packet durations count samples; the last packet's covers only the real samples it holds.
        return [Sample(bytes(p), int(p.duration or AAC_FRAME), True) for p in packets]

    def _write_fragment(self, video: list[Sample], audio: list[Sample]) -> None:
        if not video and not audio:
            return
        self._muxer.write_fragment(video, audio)
        self._frames_written += len(video)
        if video and self._first_frame_on_disk is None:
            self._first_frame_on_disk = time.perf_counter()
