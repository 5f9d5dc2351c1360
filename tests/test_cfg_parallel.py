"""Which replica runs which guidance pass, and where its flow lands in the gathered stack."""

import pytest

from avatar_render.dist.cfg_parallel import my_passes, slot


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
