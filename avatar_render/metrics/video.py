"""Read a rendered video back one frame at a time, in constant memory."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import av
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.files.read import regular_file


@dataclass(frozen=True)
class VideoInfo:
    path: Path
    width: int
    height: int
    fps: Fraction
    frames_estimate: int | None  # from the container; the decoded count is the truth
    has_audio: bool


def probe_video(path: str | Path) -> VideoInfo:
    """Size, frame rate and whether there is an audio track; raises AvatarRenderError if unreadable."""
    path = Path(path)
    with _open(path) as container:
        stream = container.streams.video[0]
        ctx = stream.codec_context
        rate = stream.average_rate or stream.guessed_rate
        if not rate or not ctx.width or not ctx.height:
            raise AvatarRenderError(f"The video '{path}' has no usable frame rate or frame size.")
        return VideoInfo(
            path=path, width=ctx.width, height=ctx.height, fps=Fraction(rate),
            frames_estimate=stream.frames or None, has_audio=bool(container.streams.audio),
        )


def iter_frames(path: str | Path) -> Iterator[np.ndarray]:
    """Every frame of the first video stream, in order, as (H, W, 3) uint8 RGB; one at a time."""
    path = Path(path)
    with _open(path) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        try:
            for frame in container.decode(stream):
                yield frame.to_ndarray(format="rgb24")
        except av.FFmpegError as e:
            raise AvatarRenderError(f"The video '{path}' could not be decoded to its end ({e}).") from None


def _open(path: Path) -> av.container.InputContainer:
    regular_file(path, what="video", give="a video file", empty_ok=False)
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, ValueError):
        raise AvatarRenderError(f"'{path}' is not a video file that can be read.") from None
    if not container.streams.video:
        container.close()
        raise AvatarRenderError(f"'{path}' has no video stream.")
    return container
