"""SwiftVR's one-step DiT: diffusers' ``WanTransformer3DModel`` (the Wan2.2-TI2V-5B shape, weights in
the published diffusers layout), run the way SwiftVR runs it.

* One forward at the flow's end point (timestep 1000) predicts the degradation's velocity; the
  restored latents are ``lq - velocity``. The text condition is a fixed, precomputed embedding of the
  empty prompt (``prompt_embedding.safetensors``).
* Self-attention is windowed (``windows.py``) with the window size of the checkpoint's config
  (``self_attn_window_hw``, 16 x 16 tokens), shifted on odd layers. A window at least as large as the
  token grid is full attention, so a config without ``enable_swa`` runs the plain model.
* Chunks of a stream are placed in time by a RoPE offset: chunk k's first latent sits at the number
  of latents before it. The rotary angles are computed for the positions asked for, so the offset
  may grow past the table diffusers precomputes (1024 positions).

``SwiftVRDiT`` wraps the diffusers model (``.transformer``) so that the chunk forward is its own
``forward``: FSDP2 and the block streamer apply to it from outside like to the A2V DiT.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from diffusers import WanTransformer3DModel
from torch import nn

from avatar_render.models.sr.windows import window_plan, windowed_attention

TIMESTEP = 1000.0  # the one step, at the fully degraded end of the flow
FP32_ISLANDS = ("time_embedder", "scale_shift_table", "norm1", "norm2", "norm3")  # as diffusers keeps them


@dataclass(frozen=True)
class SwiftDiTConfig:
    """``WanTransformer3DModel`` arguments plus SwiftVR's window settings (its config.json has both)."""

    model: dict[str, Any] = field(default_factory=lambda: dict(
        patch_size=(1, 2, 2), num_attention_heads=24, attention_head_dim=128, in_channels=48, out_channels=48,
        text_dim=4096, freq_dim=256, ffn_dim=14336, num_layers=30, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None, rope_max_seq_len=1024))
    window: tuple[int, int] = (16, 16)  # tokens; (0, 0) = full attention
    prompt_tokens: int = 512  # length of the empty-prompt embedding (random weights; a loaded one has its own)

    @classmethod
    def tiny(cls) -> SwiftDiTConfig:
        return cls(model=dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=8,
                              out_channels=8, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
                              qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None, added_kv_proj_dim=None,
                              rope_max_seq_len=1024), window=(2, 2), prompt_tokens=8)

    @classmethod
    def from_json(cls, cfg: dict) -> SwiftDiTConfig:
        """From a diffusers config.json (SwiftVR's adds ``enable_swa`` and ``self_attn_window_hw``)."""
        base = cls()
        known = set(base.model)
        model = {**base.model, **{k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in known}}
        window = tuple(cfg.get("self_attn_window_hw", base.window)) if cfg.get("enable_swa", True) else (0, 0)
        return dataclasses.replace(base, model=model, window=window, prompt_tokens=0)  # (the file says)

    @property
    def channels(self) -> int:
        return self.model["in_channels"]

    @property
    def text_dim(self) -> int:
        return self.model["text_dim"]


def fp32_island(name: str) -> bool:
    return any(part in FP32_ISLANDS for part in name.split("."))


class WindowedSelfAttention:
    """A diffusers attention processor for ``attn1``: q/k/v, RMS norms, RoPE, then windowed attention
    on the grid ``SwiftVRDiT.forward`` set for this pass (plain attention when the window is (0, 0))."""

    def __init__(self, owner: "SwiftVRDiT", *, shifted: bool) -> None:
        self.owner = owner
        self.shifted = shifted

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        assert encoder_hidden_states is None and attention_mask is None, "self-attention only"
        heads = attn.heads
        q = attn.norm_q(attn.to_q(hidden_states)).unflatten(2, (heads, -1))  # [B, N, heads, D]
        k = attn.norm_k(attn.to_k(hidden_states)).unflatten(2, (heads, -1))
        v = attn.to_v(hidden_states).unflatten(2, (heads, -1))
        if rotary_emb is not None:
            q, k = rotate(q, *rotary_emb), rotate(k, *rotary_emb)
        grid, window = self.owner.grid, self.owner.config.window
        if window[0] <= 0:
            window = grid[1:]
        out = windowed_attention(q, k, v, window_plan(grid, window, self.shifted))
        out = attn.to_out[0](out.flatten(2, 3).type_as(hidden_states))
        return attn.to_out[1](out)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on interleaved pairs (Wan's convention). x [B, N, heads, D]; cos, sin [1, N, 1, D]."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2).type_as(x)


def rope_angles(dims: tuple[int, int, int], grid: tuple[int, int, int], t_offset: int, *, theta: float = 10000.0,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [1, T H W, 1, D] of Wan's 3-D RoPE for a grid whose first frame sits at ``t_offset``
    (D = sum of the time, height and width parts, each a repeated pair per frequency)."""
    parts_cos, parts_sin = [], []
    t, h, w = grid
    for axis, (dim, positions) in enumerate(zip(dims, (torch.arange(t_offset, t_offset + t), torch.arange(h),
                                                       torch.arange(w)))):
        freqs = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim)
        angle = torch.outer(positions.to(torch.float64), freqs).repeat_interleave(2, dim=1)  # [n, dim]
        shape = [1, 1, 1, dim]
        shape[axis] = angle.shape[0]
        parts_cos.append(angle.cos().view(shape).expand(t, h, w, dim))
        parts_sin.append(angle.sin().view(shape).expand(t, h, w, dim))
    cos = torch.cat(parts_cos, dim=-1).reshape(1, t * h * w, 1, -1)
    sin = torch.cat(parts_sin, dim=-1).reshape(1, t * h * w, 1, -1)
    return cos.to(device, torch.float32), sin.to(device, torch.float32)


class SwiftVRDiT(nn.Module):
    """lq latents of one chunk -> their velocity, in one pass."""

    def __init__(self, config: SwiftDiTConfig) -> None:
        super().__init__()
        self.config = config
        self.transformer = WanTransformer3DModel(**config.model)
        self.grid: tuple[int, int, int] = (0, 0, 0)  # the token grid of the pass under way (read by the processors)
        for i, block in enumerate(self.transformer.blocks):
            block.attn1.set_processor(WindowedSelfAttention(self, shifted=i % 2 == 1))

    @property
    def blocks(self) -> nn.ModuleList:
        return self.transformer.blocks

    def forward(self, lq: torch.Tensor, prompt: torch.Tensor, t_offset: int = 0) -> torch.Tensor:
        """lq [B, C, F, H, W], prompt [B, L, text_dim] -> velocity [B, C, F, H, W] (float32).
        ``t_offset``: the stream position of the chunk's first latent."""
        tr = self.transformer
        p_t, p_h, p_w = tr.config.patch_size
        b, _, f, h, w = lq.shape
        self.grid = grid = (f // p_t, h // p_h, w // p_w)
        rope = tr.rope
        cos, sin = rope_angles((rope.t_dim, rope.h_dim, rope.w_dim), grid, t_offset, device=lq.device)
        x = tr.patch_embedding(lq.to(tr.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2).contiguous()
        t = torch.full((b,), TIMESTEP, device=lq.device)
        temb, proj, text, _ = tr.condition_embedder(t, prompt.to(x.dtype), None)
        proj = proj.unflatten(1, (6, -1))
        for block in tr.blocks:
            x = block(x, text, proj, (cos, sin))
        shift, scale = (tr.scale_shift_table.to(temb.device) + temb.unsqueeze(1)).chunk(2, dim=1)
        x = (tr.norm_out(x.float()) * (1 + scale) + shift).type_as(x)
        x = tr.proj_out(x)  # [B, N, C p_t p_h p_w]
        x = x.reshape(b, *grid, p_t, p_h, p_w, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(b, -1, f, h, w).float()
