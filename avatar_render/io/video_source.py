"""A video reference, streamed: its frames decoded on demand by index, never the whole video.

``probe_source`` reads the container's packets once (no decoding) for every frame's presentation time;
``SourceTimeline`` maps each output frame to a source frame by time under a timing policy (so any
frame rate, and a variable one, is followed by its timestamps); ``SourceFrames`` decodes the frames a
chunk needs, seeking to the keyframe before them. What a frame holds depends only on its index, never
on what was decoded before, so a resumed render sees the same frames as an uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import Iterable, Iterator

import av
import numpy as np

from avatar_render.config import TIMINGS
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown

__all__ = ["TIMINGS", "SourceFrames", "SourceInfo", "SourceTimeline", "VideoReference", "probe_source"]
SEEK_AHEAD = 48  # a frame this far past the decoder's position is reached by decoding on, farther by a seek
_VFR_SPREAD = 1.5  # frame intervals more than this far apart (ratio): a variable frame rate


@dataclass(frozen=True, eq=False)
class SourceInfo:
    """What a video reference holds, from its packets."""

    path: Path
    width: int  # upright (rotation applied)
    height: int
    turns: int  # quarter turns counter-clockwise that make a decoded frame upright
    time_base: Fraction
    pts: np.ndarray  # (N,) int64 presentation times of the frames in order, in time_base units
    end_pts: int  # when the last frame ends
    variable_rate: bool  # the intervals between frames vary (handled: frames are found by time)

    @property
    def num_frames(self) -> int:
        return len(self.pts)

    @property
    def duration(self) -> Fraction:
        return (self.end_pts - int(self.pts[0])) * self.time_base

    @cached_property
    def offsets(self) -> np.ndarray:
        """(N,) int64 presentation times from the first frame's, in time_base units."""
        return self.pts - self.pts[0]

    @property
    def fps(self) -> float:
        """The average frame rate."""
        return self.num_frames / float(self.duration)


def probe_source(path: Path, *, max_pixels: int) -> SourceInfo:
    """Every frame's time from the container's packets (nothing decoded); one sentence if unusable."""
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, ValueError):
        raise AvatarRenderError(
            f"The reference video {shown(path)} cannot be opened; it is corrupt or not a video.") from None
    with container:
        if not container.streams.video:
            raise AvatarRenderError(f"The reference {shown(path)} has no video stream to take the face from.")
        stream = container.streams.video[0]
        ctx = stream.codec_context
        if ctx is None or not ctx.width or not ctx.height:
            raise AvatarRenderError(f"The reference video {shown(path)} has no frame size that can be read.")
        if ctx.width * ctx.height > max_pixels:
            raise AvatarRenderError(
                f"The reference {shown(path)} is {ctx.width}x{ctx.height} pixels, over the limit of {max_pixels:,}; "
                "downscale it first.")
        pts, durations = [], []
        try:
            for packet in container.demux(stream):
                if packet.pts is not None and packet.size:
                    pts.append(packet.pts)
                    durations.append(packet.duration or 0)
        except (av.FFmpegError, OSError, ValueError):
            pass  # a cut file: the packets read so far
        time_base = Fraction(stream.time_base)
        rotation = _rotation(container, stream)
    if not pts:
        raise AvatarRenderError(f"The reference video {shown(path)} has no frame that can be decoded.")
    order = np.argsort(np.asarray(pts, np.int64), kind="stable")
    times = np.asarray(pts, np.int64)[order]
    times = times[np.concatenate([[True], np.diff(times) > 0])]  # (a repeated timestamp is one frame)
    steps = np.diff(times)
    last = int(np.asarray(durations, np.int64)[order][-1]) or (int(np.median(steps)) if len(steps) else 0)
    if last <= 0:  # one frame and no duration: it lasts a 25th of a second
        last = max(1, round(Fraction(1, 25) / time_base))
    turns = round(rotation / 90) % 4
    width, height = (ctx.height, ctx.width) if turns % 2 else (ctx.width, ctx.height)
    variable = len(steps) > 1 and float(steps.max()) > _VFR_SPREAD * float(steps.min())
    return SourceInfo(path=path, width=width, height=height, turns=turns, time_base=time_base, pts=times,
                      end_pts=int(times[-1]) + last, variable_rate=variable)


def _rotation(container: av.container.InputContainer, stream: av.video.stream.VideoStream) -> float:
    """The display matrix's counter-clockwise angle, as phones record it, from the first frame (0 if none decodes)."""
    try:
        container.seek(0, stream=stream)
        for frame in container.decode(stream):
            return float(frame.rotation or 0)
    except (av.FFmpegError, OSError, ValueError):
        pass
    return 0.0


@dataclass(frozen=True, eq=False)
class SourceTimeline:
    """Which source frame plays under each output frame: by time, under a timing policy."""

    info: SourceInfo
    fps: Fraction  # output frame rate
    timing: str  # one of TIMINGS

    @property
    def frame_limit(self) -> int | None:
        """Output frames the video allows (trim), else None (as long as the audio)."""
        if self.timing != "trim":
            return None
        return max(1, math.ceil(self.info.duration * self.fps))

    def source_index(self, frame: int) -> int:
        """The source frame shown at output frame ``frame``: the one on screen at that time (exact, in the
        stream's ticks). ``loop`` plays the frames forwards, then backwards from the last but one to the
        second, each as long as it lasts forwards: no frame repeated at a turn, no jump."""
        info = self.info
        n = info.num_frames
        if n == 1:
            return 0
        times = info.offsets  # (N,) ticks from the first frame
        end = info.end_pts - int(info.pts[0])  # when the last frame ends
        tick = math.floor(Fraction(frame) / self.fps / info.time_base)
        if self.timing == "loop":
            period = 2 * end - int(times[1]) - (end - int(times[-1]))  # forwards, then frames N-2 .. 1
            u = tick % period
            if u >= end:  # backwards: frame i lasts [T[N-1] - T[i+1], T[N-1] - T[i]) after the end
                x = int(times[-1]) - (u - end)
                return int(np.searchsorted(times, x, side="left")) - 1
            tick = u
        elif tick >= end:  # hold (and trim, past its end)
            return n - 1
        return int(np.clip(np.searchsorted(times, tick, side="right") - 1, 0, n - 1))

    def indices(self, start: int, end: int) -> np.ndarray:
        """(end - start,) int64 source frames of output frames [start, end)."""
        return np.fromiter((self.source_index(f) for f in range(start, end)), np.int64, end - start)


class SourceFrames:
    """Decodes source frames by index, upright (H, W, 3) uint8 RGB. Reading on from where the decoder is
    continues it; anything before that, or far ahead, seeks to the keyframe at or before the first frame
    wanted. Holds one open decoder and no frames."""

    def __init__(self, info: SourceInfo) -> None:
        self.info = info
        self._container: av.container.InputContainer | None = None
        self._frames: Iterator[av.VideoFrame] | None = None
        self._next = 0  # index of the frame the open decoder gives next (a guess after a seek: checked by pts)
        self.seeks = 0

    def read(self, wanted: Iterable[int]) -> Iterator[tuple[int, np.ndarray]]:
        """(index, frame) for each distinct index in ``wanted``, in increasing order."""
        todo = sorted(set(int(i) for i in wanted))
        if not todo:
            return
        first = todo[0]
        if self._frames is None or first < self._next or first - self._next > SEEK_AHEAD:
            self._seek(first)
        pending = iter(todo)
        want = next(pending)
        rewound = False
        while True:
            index, frame = self._decode_next()
            if index is None:
                raise AvatarRenderError(
                    f"The reference video {shown(self.info.path)} has no decodable frame {want} "
                    f"of {self.info.num_frames}; it is cut or corrupt (re-encode it).")
            if index < want:
                continue
            if index > want:  # the seek landed past it (a container without a usable index): from the start
                if rewound:
                    raise AvatarRenderError(
                        f"The reference video {shown(self.info.path)} lost frame {want} when decoded; re-encode it.")
                self._seek(0)
                rewound = True
                continue
            yield index, self._upright(frame)
            want = next(pending, None)
            if want is None:
                return

    def _seek(self, index: int) -> None:
        self.close()
        self._container = av.open(str(self.info.path))
        stream = self._container.streams.video[0]
        stream.thread_type = "AUTO"
        if index > 0:
            self._container.seek(int(self.info.pts[index]), stream=stream, backward=True, any_frame=False)
            self.seeks += 1
        self._frames = self._container.decode(stream)
        self._next = 0

    def _decode_next(self) -> tuple[int | None, av.VideoFrame | None]:
        assert self._frames is not None
        try:
            for frame in self._frames:
                if frame.pts is None:
                    continue
                i = int(np.searchsorted(self.info.pts, frame.pts, side="left"))
                if i >= self.info.num_frames or int(self.info.pts[i]) != frame.pts:
                    continue  # (a frame the packets did not list)
                self._next = i + 1
                return i, frame
        except (av.FFmpegError, OSError, ValueError):
            pass
        return None, None

    def _upright(self, frame: av.VideoFrame) -> np.ndarray:
        rgb = frame.to_ndarray(format="rgb24")  # (h, w, 3)
        turns = self.info.turns
        return np.ascontiguousarray(np.rot90(rgb, turns)) if turns else rgb

    def close(self) -> None:
        if self._container is not None:
            self._container.close()
        self._container, self._frames = None, None


@dataclass(frozen=True, eq=False)
class VideoReference:
    """A video reference as the init stages receive it: what it holds and when each of its frames plays."""

    timeline: SourceTimeline

    @property
    def info(self) -> SourceInfo:
        return self.timeline.info

    def frames(self) -> SourceFrames:
        """A decoder of its own (each stage that reads frames opens one)."""
        return SourceFrames(self.info)
