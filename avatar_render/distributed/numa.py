"""Each process's CPU affinity on the NUMA node of its GPU, where the machine says which node that is.

Host-side work of a rank (pinned-memory copies, the writer, Python itself) then runs on the memory
controller nearest its GPU's PCIe root. Where the node is unknown (no GPU, a virtual machine that
reports -1, no sysfs) the affinity is left as it is and the reason is returned for the log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SYS = Path("/sys")


@dataclass(frozen=True)
class Affinity:
    node: Optional[int]  # the NUMA node this process was pinned to; None = left as it was
    cpus: tuple[int, ...] = ()
    why: str = ""  # why it was left as it was


def parse_cpulist(text: str) -> tuple[int, ...]:
    """'0-3,8,10-11' -> (0, 1, 2, 3, 8, 10, 11)."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus)


def pci_numa_node(bus_id: str, sys: Path = SYS) -> Optional[int]:
    """The NUMA node of a PCI device ('0000:3b:00.0'), None when unknown."""
    try:
        node = int((sys / "bus" / "pci" / "devices" / bus_id.lower() / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def gpu_bus_id(index: int) -> Optional[str]:
    import torch

    props = torch.cuda.get_device_properties(index)
    try:
        return f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:  # an older PyTorch without the PCI location
        return None


def pin_near(bus_id: Optional[str], sys: Path = SYS) -> Affinity:
    """Restrict this process to the CPUs of the NUMA node of PCI device ``bus_id`` (when known)."""
    if bus_id is None:
        return Affinity(None, why="the GPU's PCI location is unknown")
    node = pci_numa_node(bus_id, sys)
    if node is None:
        return Affinity(None, why=f"the machine reports no NUMA node for GPU {bus_id}")
    try:
        cpus = parse_cpulist((sys / "devices" / "system" / "node" / f"node{node}" / "cpulist").read_text())
    except (OSError, ValueError):
        return Affinity(None, why=f"NUMA node {node} lists no CPUs")
    allowed = os.sched_getaffinity(0)
    mine = tuple(c for c in cpus if c in allowed)
    if not mine:
        return Affinity(None, why=f"none of NUMA node {node}'s CPUs is available to this process")
    os.sched_setaffinity(0, mine)
    return Affinity(node, mine)


def describe(affinities: list[Affinity]) -> str:
    """One log line for all processes."""
    if all(a.node is None for a in affinities):
        reasons = sorted({a.why for a in affinities})
        return "CPU affinity left as it is: " + "; ".join(reasons) + "."
    parts = [f"process {r} on NUMA node {a.node} ({len(a.cpus)} CPUs)" if a.node is not None
             else f"process {r} unpinned ({a.why})"
             for r, a in enumerate(affinities)]
    return "CPU affinity: " + ", ".join(parts) + "."
