"""How this backend's networks are split or streamed, decided here and applied from outside them by
``distributed``: the DiT (sequence parallel over heads, then FSDP2 per block), the umT5 text encoder (FSDP2
per block), and the pinned-host block stream of a DiT in one process."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional

import torch
from torch import nn

from avatar_render.config import DistConfig
from avatar_render.distributed.device_mesh import Mesh
from avatar_render.distributed.parallelize import shard
from avatar_render.distributed.sequence_parallel import apply_sequence_parallel
from avatar_render.distributed.streaming import BlockStreamer
from avatar_render.models.weights import StreamPlan


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


def block_stream(ahead: int) -> Optional[StreamPlan]:
    """Blocks in pinned host memory, each copied to the device ``ahead`` blocks before its forward (0: none)."""
    return partial(BlockStreamer, ahead=ahead) if ahead > 0 else None
