"""The Wan2.1 VAE with its decoder fine-tuned to decode at 2x (spacepxl/Wan2.1-VAE-upscale2x).

The architecture is the Wan2.1 VAE with a decoder head that emits 12 channels instead of 3; a pixel
shuffle turns each pixel's 12 values into 2x2 RGB pixels. Everything else (the latent space, its
normalisation, the causal cache, the streaming decoder) is the Wan VAE's, so it is a drop-in for the
streaming decode at about the same cost. The file holds the whole VAE (the encoder unchanged).

Published layouts, both read (``locate_vae2x``):

    Wan2.1_VAE_upscale2x_imageonly_real_v1.safetensors                  Wan-native names (as Wan2.1_VAE.pth)
    diffusers/Wan2.1_VAE_upscale2x_imageonly_real_v1/config.json         diffusers AutoencoderKLWan, out_channels 12
    diffusers/Wan2.1_VAE_upscale2x_imageonly_real_v1/diffusion_pytorch_model.safetensors
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from avatar_render.errors import AvatarRenderError
from avatar_render.models.vae import VaeConfig, WanVae
from avatar_render.models.weights import read_json

NATIVE_FILE = "Wan2.1_VAE_upscale2x_imageonly_real_v1.safetensors"
DIFFUSERS_DIR = "diffusers/Wan2.1_VAE_upscale2x_imageonly_real_v1"
UPSCALE = 2
OUT_CHANNELS = 3 * UPSCALE**2


def vae2x_config(size: str) -> VaeConfig:
    """The 2x decoder's architecture: the Wan2.1 VAE's (tiny: 4 base channels) with a 12-channel head."""
    base = VaeConfig.tiny() if size == "tiny" else VaeConfig()
    return dataclasses.replace(base, out_channels=OUT_CHANNELS)


def locate_vae2x(path: Path) -> Path:
    """The file or folder ``WanVae`` reads: ``path`` itself (the .safetensors, or a diffusers folder),
    or inside a download folder the Wan-native file, else the diffusers subfolder."""
    path = Path(path)
    if path.is_file() or (path / "config.json").is_file():
        return path
    if (path / NATIVE_FILE).is_file() or not (path / DIFFUSERS_DIR / "config.json").is_file():
        return path / NATIVE_FILE
    return path / DIFFUSERS_DIR


def pixel_shuffle_video(frames: torch.Tensor) -> torch.Tensor:
    """[B, 3 s^2, T, H, W] -> [B, 3, T, s H, s W], the channel order of ``torch.nn.functional.pixel_shuffle``."""
    b, c, t, h, w = frames.shape
    s = math.isqrt(c // 3)
    assert 3 * s * s == c, c
    x = F.pixel_shuffle(frames.permute(0, 2, 1, 3, 4).reshape(b * t, c, h, w), s)
    return x.reshape(b, t, 3, s * h, s * w).permute(0, 2, 1, 3, 4)


class Upscale2xVae(WanVae):
    """The 2x decoder. ``path``: see ``locate_vae2x``; None = random weights."""

    name = "vae2x"
    what = "Wan2.1 VAE 2x decoder"

    def __init__(self, config: VaeConfig = vae2x_config("14b"), *, path: Path | str | None = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> None:
        located = locate_vae2x(Path(path)) if path is not None else None
        super().__init__(config, path=located, device=device, dtype=dtype, seed=seed)

    def _load(self) -> None:
        if self.layout == "diffusers" and not self.missing_files():
            channels = read_json(self._files[0]).get("out_channels", 3)
            if channels != OUT_CHANNELS:
                raise AvatarRenderError(
                    f"{self._files[0]} describes a VAE whose decoder emits {channels} channels, not the "
                    f"{OUT_CHANNELS} of the 2x decoder (model.vae2x must point at Wan2.1-VAE-upscale2x)."
                )
        super()._load()

    @property
    def upscale(self) -> int:
        return math.isqrt(self.config.out_channels // 3)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """normalised latents [B, 16, n, h, w] -> frames [B, 3, 1 + 4 (n - 1), 16h, 16w] in [-1, 1] float32."""
        return pixel_shuffle_video(super().decode(latents))
