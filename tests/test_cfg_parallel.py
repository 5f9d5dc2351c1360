"""Which replica runs which guidance pass, and where its flow lands in the gathered stack."""

import pytest
import torch

from avatar_render.distributed.cfg_parallel import my_passes, slot, spare_replicas
from avatar_render.distributed.device_mesh import Mesh


@pytest.mark.parametrize("passes", [1, 2, 3])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 8])
def test_every_pass_runs_once_and_every_replica_runs_as_many(passes, replicas):
    runs = [my_passes(passes, replicas, r) for r in range(replicas)]
    assert len({len(r) for r in runs}) == 1  # the same number of forwards everywhere: collectives stay in step
    stack = [p for r in runs for p in r]  # the all-gather's order: replica-major
    for j in range(passes):
        assert stack[slot(j, replicas, passes)] == j
    real = [p for r, run in enumerate(runs) for i, p in enumerate(run) if r + replicas * i < passes]
    assert sorted(real) == list(range(passes))


def test_three_passes_on_two_replicas():
    assert my_passes(3, 2, 0) == [0, 2] and my_passes(3, 2, 1) == [1, 0]


def test_spare_replicas_are_pointed_out_with_a_better_sequence_split():
    mesh = lambda world, sp: Mesh(rank=0, world=world, device=torch.device("cpu"), backend="gloo", sp=sp)  # noqa: E731
    assert spare_replicas(mesh(8, 8), 3, heads=40) is None  # one replica
    assert spare_replicas(mesh(2, 1), 3, heads=40) is None  # 2 replicas for 3 passes
    note = spare_replicas(mesh(8, 1), 3, heads=40)
    assert (note.startswith("8 replicas") and "run 3 guidance pass(es) at once" in note
            and "5 of them only repeat work" in note and "dist.sp=4 " in note)
    assert "dist.sp=8 " in spare_replicas(mesh(8, 2), 1, heads=40)
    assert "dist.sp=" not in spare_replicas(mesh(8, 1), 1, heads=3)  # no split divides 3 heads and 8 processes
