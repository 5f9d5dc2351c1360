"""A video reference for the diffusion backend, as the family dubs a video: every chunk is conditioned on
the source frame at its own time (the I2V first-frame latents and the CLIP features of that frame), while
its motion frames come from the previous chunk as for a photo.

The frame is fitted to the generation size with the crop of the video's first frame (as the family
centre-crops every frame alike) and found by the chunk's start alone (``SourceTimeline``), so a resumed
render conditions each chunk on the same frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from avatar_render.face.fit import fit_to_frame
from avatar_render.io.video_source import SourceFrames, VideoReference
from avatar_render.models.grid import frames_in
from avatar_render.models.image_encoder import ImageEncoder
from avatar_render.models.vae import WanVae


def to_pixels(image: np.ndarray) -> torch.Tensor:
    """(H, W, 3) uint8 -> [1, 3, 1, H, W] float32 in [-1, 1]."""
    return torch.from_numpy(image).permute(2, 0, 1)[None, :, None].float() / 127.5 - 1.0


def first_frame_condition(pixels: torch.Tensor, *, vae: WanVae, image: ImageEncoder,
                          max_latents: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The I2V condition of one frame [1, 3, 1, H, W]: ([1, 20, n, h, w] mask + latents of (frame, zeros...),
    [1, 257, clip_dim] CLIP features), on the host."""
    with torch.no_grad():
        frames = torch.cat([pixels, pixels.new_zeros(1, 3, frames_in(max_latents) - 1, *pixels.shape[-2:])], dim=2)
        latents = vae.encode(frames).cpu()  # [1, 16, n, h, w]
        mask = torch.zeros(1, 4, latents.shape[2], *latents.shape[-2:])
        mask[:, :, 0] = 1.0  # the I2V mask marks the first frame only
        clip = image.encode(pixels[:, :, 0]).cpu()
    return torch.cat([mask, latents], dim=1), clip


@dataclass(eq=False)
class VideoCondition:
    """The source video as the context stage reads it (its decoder's position changes, never a frame)."""

    video: VideoReference
    reader: SourceFrames
    size: tuple[int, int]  # (width, height) the model generates at
    focus: tuple[float, float, float, float] | None  # the first frame's face, source pixels: the crop of every frame
    max_latents: int

    def condition(self, frame: int, *, vae: WanVae, image: ImageEncoder) -> tuple[torch.Tensor, torch.Tensor]:
        """(cond, clip features) of the source frame under output frame ``frame``."""
        index = self.video.timeline.source_index(frame)
        ((_, source),) = tuple(self.reader.read([index]))
        fitted, _ = fit_to_frame(source, *self.size, focus=self.focus)
        return first_frame_condition(to_pixels(fitted), vae=vae, image=image, max_latents=self.max_latents)
