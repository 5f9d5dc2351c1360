"""The render's one encoder: chunks of frames + audio in, ``Fragment``s of H.264 + AAC samples out.

Every sink (the MP4 file, HLS, RTMP, SRT, standard output) is given the same fragments: the video is
encoded once. Timestamps come from counters only: video frame ``i`` is at ``i / fps``, audio sample
``n`` at ``n / rate`` (the AAC track's clock counts the encoder's priming too, see ``io.fmp4``).

Closed GOPs: a fragment that ``opens_gop`` is encoded by fresh encoders, x264 from an IDR frame and the
AAC encoder restarted ``_PREROLL_FRAMES`` frames before the first sample not yet sent out, its packets
that were already sent dropped, so the two encodes join without a click. What a GOP's bytes are
therefore depends only on its own frames and audio, not on how the encoders got there: the property
that lets a resumed render write the bytes of the uninterrupted one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Optional

import av
import cv2
import numpy as np

from avatar_render.io.codecs import open_audio_encoder, open_video_encoder
from avatar_render.io.fmp4 import AAC_FRAME, AAC_PRIMING, Sample, Tracks, annexb_to_avcc, video_timescale
from avatar_render.io.spec import WriterSpec

_PREROLL_FRAMES = 4  # AAC frames a restarted encoder re-encodes before the join (2 suffice for a clean join)
# Input samples kept for a restart: the pre-roll, plus what has not been sent out yet (the FIFO's part
# of a frame and the encoder's two held-back frames), with room to spare.
_HISTORY_SAMPLES = 16 * AAC_FRAME


@dataclass(frozen=True)
class Fragment:
    """One chunk's encoded samples (one MP4 fragment), and where they sit on the two timelines."""

    video: list[Sample]  # H.264 in AVCC form (length-prefixed NAL units), one per frame, durations in video_timescale
    audio: list[Sample]  # AAC frames, durations in samples
    first_frame: int  # index of video[0] in the whole video
    audio_time: int  # decode time of audio[0] in samples, the encoder's priming included
    opens_gop: bool  # video[0] is an IDR frame and the encoders were fresh
    last_rgb: Optional[np.ndarray] = None  # (H, W, 3) uint8: the last frame, for a live sink that holds it
    # (C, n) float32: the chunk's input audio, from input sample ``pcm_at`` on, for a live sink that encodes its
    # own audio as it comes (the AAC encoder holds up to two frames back till the next chunk)
    pcm: Optional[np.ndarray] = None
    pcm_at: int = 0


@dataclass
class _Part:
    """A chunk whose frames come in parts: where it started, its samples so far."""

    first: int
    audio_time: int
    opens_gop: bool
    video: list[Sample] = field(default_factory=list)


class Aborted(Exception):
    """The encode of a chunk was stopped half-way (``abort`` set)."""


def replay_from(audio_time: int) -> int:
    """Index of the first input sample a fresh AAC encoder must be given to join a stream whose AAC
    clock stands at ``audio_time`` (the encoder's priming included)."""
    assert audio_time % AAC_FRAME == 0, "a GOP never follows the final, short AAC packet"
    sent = max(0, audio_time - AAC_PRIMING)  # input samples whose packets were sent out
    return max(0, sent - _PREROLL_FRAMES * AAC_FRAME)


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


# RGB -> Y'CbCr, BT.709, limited range (Y 16..235, Cb and Cr 16..240): rows Y, Cb, Cr of a 3x4 affine map.
_BT709 = np.array(
    [[0.2126, 0.7152, 0.0722], [-0.2126 / 1.8556, -0.7152 / 1.8556, 0.5], [0.5, -0.7152 / 1.5748, -0.0722 / 1.5748]]
)
_RGB_TO_YUV = np.hstack([_BT709 * np.array([[219], [224], [224]]) / 255, [[16], [128], [128]]]).astype(np.float32)


class YuvScratch:
    """The conversion's intermediate pictures, reused from one frame to the next by the thread that owns them
    (new ones each frame cost about as much as the conversion at 720p: their pages faulted in)."""

    def __init__(self) -> None:
        self.size: Optional[tuple[int, int]] = None
        self.full = self.half = self.chroma = np.empty((0, 0, 3), np.uint8)

    def for_size(self, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(h, w, 3), (h / 2, w / 2, 3) twice: uint8 buffers for the Y'CbCr picture, the halved RGB and its Y'CbCr."""
        if self.size != (h, w):
            self.size = (h, w)
            self.full = np.empty((h, w, 3), np.uint8)
            self.half, self.chroma = (np.empty((h // 2, w // 2, 3), np.uint8) for _ in range(2))
        return self.full, self.half, self.chroma


def to_yuv420p(rgb: np.ndarray, scratch: Optional[YuvScratch] = None) -> av.VideoFrame:
    """(H, W, 3) uint8 RGB, H and W even -> a yuv420p frame in BT.709 limited range, as the stream's colour
    metadata says. ``scratch``: buffers of the calling thread to work in (fresh ones when None).

    OpenCV's SIMD matrix transform makes the full-resolution luma and, from the picture averaged over each
    2x2 block (the conversion is linear: this is the mean of the block's chroma), the chroma planes, written
    straight into the frame's planes: at 512x512 about a tenth of what FFmpeg's swscale takes for the same
    conversion (0.4 against 4 ms), at 1080p about as long (10 ms)."""
    h, w = rgb.shape[:2]
    assert h % 2 == 0 and w % 2 == 0, "4:2:0 needs even sides"
    full, half, chroma = (scratch or YuvScratch()).for_size(h, w)
    frame = av.VideoFrame(w, h, "yuv420p")
    cv2.resize(rgb, (w // 2, h // 2), dst=half, interpolation=cv2.INTER_AREA)
    cv2.transform(half, _RGB_TO_YUV, dst=chroma)
    cv2.transform(rgb, _RGB_TO_YUV, dst=full)
    for plane, (src, channel) in zip(frame.planes, ((full, 0), (chroma, 1), (chroma, 2))):
        rows = np.frombuffer(plane, np.uint8).reshape(plane.height, plane.line_size)
        dst = rows[:, : plane.width]
        if dst.flags.c_contiguous:
            cv2.extractChannel(src, channel, dst=dst)
        else:  # (rows padded for alignment)
            dst[:] = cv2.extractChannel(src, channel)
    return frame


class ChunkEncoder:
    """x264 (zero latency: each frame's packet comes out at once) and FFmpeg's AAC, restarted at GOP starts.

    ``frames``, ``samples`` and ``audio_time`` are where the stream stands (all zero for a new one):
    frames encoded, input samples taken, the AAC clock of the packets sent out. A stream continued from
    such a point (``resume``) is encoded exactly as the uninterrupted one from there on."""

    def __init__(self, spec: WriterSpec, *, frames: int = 0, samples: int = 0, audio_time: int = 0) -> None:
        self.spec = spec
        self.frames, self.samples, self.audio_time = frames, samples, audio_time
        self.frame_duration = video_timescale(spec.fps)[1]
        self._video = open_video_encoder(spec)
        self._audio = open_audio_encoder(spec)
        self._fifo = av.AudioFifo()
        self._audio_pts = 0  # samples sent to the AAC encoder
        self._audio_skip = 0  # packets of a restarted AAC encoder that were sent out already
        self._history = _AudioHistory(spec.audio_channels, _HISTORY_SAMPLES)
        self._fresh = True  # the encoders have encoded nothing yet
        self._scratch = YuvScratch()  # (encode runs on one thread at a time)
        self._part: Optional[_Part] = None  # the chunk being given in parts
        self.tracks = Tracks(spec.width, spec.height, spec.fps, spec.audio_rate, spec.audio_channels,
                             spec.audio_bitrate, self._video.extradata, self._audio.extradata)

    def resume(self, replay: np.ndarray) -> None:
        """Go on from ``(frames, samples, audio_time)``: ``replay`` (C, samples - replay_from(audio_time))
        float32 is the input audio to encode again."""
        start = replay_from(self.audio_time)
        if replay.shape != (self.spec.audio_channels, self.samples - start):
            raise ValueError(
                f"replay audio must be {(self.spec.audio_channels, self.samples - start)}, got {replay.shape}")
        replay = np.array(replay, dtype=np.float32, order="C")
        self._history.end = start
        self._history.add(replay)
        self._join(replay)

    def encode(self, frames: np.ndarray, audio: np.ndarray, *, opens_gop: bool, more: bool = False,
               abort: Optional[threading.Event] = None) -> Optional[Fragment]:
        """frames (T, H, W, 3) uint8 RGB, audio (C, n) float32 -> their fragment (raises Aborted when
        ``abort`` is set half-way). ``more``: the chunk goes on in the next call (its frames given as they are
        drawn, its audio with its last part): None until the call that ends it, which returns the fragment
        of all its parts, the one a single call with them all would."""
        part = self._part
        if part is None:
            if opens_gop and not self._fresh:
                self._restart()
            self._fresh = False
            part = self._part = _Part(first=self.frames, audio_time=self.audio_time, opens_gop=opens_gop)
        for rgb in frames:
            if abort is not None and abort.is_set():
                raise Aborted
            frame = to_yuv420p(rgb, self._scratch)
            frame.pts = self.frames
            if self.frames == part.first and part.opens_gop:
                frame.pict_type = av.video.frame.PictureType.I  # with forced-idr=1: an IDR frame
            self.frames += 1
            part.video += self._video_samples(self._video.encode(frame))
        if more:
            assert not audio.shape[1], "a chunk's audio comes with its last part"
            return None
        self._part = None
        self._fifo_write(audio)
        self._history.add(audio)
        pcm_at = self.samples
        self.samples += audio.shape[1]
        last = frames[-1].copy() if len(frames) else None  # a copy: a view would keep the whole chunk alive
        return Fragment(part.video, self._encode_audio(final=False), part.first, part.audio_time, part.opens_gop,
                        last, audio, pcm_at)

    def finish(self, *, at_gop_start: bool) -> Fragment:
        """Everything the encoders still hold. ``at_gop_start``: the stream ends where a GOP would open
        (a resume point), so the tail is encoded by fresh encoders, as a resumed stream's would be."""
        assert self._part is None, "the last chunk was not ended"
        if at_gop_start and not self._fresh:
            self._restart()
        first, audio_time = self.frames, self.audio_time
        video = self._video_samples(self._video.encode(None))
        return Fragment(video, self._encode_audio(final=True), first, audio_time, False)

    def _restart(self) -> None:
        """Fresh encoders for a new GOP, started as a resumed stream starts them at this point."""
        left = self._video.encode(None)  # zero latency: nothing is held back
        assert not left, "x264 held frames back"
        self._video = open_video_encoder(self.spec)
        self._audio = open_audio_encoder(self.spec)
        self._fifo = av.AudioFifo()
        self._audio_pts = 0
        self._join(self._history.since(replay_from(self.audio_time)))

    def _join(self, replay: np.ndarray) -> None:
        """Feed a fresh AAC encoder the samples from ``replay_from(audio_time)`` on; drop its packets
        that were sent out already."""
        self._audio_skip = self.audio_time // AAC_FRAME - replay_from(self.audio_time) // AAC_FRAME
        self._fifo_write(replay)

    def _fifo_write(self, audio: np.ndarray) -> None:
        if audio.shape[1]:
            planar = av.AudioFrame.from_ndarray(audio, format="fltp", layout=self._audio.layout.name)
            planar.sample_rate = self.spec.audio_rate
            self._fifo.write(planar)

    def _video_samples(self, packets: list[av.Packet]) -> list[Sample]:
        return [Sample(annexb_to_avcc(bytes(p)), self.frame_duration, p.is_keyframe) for p in packets]

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
        samples = [Sample(bytes(p), int(p.duration or AAC_FRAME), True) for p in packets]
        self.audio_time += sum(s.duration for s in samples)
        return samples
