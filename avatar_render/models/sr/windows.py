"""Shifted-window self-attention without masks, as SwiftVR's DiT runs it (its "MFSWA").

The token grid (T, H, W) is covered by windows of (all T) x wh x ww tokens. Along each spatial axis
the window starts are ``k * win - shift`` clamped into the grid (``shift`` = half a window on the odd
layers, 0 on the even ones), duplicates removed, and a start dropped when its two neighbours already
cover what it would. Windows overlap near the edges instead of being padded or masked, so each one is
a dense block for one attention call. Every token takes its output from one window holding it: the
first one on unshifted layers, the last one on shifted layers. A window at least as large as the grid
is plain full attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F


def axis_starts(size: int, win: int, *, shifted: bool) -> tuple[int, ...]:
    """Window starts along one axis of ``size`` tokens."""
    if size <= win:
        return (0,)
    shift = win // 2 if shifted else 0
    count = -(-size // win) + 2
    starts = sorted({min(max(k * win - shift, 0), size - win) for k in range(count)})
    if len(starts) <= 2:
        return tuple(starts)
    inner = [s for prev, s, nxt in zip(starts, starts[1:], starts[2:]) if nxt > prev + win]
    return (starts[0], *inner, starts[-1])


def _owners(size: int, win: int, starts: tuple[int, ...], *, first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position along an axis: (index of the window it takes its output from, offset inside it)."""
    window = torch.empty(size, dtype=torch.long)
    order = range(len(starts) - 1, -1, -1) if first else range(len(starts))
    for i in order:  # later assignments win
        window[starts[i] : starts[i] + win] = i
    offset = torch.arange(size) - torch.tensor(starts)[window]
    return window, offset


@dataclass(frozen=True)
class WindowPlan:
    """Where the tokens of a (T, H, W) grid go: ``gather`` [Nw * L] token indices, window by window
    (window-major, then t, h, w), and ``owner`` [T H W] the position in that list each token's output
    comes from."""

    gather: torch.Tensor
    owner: torch.Tensor
    num_windows: int
    window_len: int


@lru_cache(maxsize=64)
def window_plan(grid: tuple[int, int, int], window: tuple[int, int], shifted: bool) -> WindowPlan:
    t, h, w = grid
    wh, ww = min(window[0], h), min(window[1], w)
    hs, ws = axis_starts(h, wh, shifted=shifted), axis_starts(w, ww, shifted=shifted)
    hi = torch.tensor(hs)[:, None] + torch.arange(wh)  # [nh, wh]
    wi = torch.tensor(ws)[:, None] + torch.arange(ww)  # [nw, ww]
    ti = torch.arange(t)
    # [nh, nw, t, wh, ww] -> flat token index t H W + h W + w
    idx = ti[None, None, :, None, None] * (h * w) + hi[:, None, None, :, None] * w + wi[None, :, None, None, :]
    length = t * wh * ww
    oh, dh = _owners(h, wh, hs, first=not shifted)
    ow, dw = _owners(w, ww, ws, first=not shifted)
    window_of = oh[:, None] * len(ws) + ow[None, :]  # [H, W]
    inside = dh[:, None] * ww + dw[None, :]  # [H, W]
    owner = window_of[None] * length + ti[:, None, None] * (wh * ww) + inside[None]  # [T, H, W]
    return WindowPlan(gather=idx.reshape(-1), owner=owner.reshape(-1), num_windows=len(hs) * len(ws), window_len=length)


def windowed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: WindowPlan) -> torch.Tensor:
    """q, k, v: [B, N, heads, D] over the plan's grid (N = T H W) -> [B, N, heads, D]."""
    b, _, heads, d = q.shape
    gather, owner = plan.gather.to(q.device), plan.owner.to(q.device)

    def split(x: torch.Tensor) -> torch.Tensor:  # -> [B Nw, heads, L, D]
        x = x.index_select(1, gather).view(b * plan.num_windows, plan.window_len, heads, d)
        return x.transpose(1, 2)

    out = F.scaled_dot_product_attention(split(q), split(k), split(v))  # [B Nw, heads, L, D]
    out = out.transpose(1, 2).reshape(b, plan.num_windows * plan.window_len, heads, d)
    return out.index_select(1, owner)
