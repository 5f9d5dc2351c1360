"""Building blocks of the Wan2.1 I2V transformer with per-block audio cross-attention.

Parameter names follow the published Wan-native checkpoint layout (``self_attn.q``, ``norm3``,
``audio_cross_attn.kv_linear``, ...), so a state dict loads without renaming.

Float32 islands (as in the published code): every LayerNorm/RMSNorm, the 6-way modulation and the
residual updates it gates, and the output head are computed in float32 whatever the parameter
dtype; the big matmuls and attention run in the parameter dtype.

Attention runs through torch SDPA. Each attention module calls its ``op`` attribute, a plain
function of ``[B, L, H, D]`` tensors, so a sequence-parallel wrapper can replace it from outside
(see ``WanAudioDiT.sp_plan``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def layer_norm_f32(x: Tensor, eps: float, weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """LayerNorm over the last dim in float32; returns float32."""
    w = None if weight is None else weight.float()
    b = None if bias is None else bias.float()
    return F.layer_norm(x.float(), (x.shape[-1],), w, b, eps)


def linear_f32(x: Tensor, layer: nn.Linear) -> Tensor:
    """``layer(x)`` computed in float32 whatever the parameter dtype."""
    bias = None if layer.bias is None else layer.bias.float()
    return F.linear(x.float(), layer.weight.float(), bias)


class RMSNorm(nn.Module):
    """RMS norm across the whole feature dim (all heads together), float32 inside."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


class AffineLayerNorm(nn.LayerNorm):
    """LayerNorm with weight and bias, computed in float32, returned in the input dtype."""

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm_f32(x, self.eps, self.weight, self.bias).to(x.dtype)


# ---- attention ops: q [B, Lq, H, D], k/v [B, Lk, H, D] -> [B, Lq, H, D] -------------------------

CrossKV = tuple[Tensor, Tensor, Tensor, Tensor]  # one block's text k, v and image k, v: [B, L, H, D] each


def full_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Every query attends to every key (no mask)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2)


def frame_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Frame-local attention. q: [B, F*S, H, D] (tokens frame-major); k, v: [B, F, N, H, D].

    The queries of latent frame f attend only to the N audio tokens of frame f.
    """
    b, tokens, h, d = q.shape
    f, n = k.shape[1], k.shape[2]
    qf = q.reshape(b * f, tokens // f, h, d)
    out = full_attention(qf, k.reshape(b * f, n, h, d), v.reshape(b * f, n, h, d))
    return out.reshape(b, tokens, h, d)


# ---- rotary position embedding ---------------------------------------------------------------


def rope_split(head_dim: int) -> tuple[int, int, int]:
    """Rotary pairs given to the (frame, height, width) axes: the family's 44/42/42 split of 128."""
    c = head_dim // 2
    return c - 2 * (c // 3), c // 3, c // 3


class Rope3D(nn.Module):
    """3D RoPE tables for a token grid. No parameters; a module so that its output can be split.

    forward(grid=(f, h, w), device) -> (cos, sin), each [f*h*w, head_dim // 2] float32, tokens in
    frame-major, then row, then column order (the order of ``patch_embedding(x).flatten(2)``).
    """

    def __init__(self, head_dim: int, theta: float = 10000.0) -> None:
        super().__init__()
        assert head_dim % 2 == 0
        self.head_dim = head_dim
        self.theta = theta

    def forward(self, grid: tuple[int, int, int], device: torch.device) -> tuple[Tensor, Tensor]:
        angles = []
        for axis, (n, pairs) in enumerate(zip(grid, rope_split(self.head_dim))):
            inv = 1.0 / self.theta ** (torch.arange(pairs, dtype=torch.float64, device=device) * 2 / (2 * pairs))
            a = torch.outer(torch.arange(n, dtype=torch.float64, device=device), inv)  # [n, pairs]
            shape = [1, 1, 1, pairs]
            shape[axis] = n
            angles.append(a.view(shape).expand(*grid, pairs))
        ang = torch.cat(angles, dim=-1).reshape(-1, self.head_dim // 2)
        return ang.cos().float(), ang.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent channel pairs of x: [B, L, H, D] by the per-token angles; float32 out."""
    xf = x.float().unflatten(-1, (-1, 2))
    x1, x2 = xf[..., 0], xf[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)


# ---- attention modules -------------------------------------------------------------------------


class _Projections(nn.Module):
    """q, k, v, o projections with RMS-normed q and k: the layout both Wan attentions share."""

    def __init__(self, dim: int, num_heads: int, eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, eps)
        self.norm_k = RMSNorm(dim, eps)
        self.op = full_attention


class SelfAttention(_Projections):
    """Self-attention over all video tokens with RMS-normed q/k and 3D RoPE."""

    def forward(self, x: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """x: [B, L, C] -> [B, L, C]."""
        heads = (self.num_heads, -1)
        q = apply_rope(self.norm_q(self.q(x)).unflatten(2, heads), *rope).to(x.dtype)
        k = apply_rope(self.norm_k(self.k(x)).unflatten(2, heads), *rope).to(x.dtype)
        v = self.v(x).unflatten(2, heads)
        return self.o(self.op(q, k, v).flatten(2))


class ImageTextCrossAttention(_Projections):
    """Cross-attention to the text tokens plus, with separate k/v, the CLIP image tokens (I2V)."""

    def __init__(self, dim: int, num_heads: int, eps: float) -> None:
        super().__init__(dim, num_heads, eps)
        self.k_img = nn.Linear(dim, dim)
        self.v_img = nn.Linear(dim, dim)
        self.norm_k_img = RMSNorm(dim, eps)

    def static_kv(self, text: Tensor, image: Tensor) -> CrossKV:
        """The keys and values of the text and image tokens: [B, L_text or L_img, H, D] each. They depend
        on the request's static conditioning only, so a request may compute them once (``forward(kv=...)``)."""
        heads = (self.num_heads, -1)
        return (self.norm_k(self.k(text)).unflatten(2, heads), self.v(text).unflatten(2, heads),
                self.norm_k_img(self.k_img(image)).unflatten(2, heads), self.v_img(image).unflatten(2, heads))

    def forward(self, x: Tensor, text: Tensor | None, image: Tensor | None, kv: CrossKV | None = None) -> tuple[Tensor, CrossKV]:
        """x: [B, L, C], text: [B, L_text, C], image: [B, L_img, C] (embedded) -> ([B, L, C], their keys
        and values); with ``kv`` (from an earlier pass of the same request) text and image are not read."""
        heads = (self.num_heads, -1)
        kv = self.static_kv(text, image) if kv is None else kv
        k, v, k_img, v_img = kv
        q = self.norm_q(self.q(x)).unflatten(2, heads)
        out = self.op(q, k, v)
        out_img = self.op(q, k_img, v_img)
        return self.o((out + out_img).flatten(2)), kv


class AudioCrossAttention(nn.Module):
    """InfiniteTalk's audio cross-attention (single speaker): each latent frame's video tokens attend
    to that frame's audio context tokens. No q/k norm, no positional encoding."""

    def __init__(self, dim: int, audio_dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q_linear = nn.Linear(dim, dim)
        self.kv_linear = nn.Linear(audio_dim, 2 * dim)  # output: [k | v]
        self.proj = nn.Linear(dim, dim)
        self.op = frame_attention

    def forward(self, x: Tensor, audio: Tensor) -> Tensor:
        """x: [B, F*S, C] (normed); audio: [B, F, N_audio, audio_dim] -> [B, F*S, C]."""
        q = self.q_linear(x).unflatten(2, (self.num_heads, -1))
        kv = self.kv_linear(audio).unflatten(3, (2, self.num_heads, -1))  # [B, F, N, 2, H, D]
        out = self.op(q, kv[:, :, :, 0], kv[:, :, :, 1])
        return self.proj(out.flatten(2))


# ---- transformer block and head ----------------------------------------------------------------


class DiTBlock(nn.Module):
    """One Wan2.1 I2V block plus InfiniteTalk's audio cross-attention between the text/image
    cross-attention and the FFN. ``norm1``/``norm2`` of the original have no weights (functional here)."""

    def __init__(self, *, dim: int, ffn_dim: int, num_heads: int, eps: float, audio_dim: int) -> None:
        super().__init__()
        self.eps = eps
        self.self_attn = SelfAttention(dim, num_heads, eps)
        self.norm3 = AffineLayerNorm(dim, eps=eps)
        self.cross_attn = ImageTextCrossAttention(dim, num_heads, eps)
        self.norm_x = AffineLayerNorm(dim, eps=eps)
        self.audio_cross_attn = AudioCrossAttention(dim, audio_dim, num_heads)
        self.ffn = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(ffn_dim, dim))
        self.modulation = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(
        self,
        x: Tensor,
        *,
        e: Tensor,
        rope: tuple[Tensor, Tensor],
        text: Tensor,
        image: Tensor,
        audio: Tensor,
        kv: CrossKV | None = None,
    ) -> tuple[Tensor, CrossKV]:
        """x: [B, L, C] (param dtype); e: [B, 6, C] float32 time modulation -> ([B, L, C], the
        cross-attention's keys and values: given as ``kv``, text and image are not read)."""
        dtype = x.dtype
        shift, scale, gate, c_shift, c_scale, c_gate = (self.modulation.float() + e).chunk(6, dim=1)
        h = (layer_norm_f32(x, self.eps) * (1 + scale) + shift).to(dtype)
        x = (x.float() + self.self_attn(h, rope).float() * gate).to(dtype)
        out, kv = self.cross_attn(self.norm3(x), text, image, kv)
        x = x + out
        x = x + self.audio_cross_attn(self.norm_x(x), audio)
        h = (layer_norm_f32(x, self.eps) * (1 + c_scale) + c_shift).to(dtype)
        return (x.float() + self.ffn(h).float() * c_gate).to(dtype), kv


class Head(nn.Module):
    """Output head: modulated LayerNorm + linear to patch pixels, float32 inside and out."""

    def __init__(self, dim: int, out_features: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.head = nn.Linear(dim, out_features)
        self.modulation = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)

    def forward(self, x: Tensor, e: Tensor) -> Tensor:
        """x: [B, L, C]; e: [B, C] float32 time embedding -> [B, L, out_features] float32."""
        shift, scale = (self.modulation.float() + e.float().unsqueeze(1)).chunk(2, dim=1)
        return linear_f32(layer_norm_f32(x, self.eps) * (1 + scale) + shift, self.head)


class ImageEmbedding(nn.Module):
    """CLIP image features -> model dim (``img_emb.proj``: LN, Linear, GELU, Linear, LN)."""

    def __init__(self, in_dim: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(
            AffineLayerNorm(in_dim, eps=1e-5), nn.Linear(in_dim, in_dim), nn.GELU(), nn.Linear(in_dim, dim),
            AffineLayerNorm(dim, eps=1e-5),
        )

    def forward(self, clip_fea: Tensor) -> Tensor:
        return self.proj(clip_fea)
