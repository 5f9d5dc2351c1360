"""FSDP2 applied from outside a model: each transformer block, then the root.

Each block is its own all-gather unit, resharded after its forward, and asks for the next
``prefetch`` blocks' all-gathers as soon as it starts, so that block n+1's gather (and, with the
offload policy, its host-to-device copy) overlaps block n's compute. With ``offload`` the shards
live in host memory (pinned when a GPU exists) between forwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from avatar_render.config import DistConfig
from avatar_render.distributed.mesh import Mesh
from avatar_render.distributed.sequence_parallel import apply_sequence_parallel


def shard(net: nn.Module, blocks: Sequence[nn.Module], mesh: Mesh, *, offload: bool = False, prefetch: int = 1) -> None:
    """Shard ``net``'s parameters over the mesh's ``fsdp`` axis, in place."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    policy = CPUOffloadPolicy(pin_memory=mesh.device.type == "cuda") if offload else OffloadPolicy()
    kw = dict(mesh=mesh.axis("fsdp"), reshard_after_forward=True, offload_policy=policy)
    for block in blocks:
        fully_shard(block, **kw)
    fully_shard(net, **kw)
    if prefetch:
        for i, block in enumerate(blocks[:-1]):
            block.set_modules_to_forward_prefetch(list(blocks[i + 1 : i + 1 + prefetch]))


def local_numel(net: nn.Module) -> tuple[int, int]:
    """(elements this process holds, elements of the whole model) over ``net``'s parameters."""
    from torch.distributed.tensor import DTensor

    mine = total = 0
    for p in net.parameters():
        total += p.numel()
        mine += p.to_local().numel() if isinstance(p, DTensor) else p.numel()
    return mine, total


@dataclass(frozen=True)
class DiTPlan:
    """What to do to the DiT on this mesh (``apply``, on the meta-device or the loaded model) and,
    when it shards the parameters, where this process keeps its shards (``home``)."""

    apply: Callable[[nn.Module], None]
    home: Optional[torch.device]  # None: not sharded (every process holds the whole DiT)


def dit_plan(dist_cfg: DistConfig, mesh: Mesh) -> Optional[DiTPlan]:
    """What to do to the DiT on this mesh (None in a single process)."""
    if not mesh.distributed:
        return None
    offload = dist_cfg.offload.get("dit") == "offloaded"

    def apply(net: nn.Module) -> None:
        if mesh.sp > 1:
            apply_sequence_parallel(net, net.sp_plan, mesh.group("sp"), heads=net.config.num_heads)
        if dist_cfg.fsdp:
            shard(net, list(net.blocks), mesh, offload=offload, prefetch=dist_cfg.prefetch_blocks)

    home = (torch.device("cpu") if offload else mesh.device) if dist_cfg.fsdp else None
    return DiTPlan(apply=apply, home=home)


def text_plan(dist_cfg: DistConfig, mesh: Mesh) -> Optional[Callable[[nn.Module], None]]:
    """Shard the umT5 text encoder like the DiT (each block, then the root) when ``dist.fsdp``: it runs
    once per request, and afterwards each process keeps 1/N of its 5.7 B parameters instead of all."""
    if not mesh.distributed or not dist_cfg.fsdp:
        return None
    return lambda net: shard(net, list(net.encoder.block), mesh, prefetch=dist_cfg.prefetch_blocks)


def local_piece(param: torch.Tensor, full: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(this process's local tensor of the sharded parameter ``param``, the same piece of ``full``),
    or None when this process holds none of it. ``param`` is a DTensor sharded on one dimension
    (FSDP2 splits with ``torch.chunk``); ``full`` has the parameter's whole shape."""
    (placement,) = param.placements
    mesh = param.device_mesh
    pieces = full.chunk(mesh.size(), dim=placement.dim)
    i = mesh.get_local_rank()
    local = param.to_local()  # a view of the shard's storage
    if i >= len(pieces) or not local.numel():
        return None
    return local, pieces[i]
