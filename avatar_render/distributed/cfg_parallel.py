"""CFG parallelism: the guidance passes of one sampling step spread over the mesh's ``rep`` axis.

The ``rep`` replicas (``world / sp`` of them) would otherwise compute the same thing. Pass ``j`` of a
step runs on replica ``j % R``; every replica runs the same number of passes (``ceil(P / R)``, the
spare ones repeat pass 0 and are thrown away), so that the DiT's collectives (FSDP all-gathers over
every process, the sp group's all-to-alls) stay in step. One all-gather over ``rep`` then gives every
process every pass's flow. The flows are the ones a single process computes, pass for pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Optional

import torch

from avatar_render.distributed.device_mesh import Mesh

# How a step's guidance passes are evaluated: (pass names, run one pass) -> flow per pass (models.sampler).
Evaluate = Callable[[Sequence[str], Callable[[str], torch.Tensor]], dict[str, torch.Tensor]]


def my_passes(num_passes: int, replicas: int, index: int) -> list[int]:
    """The passes replica ``index`` runs, in order; past the last pass it repeats pass 0."""
    rounds = -(-num_passes // replicas)
    return [j if (j := index + replicas * i) < num_passes else 0 for i in range(rounds)]


def slot(j: int, replicas: int, num_passes: int) -> int:
    """Where pass ``j`` sits in the all-gathered stack (replica-major, ``rounds`` per replica)."""
    return (j % replicas) * -(-num_passes // replicas) + j // replicas


def spare_replicas(mesh: Mesh, num_passes: int, heads: int) -> Optional[str]:
    """A warning when the replicas outnumber the guidance passes they can run at once (``num_passes``:
    a step's passes with CFG parallelism, else 1): the spare ones only repeat work. With the
    ``dist.sp`` that would put those processes to work on every pass instead."""
    replicas = mesh.world // mesh.sp
    if replicas <= num_passes:
        return None
    better = [sp for sp in range(mesh.sp + 1, mesh.world + 1)
              if mesh.world % sp == 0 and heads % sp == 0 and mesh.world // sp <= num_passes]
    hint = f"; dist.sp={better[0]} would split each pass over {better[0]} processes instead" if better else ""
    return (f"{replicas} replicas (processes / dist.sp) can run {num_passes} guidance pass(es) at once, so "
            f"{replicas - num_passes} of them only repeat work{hint}.")


def split_passes(mesh: Mesh, serial: Evaluate) -> Evaluate:
    """The evaluation of a step's passes for this process (``serial`` when there is one replica)."""
    if not mesh.distributed or mesh.size("rep") == 1:
        return serial
    import torch.distributed as dist

    group, replicas = mesh.group("rep"), mesh.size("rep")
    index = mesh.axis("rep").get_local_rank()

    def evaluate(names: Sequence[str], run: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
        if len(names) == 1:
            return serial(names, run)
        mine = torch.stack([run(names[j]) for j in my_passes(len(names), replicas, index)])  # [rounds, C, F, H, W]
        everyone = [torch.empty_like(mine) for _ in range(replicas)]
        dist.all_gather(everyone, mine.contiguous(), group=group)
        stack = torch.cat(everyone)  # [replicas * rounds, C, F, H, W]
        return {name: stack[slot(j, replicas, len(names))] for j, name in enumerate(names)}

    return evaluate
