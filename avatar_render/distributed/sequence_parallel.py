"""Ulysses sequence parallelism, applied from a model's ``sp_plan`` (data on the model class).

Between ``split_input_of`` and ``gather_input_of`` each process of the ``sp`` group holds 1/P of
the tokens of the residual stream ``x: [B, L, C]`` (padded to a multiple of P with zero tokens).
Attention needs all tokens, so each attention ``op`` named by the plan is wrapped:

* q, k, v split on tokens: all-to-all to [B, L, H/P, D] (all tokens, 1/P of the heads), the
  padding dropped, the op, and all-to-all back to [B, L/P, H, D].
* q split on tokens, k/v replicated with one key set for all queries ([B, Lk, H, D]): each query is
  independent, so the op runs locally.
* q split on tokens, k/v replicated and grouped per frame ([B, F, N, H, D]): the op needs whole
  frames of queries, so q is exchanged as above and k/v are cut to this process's heads.

The padding never reaches an attention op, so the result equals the unsplit model up to float
rounding. Only forward pre-hooks, forward hooks and ``op`` attributes are touched.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from avatar_render.errors import AvatarRenderError


@dataclass
class _Tokens:
    length: int = 0  # tokens before padding, of the forward in progress


def _pad_to(x: Tensor, dim: int, multiple: int) -> Tensor:
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    pad = [0, 0] * (x.ndim - 1 - dim % x.ndim) + [0, extra]
    return F.pad(x, pad)


def _local(x: Tensor, dim: int, size: int, rank: int) -> Tensor:
    """This process's 1/size of ``x`` along ``dim`` (zero-padded to a multiple of size)."""
    return _pad_to(x, dim, size).chunk(size, dim=dim)[rank].contiguous()


def tokens_to_heads(x: Tensor, group) -> Tensor:
    """[B, L/P, H, D] on each process -> [B, L, H/P, D] (process j's tokens come j-th)."""
    p = dist.get_world_size(group)
    b, tokens, h, d = x.shape
    send = x.reshape(b, tokens, p, h // p, d).permute(2, 0, 1, 3, 4).contiguous()  # [P, B, L/P, H/P, D]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[j]: process j's tokens, my heads
    return recv.permute(1, 0, 2, 3, 4).reshape(b, p * tokens, h // p, d)


def heads_to_tokens(x: Tensor, group) -> Tensor:
    """[B, L, H/P, D] -> [B, L/P, H, D]: the inverse of ``tokens_to_heads``."""
    p = dist.get_world_size(group)
    b, lp, h, d = x.shape
    send = x.reshape(b, p, lp // p, h, d).permute(1, 0, 2, 3, 4).contiguous()  # [P, B, L/P, H/P, D]
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)  # recv[j]: my tokens, process j's heads
    return recv.permute(1, 2, 0, 3, 4).reshape(b, lp // p, p * h, d)


class UlyssesOp:
    """A drop-in for an attention ``op(q, k, v)`` whose queries arrive split on tokens."""

    def __init__(self, op, *, kv: str, group, tokens: _Tokens) -> None:
        self.op, self.kv, self.group, self.tokens = op, kv, group, tokens
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)

    def _exchange(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n = self.tokens.length
        out = self.op(tokens_to_heads(q, self.group)[:, :n], k, v)  # [B, L, H/P, D]
        return heads_to_tokens(_pad_to(out, 1, self.size), self.group)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if self.kv == "tokens":
            n = self.tokens.length
            k, v = (tokens_to_heads(t, self.group)[:, :n] for t in (k, v))
            return self._exchange(q, k, v)
        if k.ndim == 4:  # one key set for every query: the op is token-local
            return self.op(q, k, v)
        h = k.shape[-2] // self.size  # keys grouped per frame: exchange q, keep this process's heads
        heads = slice(self.rank * h, (self.rank + 1) * h)
        return self._exchange(q, k[..., heads, :], v[..., heads, :])


def apply_sequence_parallel(model: nn.Module, plan, group, *, heads: int) -> None:
    """Install ``plan`` (a ``SequenceParallelPlan``) on ``model`` for the process group ``group``."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if heads % size:
        raise AvatarRenderError(f"Config key 'dist.sp' ({size}) must divide the DiT's {heads} attention heads.")
    tokens = _Tokens()
    dim = plan.token_dim

    def split_input(module, args, kwargs):
        x = args[0]
        tokens.length = x.shape[dim]
        return (_local(x, dim, size, rank), *args[1:]), kwargs

    def gather_input(module, args, kwargs):
        x = args[0]
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        whole = torch.cat(parts, dim=dim).narrow(dim, 0, tokens.length)
        return (whole, *args[1:]), kwargs

    model.get_submodule(plan.split_input_of).register_forward_pre_hook(split_input, with_kwargs=True)
    model.get_submodule(plan.gather_input_of).register_forward_pre_hook(gather_input, with_kwargs=True)
    for name, out_dim in plan.split_outputs_of:
        def split_output(module, args, output, out_dim=out_dim):
            return tuple(_local(t, out_dim, size, rank) for t in output)

        model.get_submodule(name).register_forward_hook(split_output)
    for block in model.blocks:
        for a in plan.attention:
            if a.q != "tokens":
                raise AvatarRenderError(f"The sequence-parallel plan's {a.module} takes q as {a.q!r}, which is not supported.")
            attn = block.get_submodule(a.module)
            attn.op = UlyssesOp(attn.op, kv=a.kv, group=group, tokens=tokens)
