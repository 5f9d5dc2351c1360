"""SwiftVR's restoration-aware autoencoder (ReAE), in the layout of its published ``reae.safetensors``.

A TAEHV-style causal autoencoder between pixels and the one-step DiT's latents (48 channels):
pixels are pixel-unshuffled 2x, the encoder halves the size three times and pools time 4x, the
decoder grows both back. Temporal state lives in two kinds of layers only:

* ``MemBlock``: a residual block that sees the current frame next to the previous one (zeros before
  the first frame), so it carries the previous frame's input;
* ``TPool``: mixes groups of ``stride`` consecutive frames into one, so it carries an unfinished group.

``TGrow`` turns each frame into ``stride`` frames on its own. ``stream`` runs one of the two halves
over a piece of a video with that state carried in and out, which equals running it over the whole
video at once (``ReaeState``). The decoder's first latent yields 4 frames of which the first 3 are
padding (``ReaeConfig.trim``), as in the family's own code.

The module tree (and so the checkpoint names ``encoder.N.*``, ``decoder.N.*``) follows the published
checkpoint; shapes for the full size are in tests/fixtures/swiftvr_reae_keys.json.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ReaeConfig:
    image_channels: int = 3
    patch_size: int = 2  # pixels are pixel-unshuffled by this before the encoder
    latent_channels: int = 48
    encoder_channels: int = 64
    decoder_channels: tuple[int, int, int, int] = (512, 256, 128, 64)
    time_upscale: tuple[bool, bool] = (True, True)
    space_upscale: tuple[bool, bool, bool] = (True, True, True)

    @classmethod
    def tiny(cls) -> ReaeConfig:
        return cls(latent_channels=8, encoder_channels=8, decoder_channels=(16, 16, 8, 8))

    @property
    def frames_per_latent(self) -> int:
        return 4  # the encoder's pools: 2, 2, 1

    @property
    def spatial_factor(self) -> int:
        return self.patch_size * 8  # three stride-2 convolutions

    @property
    def trim(self) -> int:
        """Frames the decoder emits before the first real one."""
        return 2 ** sum(self.time_upscale) - 1


def _conv(n_in: int, n_out: int, *, stride: int = 1, bias: bool = True) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, stride=stride, padding=1, bias=bias)


class Clamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """Residual block on the current frame concatenated with the previous one."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(_conv(2 * n_in, n_out), nn.ReLU(inplace=True), _conv(n_out, n_out),
                                  nn.ReLU(inplace=True), _conv(n_out, n_out))
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        """x, past: [T, C, H, W] (past[i] is the frame before x[i])."""
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class TPool(nn.Module):
    """``stride`` consecutive frames -> one, by a 1x1 convolution over their stacked channels."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(channels * stride, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, C, H, W] (T a multiple of stride) -> [T / stride, C, H, W]."""
        t, c, h, w = x.shape
        return self.conv(x.reshape(t // self.stride, self.stride * c, h, w))


class TGrow(nn.Module):
    """One frame -> ``stride`` frames: a 1x1 projection (stride 1), or the frame repeated and mixed by a
    convolution along the repeats (stride 2)."""

    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        if stride == 1:
            self.proj = nn.Conv2d(channels, channels, 1, bias=False)
        else:
            self.conv3d = nn.Conv3d(channels, channels, (3, 1, 1), padding=(1, 0, 0), bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[T, C, H, W] -> [stride T, C, H, W]."""
        if self.stride == 1:
            return self.proj(x)
        t, c, h, w = x.shape
        y = self.conv3d(x[:, :, None].expand(t, c, self.stride, h, w))  # [T, C, stride, H, W]
        return y.transpose(1, 2).reshape(t * self.stride, c, h, w)


def _encoder(cfg: ReaeConfig) -> nn.Sequential:
    c = cfg.encoder_channels
    layers: list[nn.Module] = [_conv(cfg.image_channels * cfg.patch_size**2, c), nn.ReLU(inplace=True)]
    for pool in (2, 2, 1):
        layers += [TPool(c, pool), _conv(c, c, stride=2, bias=False), MemBlock(c, c), MemBlock(c, c), MemBlock(c, c)]
    return nn.Sequential(*layers, _conv(c, cfg.latent_channels))


def _decoder(cfg: ReaeConfig) -> nn.Sequential:
    n = cfg.decoder_channels
    grow = (1, *(2 if t else 1 for t in cfg.time_upscale))
    layers: list[nn.Module] = [Clamp(), _conv(cfg.latent_channels, n[0]), nn.ReLU(inplace=True)]
    for i in range(3):
        layers += [MemBlock(n[i], n[i]), MemBlock(n[i], n[i]), MemBlock(n[i], n[i]),
                   nn.Upsample(scale_factor=2 if cfg.space_upscale[i] else 1), TGrow(n[i], grow[i]),
                   _conv(n[i], n[i + 1], bias=False)]
    return nn.Sequential(*layers, nn.ReLU(inplace=True), _conv(n[3], cfg.image_channels * cfg.patch_size**2))


class Reae(nn.Module):
    def __init__(self, config: ReaeConfig = ReaeConfig()) -> None:
        super().__init__()
        self.config = config
        self.encoder = _encoder(config)
        self.decoder = _decoder(config)


@dataclass(frozen=True)
class ReaeState:
    """What one half of the ReAE carries between pieces of a video: per layer of its Sequential,
    a MemBlock's last input frame [1, C, H, W] or a TPool's unfinished group [r, C, H, W] (None: none)."""

    layers: tuple[Optional[torch.Tensor], ...]

    @classmethod
    def start(cls, seq: nn.Sequential) -> ReaeState:
        return cls(layers=(None,) * len(seq))


def stream(seq: nn.Sequential, x: torch.Tensor, state: ReaeState) -> tuple[Optional[torch.Tensor], ReaeState]:
    """Run ``seq`` over the next frames ``x`` [T, C, H, W] of a video: (output [T', C', H', W'] or None
    when nothing comes out yet, state after them)."""
    layers = list(state.layers)
    for i, layer in enumerate(seq):
        if isinstance(layer, MemBlock):
            prev = layers[i] if layers[i] is not None else torch.zeros_like(x[:1])
            layers[i] = x[-1:].clone()
            x = layer(x, torch.cat([prev.to(x), x[:-1]]))
        elif isinstance(layer, TPool):
            if layers[i] is not None:
                x = torch.cat([layers[i].to(x), x])
            whole = x.shape[0] // layer.stride * layer.stride
            layers[i] = x[whole:].clone() if whole < x.shape[0] else None
            if whole == 0:  # the rest of the network waits for a whole group
                return None, ReaeState(tuple(layers))
            x = layer(x[:whole])
        else:
            x = layer(x)
    return x, ReaeState(tuple(layers))


@torch.no_grad()
def encode(net: Reae, frames: torch.Tensor, state: ReaeState) -> tuple[Optional[torch.Tensor], ReaeState]:
    """frames [T, 3, H, W] in [0, 1] (H, W multiples of 16) -> (latents [T / 4, 48, H/16, W/16], state)."""
    return stream(net.encoder, F.pixel_unshuffle(frames, net.config.patch_size), state)


@torch.no_grad()
def decode(net: Reae, latents: torch.Tensor, state: ReaeState) -> tuple[torch.Tensor, ReaeState]:
    """latents [n, 48, h, w] -> (frames [4n, 3, 16h, 16w] in [0, 1], state). The stream's first 3 frames
    (``config.trim``) are padding."""
    x, state = stream(net.decoder, latents, state)
    assert x is not None, "the decoder has no pooling: every latent comes out"
    return F.pixel_shuffle(x.clamp(0, 1), net.config.patch_size), state
