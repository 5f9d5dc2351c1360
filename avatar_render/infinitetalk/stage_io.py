"""Dataclasses passed between the stages of the diffusion backend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from avatar_render.face.layout import FaceLayout
from avatar_render.models.grid import latent_of, latents_for
from avatar_render.models.vae import CausalCache
from avatar_render.pipeline.types import (
    ChunkInput,
    Generated,
    Segment,
    StaticConditioning,
)


@dataclass(frozen=True)
class ModelStatic(StaticConditioning):
    """Computed once per request and kept to the end."""

    cond: torch.Tensor  # [1, 20, n, h, w]: 4 first-frame mask channels + VAE latents of (reference, zeros...)
    ref_latent: torch.Tensor  # [16, 1, h, w]: the reference frame as the first latent of N0
    clip_fea: torch.Tensor  # [1, 257, clip_dim]: CLIP features of the reference
    text: torch.Tensor  # [1, L, text_dim]: the prompt
    text_null: torch.Tensor  # [1, L, text_dim]: the negative prompt
    ref_mean: torch.Tensor  # [3]: per-channel mean of the reference in [-1, 1], for the colour guard
    ref_std: torch.Tensor  # [3]
    reference: np.ndarray  # (h, w, 3) uint8: the reference fitted to the generation size (the SR stage's face guard)
    layout: FaceLayout  # the reference's face, eyes and mouth in those pixels (a plausible box when none was found)
    video: Any = None  # a video reference (video_cond.VideoCondition): each chunk conditioned on its source frame


@dataclass(frozen=True)
class AudioWindow:
    chunk: ChunkInput
    first_frame: int  # video frame of the first model frame (context frames included)
    features: torch.Tensor  # [1, F_model, window, layers, dim]: audio features per model frame
    noise: torch.Tensor  # [16, n_model, h, w]
    # a video reference: this chunk's own I2V condition and CLIP features (the source frame at its start);
    # None: the request's (static) ones
    cond: Optional[torch.Tensor] = None  # [1, 20, n, h, w]
    clip_fea: Optional[torch.Tensor] = None  # [1, 257, clip_dim]


@dataclass(frozen=True)
class LatentSegment(Segment):
    latents: torch.Tensor  # [16, n, h, w]: final latents of frames [start, end) (the last may reach past end)


@dataclass(frozen=True)
class LatentChunk(Generated):
    latents: torch.Tensor  # [16, n, h, w]: global latents [first_latent, first_latent + n)
    first_latent: int

    def segment(self, start: int, end: int) -> LatentSegment:
        a, b = latents_for(start, end)
        return LatentSegment(start=start, end=end,
                             latents=self.latents[:, a - self.first_latent : b - self.first_latent].clone())

    def anchor(self, frame: int) -> torch.Tensor:
        i = latent_of(frame) - self.first_latent
        return self.latents[:, i : i + 1].clone()  # [16, 1, h, w]


@dataclass(frozen=True)
class DecodeCarry:
    """The causal decoder's cache, and the latents it was last fed: a checkpoint keeps those (a few MB)
    instead of the cache (GBs of features at 480p) and the cache is rebuilt from them on resume."""

    cache: Optional[CausalCache]  # None in a checkpoint
    recent: torch.Tensor  # [16, r, h, w] float32 on the CPU: the last ``StreamingDecoder.window()`` latents
    decoded: int  # latents decoded so far


@dataclass(frozen=True)
class Decoded:
    """Frames [start, end) of the published stream decoded and kept on the compute device, for the SR stage."""

    start: int
    end: int
    pixels: torch.Tensor  # [1, 3, T, H, W] float32 in [-1, 1], T = end - start, at the decoder's output size
    latents: torch.Tensor  # [16, n, h, w]: what they were decoded from (a second decoder may decode them again)
    fidelity: Optional[torch.Tensor] = None  # [1, 3, T, H2, W2]: the same frames by the 2x decoder
    #   (model.sr_fidelity=vae2x)
