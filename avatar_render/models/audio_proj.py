"""InfiniteTalk's audio projection: windowed wav2vec2 features per video frame -> audio context
tokens per latent frame.

Input layout (what the audio encoder stage produces for one chunk):
``audio: [B, F_video, window, layers, audio_dim]``: for every video frame, the wav2vec2 hidden
states of all transformer layers (``hidden_states[1:]``, interpolated to the video frame rate) at
frames ``t-2 .. t+2`` (window 5, clamped at the ends). ``F_video = 1 + vae_scale * (F_lat - 1)``:
the causal VAE maps the first frame to the first latent and each further group of ``vae_scale``
frames to one latent.

Per latent frame the family packs a fixed-size slice of that: the first latent gets its frame's
full window; a later latent (frames ``a, b, c, d``) gets frame a's window up to the centre, the
centre of b and c, and frame d's window from the centre on: ``window + vae_scale - 1`` rows in all.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from avatar_render.models.dit_blocks import AffineLayerNorm


def pack_audio_windows(audio: Tensor, *, vae_scale: int) -> tuple[Tensor, Tensor]:
    """audio: [B, F_video, W, Ly, Ca] -> (first [B, 1, W, Ly, Ca], rest [B, F_lat-1, W+vae_scale-1, Ly, Ca])."""
    b, f_video, window, layers, ca = audio.shape
    assert (f_video - 1) % vae_scale == 0 and vae_scale >= 2
    mid = window // 2
    groups = audio[:, 1:].reshape(b, (f_video - 1) // vae_scale, vae_scale, window, layers, ca)
    rest = torch.cat(
        [
            groups[:, :, 0, : mid + 1],  # first frame of the group: left half of its window + centre
            groups[:, :, 1:-1, mid],  # inner frames: centre only
            groups[:, :, -1, mid:],  # last frame: centre + right half
        ],
        dim=2,
    )
    return audio[:, :1], rest


class AudioProjection(nn.Module):
    """Two first-layer MLP branches (first latent / later latents), a shared second layer, then a
    projection to ``context_tokens`` tokens of ``output_dim`` per latent frame and a LayerNorm."""

    def __init__(
        self,
        *,
        window: int,
        vae_scale: int,
        layers: int,
        audio_dim: int,
        intermediate_dim: int,
        output_dim: int,
        context_tokens: int,
    ) -> None:
        super().__init__()
        self.vae_scale = vae_scale
        self.context_tokens = context_tokens
        self.output_dim = output_dim
        self.proj1 = nn.Linear(window * layers * audio_dim, intermediate_dim)
        self.proj1_vf = nn.Linear((window + vae_scale - 1) * layers * audio_dim, intermediate_dim)
        self.proj2 = nn.Linear(intermediate_dim, intermediate_dim)
        self.proj3 = nn.Linear(intermediate_dim, context_tokens * output_dim)
        self.norm = AffineLayerNorm(output_dim)

    def forward(self, audio: Tensor) -> Tensor:
        """audio: [B, F_video, W, Ly, Ca] -> tokens [B, F_lat, context_tokens, output_dim]."""
        first, rest = pack_audio_windows(audio, vae_scale=self.vae_scale)
        h = torch.cat(
            [torch.relu(self.proj1(first.flatten(2))), torch.relu(self.proj1_vf(rest.flatten(2)))], dim=1
        )  # [B, F_lat, intermediate]
        h = self.proj3(torch.relu(self.proj2(h)))
        return self.norm(h.unflatten(2, (self.context_tokens, self.output_dim)))
