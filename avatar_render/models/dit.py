"""The A2V diffusion transformer: Wan2.1 I2V + InfiniteTalk's audio projection and per-block audio
cross-attention. One class for the published 14B model and for the ``tiny`` test size."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from avatar_render.models.audio_proj import AudioProjection
from avatar_render.models.dit_blocks import (
    CrossKV,
    DiTBlock,
    Head,
    ImageEmbedding,
    Rope3D,
    linear_f32,
)
from avatar_render.models.grid import frames_in


@dataclass(frozen=True)
class DiTConfig:
    model_type: str = "i2v"
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512  # text tokens after zero padding
    in_dim: int = 36  # 16 noisy latent + 4 mask + 16 reference-condition channels
    dim: int = 5120
    ffn_dim: int = 13824
    freq_dim: int = 256
    text_dim: int = 4096  # umT5-XXL hidden size
    out_dim: int = 16
    num_heads: int = 40
    num_layers: int = 40
    eps: float = 1e-6
    clip_dim: int = 1280  # CLIP ViT-H/14 feature dim
    clip_tokens: int = 257  # tokens per reference image (informational; any count works)
    audio_window: int = 5  # video frames per audio window (t-2 .. t+2)
    audio_layers: int = 12  # wav2vec2-base transformer layers stacked (hidden_states[1:])
    audio_dim: int = 768  # wav2vec2-base hidden size
    audio_intermediate_dim: int = 512
    audio_context_tokens: int = 32  # audio tokens per latent frame
    audio_output_dim: int = 768
    vae_scale: int = 4  # video frames per latent frame (temporal VAE stride)
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @classmethod
    def infinitetalk_14b(cls) -> "DiTConfig":
        """The published InfiniteTalk / MultiTalk / FlashTalk DiT (Wan2.1-I2V-14B + audio)."""
        return cls()

    @classmethod
    def tiny(cls) -> "DiTConfig":
        """Same architecture, about 61k parameters: for tests and CI."""
        return cls(
            dim=32, ffn_dim=64, freq_dim=32, text_dim=16, num_heads=2, num_layers=2, clip_dim=24,
            audio_layers=3, audio_dim=8, audio_intermediate_dim=16, audio_context_tokens=4, audio_output_dim=12,
        )

    def video_frames(self, latent_frames: int) -> int:
        """Video frames (and audio feature rows) that ``latent_frames`` latents stand for."""
        return frames_in(latent_frames, self.vae_scale)


@dataclass(frozen=True)
class AttentionSP:
    """How one attention op of every block behaves under Ulysses sequence parallelism.

    ``q``/``kv``: ``"tokens"`` = arrives split along the token dim across ranks (needs all-to-all to
    heads before the op and back after); ``"replicated"`` = every rank has all of it (slice heads
    locally if the queries were exchanged)."""

    module: str  # attribute of DiTBlock whose ``op`` is wrapped
    q: str
    kv: str


@dataclass(frozen=True)
class SequenceParallelPlan:
    """Where tokens are split and gathered; applied from outside by hooks and ``op`` wrappers.

    The residual stream between blocks is ``x: [B, L, C]`` with tokens frame-major. Split it on
    ``token_dim`` at the input of ``split_input_of`` and gather it at the input of
    ``gather_input_of``; split the outputs of ``split_outputs_of`` (module name -> token dim: the RoPE
    tables ``(cos, sin)``, each [L, head_dim/2]) the same way. L must be padded to a multiple of
    the world size (padded keys would then need masking in self-attention)."""

    token_dim: int
    split_input_of: str
    gather_input_of: str
    split_outputs_of: tuple[tuple[str, int], ...]
    attention: tuple[AttentionSP, ...]


# Parameter names kept in float32 when the rest is cast down (small tensors computed in float32).
FP32_PARAMS = re.compile(r"(modulation$|norm[^.]*\.(weight|bias)$|^time_embedding\.|^time_projection\.|^head\.head\.|^img_emb\.proj\.[04]\.)")


def param_dtype(name: str, dtype: torch.dtype, *, keep_fp32: bool = True) -> torch.dtype:
    """The dtype a checkpoint tensor ``name`` is stored in when the model runs in ``dtype``."""
    if keep_fp32 and dtype.is_floating_point and FP32_PARAMS.search(name):
        return torch.float32
    return dtype


def sinusoidal_embedding(dim: int, t: Tensor) -> Tensor:
    """t: [B] -> [B, dim] float32 ([cos | sin], computed in float64 as the family does)."""
    half = dim // 2
    t64 = t.to(torch.float64)
    freqs = torch.pow(10000.0, -torch.arange(half, dtype=torch.float64, device=t.device) / half)
    angle = torch.outer(t64, freqs)
    return torch.cat([angle.cos(), angle.sin()], dim=1).float()


class WanAudioDiT(nn.Module):
    """Wan2.1 I2V diffusion transformer with InfiniteTalk audio conditioning.

    State-dict names and shapes equal the published Wan-native checkpoint merged with the
    InfiniteTalk audio-module file. Build on the meta device (``build_dit``) and materialise by
    loading (``checkpoints.load_dit``) or with ``materialize_random``.
    """

    sp_plan = SequenceParallelPlan(
        token_dim=1,
        split_input_of="blocks.0",
        gather_input_of="head",
        split_outputs_of=(("rope", 0),),
        attention=(
            AttentionSP("self_attn", q="tokens", kv="tokens"),  # Ulysses all-to-all of q, k, v
            AttentionSP("cross_attn", q="tokens", kv="replicated"),  # purely local: text/image k, v everywhere
            AttentionSP("audio_cross_attn", q="tokens", kv="replicated"),  # frame-local: needs whole frames -> exchange q
        ),
    )

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        c = config
        if c.model_type != "i2v":
            raise ValueError(f"model_type {c.model_type!r} is not supported (only 'i2v')")
        assert c.dim % c.num_heads == 0 and c.head_dim % 2 == 0
        assert c.patch_size[0] == 1, "audio tokens are per latent frame: no temporal patching"
        self.config = c
        self.patch_embedding = nn.Conv3d(c.in_dim, c.dim, kernel_size=c.patch_size, stride=c.patch_size)
        self.text_embedding = nn.Sequential(nn.Linear(c.text_dim, c.dim), nn.GELU(approximate="tanh"), nn.Linear(c.dim, c.dim))
        self.time_embedding = nn.Sequential(nn.Linear(c.freq_dim, c.dim), nn.SiLU(), nn.Linear(c.dim, c.dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(c.dim, 6 * c.dim))
        self.blocks = nn.ModuleList(
            DiTBlock(dim=c.dim, ffn_dim=c.ffn_dim, num_heads=c.num_heads, eps=c.eps, audio_dim=c.audio_output_dim)
            for _ in range(c.num_layers)
        )
        self.head = Head(c.dim, c.out_dim * math.prod(c.patch_size), c.eps)
        self.img_emb = ImageEmbedding(c.clip_dim, c.dim)
        self.audio_proj = AudioProjection(
            window=c.audio_window, vae_scale=c.vae_scale, layers=c.audio_layers, audio_dim=c.audio_dim,
            intermediate_dim=c.audio_intermediate_dim, output_dim=c.audio_output_dim,
            context_tokens=c.audio_context_tokens,
        )
        self.rope = Rope3D(c.head_dim, c.rope_theta)

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (that of the big matmuls)."""
        return self.patch_embedding.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embedding.weight.device

    def forward(self, x: Tensor, t: Tensor, context: Tensor | None, clip_fea: Tensor | None, audio: Tensor, *,
                cross_kv: tuple[CrossKV, ...] | None = None, keep_kv: bool = False) -> Tensor | tuple[Tensor, tuple[CrossKV, ...]]:
        """Predict the flow for one batch of latent video chunks.

        x:        [B, in_dim, F_lat, H_lat, W_lat]: channels = 16 noisy latents, 4 mask, 16 latents of
                  the reference condition (the family's I2V ``y``), in that order.
        t:        [B] (or [1], broadcast) timesteps in [0, 1000].
        context:  [B, L_text, text_dim], L_text <= text_len: umT5 encoder output trimmed to each
                  prompt's length; rows past a prompt's end must be zero (the model zero-pads to
                  text_len and, like the family, attends to the padding rows too).
        clip_fea: [B, 257, clip_dim] CLIP image features of the reference.
        audio:    [B, F_video, audio_window, audio_layers, audio_dim] with
                  F_video = 1 + vae_scale * (F_lat - 1): per video frame, the windowed wav2vec2
                  hidden states (see ``audio_proj``). Zeros = the "no audio" guidance pass.
        returns:  [B, out_dim, F_lat, H_lat, W_lat] float32 predicted flow (noise - x0).
        H_lat and W_lat must be multiples of the spatial patch size.
        cross_kv: every block's text/image keys and values from an earlier pass with the same context
                  and clip_fea (which are then not read: pass None); keep_kv: return them beside the flow.
        """
        c = self.config
        b, _, f_lat, h_lat, w_lat = x.shape
        if x.shape[1] != c.in_dim or h_lat % c.patch_size[1] or w_lat % c.patch_size[2] or f_lat % c.patch_size[0]:
            raise ValueError(f"x has shape {tuple(x.shape)}; expected [B, {c.in_dim}, F, H, W] divisible by {c.patch_size}")
        want_audio = (b, c.video_frames(f_lat), c.audio_window, c.audio_layers, c.audio_dim)
        if tuple(audio.shape) != want_audio:
            raise ValueError(f"audio has shape {tuple(audio.shape)}; expected {want_audio}")
        if cross_kv is None and context.shape[1] > c.text_len:
            raise ValueError(f"context has {context.shape[1]} tokens; at most {c.text_len} are supported")
        dtype, device = self.dtype, self.device

        tokens = self.patch_embedding(x.to(device=device, dtype=dtype))  # [B, C, f, h, w]
        grid = tuple(tokens.shape[2:])
        tokens = tokens.flatten(2).transpose(1, 2).contiguous()  # [B, L, C]
        rope = self.rope(grid, tokens.device)

        t = t.to(device).reshape(-1)
        t = t.expand(b) if t.numel() == 1 else t
        e = linear_f32(sinusoidal_embedding(c.freq_dim, t), self.time_embedding[0])
        e = linear_f32(torch.nn.functional.silu(e), self.time_embedding[2])  # [B, C] float32
        e0 = linear_f32(torch.nn.functional.silu(e), self.time_projection[1]).unflatten(1, (6, c.dim))

        text = image = None
        if cross_kv is None:  # (only the blocks' keys and values read the embedded text and image)
            pad = c.text_len - context.shape[1]
            text = torch.nn.functional.pad(context.to(device=device, dtype=dtype), (0, 0, 0, pad))
            text = self.text_embedding(text)  # [B, text_len, C]
            image = self.img_emb(clip_fea.to(device=device, dtype=dtype))  # [B, 257, C]
        audio_tokens = self.audio_proj(audio.to(device=device, dtype=dtype))  # [B, F_lat, N_audio, audio_output_dim]

        kept = []
        for i, block in enumerate(self.blocks):
            tokens, kv = block(tokens, e=e0, rope=rope, text=text, image=image, audio=audio_tokens,
                               kv=None if cross_kv is None else cross_kv[i])
            if keep_kv:
                kept.append(kv)
        out = self.unpatchify(self.head(tokens, e), grid)  # [B, L, prod(patch) * out_dim] float32 -> [B, C, F, H, W]
        return (out, tuple(kept)) if keep_kv else out

    def unpatchify(self, x: Tensor, grid: tuple[int, ...]) -> Tensor:
        """x: [B, f*h*w, pt*ph*pw*C] -> [B, C, f*pt, h*ph, w*pw]."""
        pt, ph, pw = self.config.patch_size
        f, h, w = grid
        x = x.reshape(x.shape[0], f, h, w, pt, ph, pw, self.config.out_dim)
        x = x.permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(x.shape[0], self.config.out_dim, f * pt, h * ph, w * pw)


def build_dit(config: DiTConfig, *, device: str | torch.device = "meta") -> WanAudioDiT:
    """Construct the model; on the meta device (the default) no memory is allocated."""
    with torch.device(device):
        return WanAudioDiT(config)


@torch.no_grad()
def materialize_random(
    model: WanAudioDiT, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0
) -> WanAudioDiT:
    """Give a (meta) model random weights in place: for the tiny backend and speed runs.

    Matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.1), norm weights ~ 1 + N(0, 0.1), modulation
    ~ N(0, 1/dim); float32 islands stay float32. Reproducible for a seed on a given device.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in list(model.named_parameters()):
        mod_name, _, leaf = name.rpartition(".")
        target = param_dtype(name, dtype)
        t = torch.empty(p.shape, dtype=torch.float32, device=device)
        t.normal_(generator=gen)
        if name.endswith("modulation"):
            t /= p.shape[-1] ** 0.5
        elif p.ndim >= 2:
            t /= math.prod(p.shape[1:]) ** 0.5
        elif "norm" in name and leaf == "weight":
            t = 1 + 0.1 * t
        else:
            t *= 0.1
        model.get_submodule(mod_name)._parameters[leaf] = nn.Parameter(t.to(target), requires_grad=False)
    return model
