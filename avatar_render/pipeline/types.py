"""Dataclasses that flow between the pipeline and its stages, common to every backend."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from avatar_render.pipeline.schedule import ChunkPlan


@dataclass(frozen=True)
class RequestInput:
    """What the init stage turns into the static conditioning of a request."""

    reference: np.ndarray  # (H, W, 3) uint8 RGB, as loaded
    reference_path: Path
    width: int
    height: int
    seed: int
    # a video reference streamed (io.video_source.VideoReference: frames by output time), None for an image;
    # ``reference`` is then its first frame
    video: Any = None
    audio_path: Path | None = None  # the audio file, when the audio is one (not a stream)


@dataclass(frozen=True)
class StaticConditioning:
    """Base of every backend's static conditioning: computed once, kept for the whole request."""

    face_detected: bool  # False when the face position came from a fallback
    face_note: str = field(default="", kw_only=True)  # several faces: which one is rendered, how to pick another
    notes: tuple[str, ...] = field(default=(), kw_only=True)  # what else the user should know of the set-up


@dataclass(frozen=True)
class ChunkInput:
    plan: ChunkPlan
    fps: Fraction
    audio: np.ndarray  # (n,) float32 mono at audio_rate over [start/fps - pad, end/fps + pad)
    audio_rate: int
    audio_pad_s: float
    anchors: tuple[Any, ...]  # I chunks: the generated state at plan.anchors; N chunks: ()
    seed: int


@dataclass(frozen=True)
class Segment:
    """Final generated state of frames [start, end), ready to decode."""

    start: int
    end: int

    def piece(self, start: int, end: int) -> Segment:
        """Frames [start, end) of this segment, decoded on their own to the same frames (a pipeline with
        ``decode_piece_frames`` decodes its segments a piece at a time)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be decoded in pieces")


@dataclass(frozen=True)
class Generated:
    """Output of the generation chain for one plan entry, frames [plan.start, plan.end)."""

    plan: ChunkPlan

    @abstractmethod
    def segment(self, start: int, end: int) -> Segment:
        """The part of this chunk covering frames [start, end)."""

    @abstractmethod
    def anchor(self, frame: int) -> Any:
        """The state of one frame that a later I chunk pins itself to."""


@dataclass(frozen=True)
class Frames:
    start: int
    frames: np.ndarray  # (T, H, W, 3) uint8 RGB


@dataclass(frozen=True)
class Published:
    """Frames that are final, with the audio that plays under them."""

    plan: ChunkPlan  # the chunk whose completion made them final
    start: int
    frames: np.ndarray  # (T, H, W, 3) uint8
    audio: np.ndarray  # (C, n) float32 at the output audio rate
    # Frames [start, end) of the segment that starts at ``segment_start``: all of it, or a piece when it is
    # published in pieces (``stream(pieces=True)``), with ``more`` pieces of it to follow. The segment's audio,
    # all of it, comes with its last piece (the pieces before it have none).
    segment_start: int | None = None  # None: the segment that starts at ``start``
    more: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.frames)

    @property
    def whole_start(self) -> int:
        """The first frame of the segment this is (a piece of)."""
        return self.start if self.segment_start is None else self.segment_start
