"""CPU affinity on the GPU's NUMA node, read from a sysfs tree made in a temporary folder."""

import os

import pytest

from avatar_render.distributed.numa import Affinity, describe, parse_cpulist, pci_numa_node, pin_near

BUS = "0000:3b:00.0"


def sysfs(tmp_path, node: str, cpulist: str | None):
    dev = tmp_path / "bus" / "pci" / "devices" / BUS
    dev.mkdir(parents=True)
    (dev / "numa_node").write_text(node + "\n")
    if cpulist is not None:
        n = tmp_path / "devices" / "system" / "node" / f"node{int(node)}"
        n.mkdir(parents=True)
        (n / "cpulist").write_text(cpulist + "\n")
    return tmp_path


@pytest.fixture
def restore_affinity():
    before = os.sched_getaffinity(0)
    yield before
    os.sched_setaffinity(0, before)


def test_cpulist_ranges_and_singles():
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("5") == (5,)
    assert parse_cpulist("") == ()


def test_pinned_to_the_gpus_node(tmp_path, restore_affinity):
    allowed = sorted(restore_affinity)
    root = sysfs(tmp_path, "0", f"{allowed[0]}")  # a node of one CPU this process may use
    got = pin_near(BUS, root)
    assert got == Affinity(0, (allowed[0],))
    assert os.sched_getaffinity(0) == {allowed[0]}


@pytest.mark.parametrize("node,cpulist,why", [
    ("-1", None, "reports no NUMA node"),  # what virtual machines and one-socket hosts often say
    ("1", None, "lists no CPUs"),
    ("0", "100000-100003", "none of NUMA node 0's CPUs"),
])
def test_unknown_topology_leaves_the_affinity_alone(tmp_path, restore_affinity, node, cpulist, why):
    got = pin_near(BUS, sysfs(tmp_path, node, cpulist))
    assert got.node is None and why in got.why
    assert os.sched_getaffinity(0) == restore_affinity


def test_no_sysfs_entry_or_no_pci_location(tmp_path):
    assert pci_numa_node(BUS, tmp_path) is None
    assert pin_near(None, tmp_path).why == "the GPU's PCI location is unknown"


def test_one_log_line_for_all_processes():
    assert (describe([Affinity(None, why="no GPUs (gloo on the CPU)")] * 2)
            == "CPU affinity left as it is: no GPUs (gloo on the CPU).")
    line = describe([Affinity(0, (0, 1)), Affinity(1, (2, 3)), Affinity(None, why="x")])
    assert line == ("CPU affinity: process 0 on NUMA node 0 (2 CPUs), process 1 on NUMA node 1 (2 CPUs), "
                    "process 2 unpinned (x).")
