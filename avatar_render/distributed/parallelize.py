"""FSDP2 applied from outside a model: each transformer block, then the root.

Each block is its own all-gather unit, resharded after its forward, and asks for the next
``prefetch`` blocks' all-gathers as soon as it starts, so that block n+1's gather (and, with the
offload policy, its host-to-device copy) overlaps block n's compute. With ``offload`` the shards
live in host memory (pinned when a GPU exists) between forwards.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from avatar_render.distributed.device_mesh import Mesh


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
