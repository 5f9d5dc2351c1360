"""The SR stage: decoded frames of the published stream -> frames at the output size, in frame order.

It sits in the publishing slot after the decode (``StageChain``), not in the generation chain: the
generation chain runs in schedule order (N0, N1, I0, N2, ...), while a streaming SR model must see
the frames in time order, as the causal decode does. Two kinds:

* ``vae2x``: the decode before it was the 2x decoder; this stage only scales its frames to the output
  size (cover, crop). Nothing is re-synthesised, so there is nothing to guard.
* ``swiftvr``: the one-step model restores the low-res frames at the output size (``SwiftVRStream``,
  its state carried across chunks and seams in ``SRCarry``), then the face guard (``sr_guard``) keeps
  the mouth on the fidelity path, matches colour to the low-res frame and falls back to the fidelity
  path for a chunk whose face drifts from the reference.
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from avatar_render.infinitetalk.sr_guard import FaceGuard, GuardSettings, TrackState, log
from avatar_render.infinitetalk.stage_io import Decoded, ModelStatic
from avatar_render.infinitetalk.stages import to_host, to_host_later
from avatar_render.models.sr.geometry import Cover
from avatar_render.models.sr.swiftvr_stream import SwiftState, SwiftVRStream
from avatar_render.pipeline.module import Module
from avatar_render.pipeline.stage import Stage
from avatar_render.pipeline.types import Frames

_TRACKING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sr-face-track")


@dataclass(frozen=True)
class SRCarry:
    model: Optional[SwiftState]  # the one-step model's stream state; None for the resize-only path
    track: TrackState
    chunks: int = 0  # chunks restored so far
    fallbacks: int = 0  # of them, published from the fidelity path
    lowest: float = math.inf  # lowest face similarity of a chunk's output so far


def to_unit(frames: torch.Tensor) -> torch.Tensor:
    """[1, 3, T, H, W] in [-1, 1] -> [T, 3, H, W] in [0, 1]."""
    return ((frames[0].transpose(0, 1) + 1) / 2).clamp(0, 1)


def unit_to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """[T, 3, H, W] in [0, 1] -> [T, H, W, 3] uint8 where the frames are."""
    return (frames.clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def upscale(frames: torch.Tensor, cover: Cover) -> torch.Tensor:
    """[T, 3, h, w] in [0, 1] -> [T, 3, H, W]: bicubic up, area down."""
    mode = "bicubic" if cover.scale > 1 else "area"
    return cover.apply(frames.float(), mode=mode).clamp(0, 1)


class SRStage(Stage[Decoded, Frames]):
    name = "sr"
    input_type = Decoded
    output_type = Frames

    def __init__(self, *, size: tuple[int, int], stream: Optional[SwiftVRStream] = None,
                 guard: Optional[GuardSettings] = None, writes: bool = True) -> None:
        self.size = size  # (width, height) of the output
        self.stream = stream  # None: scale the decoded frames only
        self.guard = guard or GuardSettings()
        self._face: Optional[tuple[ModelStatic, Cover, FaceGuard]] = None  # the request's guard, built once
        self.writes = writes  # False in the processes of a launch that do not write: no frames to the host

    def modules(self) -> tuple[Module, ...]:
        return () if self.stream is None else (self.stream.reae, self.stream.dit)

    def init_carry(self, static: ModelStatic) -> SRCarry:
        return SRCarry(model=None if self.stream is None else self.stream.start(), track=TrackState())

    def saved_carry(self, carry: SRCarry) -> SRCarry:
        return carry if self.stream is None else dataclasses.replace(carry, model=self.stream.saved(carry.model))

    def restored_carry(self, saved: SRCarry, static: ModelStatic) -> SRCarry:
        return saved if self.stream is None else dataclasses.replace(saved, model=self.stream.restored(saved.model))

    def run(self, x: Decoded, *, static: ModelStatic, carry: SRCarry) -> tuple[Frames, SRCarry]:
        lowres = to_unit(x.pixels)  # [T, 3, h, w]
        cover = Cover(src=(lowres.shape[-1], lowres.shape[-2]), dst=self.size)
        if self.stream is None:
            return self._frames(x.start, upscale(lowres, cover)), carry
        lowres_u8 = unit_to_uint8(lowres)  # the model reads 8-bit frames, as from a video file
        face = self._guard(static, cover)
        host = to_host_later(lowres_u8)
        tracked = _TRACKING.submit(lambda: face.track(host(), carry.track))  # on the host, while the SR runs
        sr, model = self.stream.step(lowres_u8, carry.model)
        lowres_up = upscale(lowres_u8.permute(0, 3, 1, 2).float() / 255, cover)
        if x.fidelity is not None:
            f = to_unit(x.fidelity)
            fidelity = upscale(f, Cover(src=(f.shape[-1], f.shape[-2]), dst=self.size))
        else:
            fidelity = lowres_up
        shifts, track = tracked.result()
        result = face.apply(sr.to(fidelity), fidelity, lowres_up, shifts)
        log.info("sr: frames [%d, %d): face similarity %.3f (fidelity path %.3f)%s", x.start, x.end, result.similarity,
                 result.fidelity_similarity, "; published from the fidelity path" if result.fell_back else "")
        if result.fell_back:
            log.warning("SR frames %d-%d: the face drifted from the reference (similarity %.3f against %.3f "
                        "without SR); those frames come from the fidelity path.", x.start, x.end - 1,
                        result.similarity, result.fidelity_similarity)
        lowest = carry.lowest if math.isnan(result.similarity) else min(carry.lowest, result.similarity)
        carry = SRCarry(model=model, track=track, chunks=carry.chunks + 1,
                        fallbacks=carry.fallbacks + result.fell_back, lowest=lowest)
        return self._frames(x.start, result.frames), carry

    def _guard(self, static: ModelStatic, cover: Cover) -> FaceGuard:
        """The face guard of this request (its reference descriptor and tracker are the same every chunk)."""
        if self._face is None or self._face[0] is not static or self._face[1] != cover:
            self._face = static, cover, FaceGuard(reference=static.reference, layout=static.layout, cover=cover,
                                                  settings=self.guard)
        return self._face[2]

    def _frames(self, start: int, frames: torch.Tensor) -> Frames:
        if not self.writes:
            return Frames(start=start, frames=np.empty((frames.shape[0], 0, 0, 3), np.uint8))
        return Frames(start=start, frames=to_host(unit_to_uint8(frames)))
