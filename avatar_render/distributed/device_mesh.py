"""The device mesh of one request: every process, its device and the named axes it takes part in.

Axes (``Mesh.axis(name)``):
* ``fsdp``: all processes; the DiT's parameters are sharded along it (FSDP2).
* ``sp``: groups of ``sp`` consecutive processes that split one chunk's tokens (Ulysses).
* ``rep``: the ``world / sp`` replicas of an sp group; CFG parallelism gives them different guidance
  passes of each sampling step (``dist.cfg_parallel``).

Nobody else reads ranks from the environment: ``launch.session`` builds the mesh of this process once
(``single()`` when it runs alone: no process group, no torch) and the caller passes it to whatever needs
it. Importing this module does not import torch (the preview backend runs without it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from avatar_render.errors import AvatarRenderError

if TYPE_CHECKING:  # torch is an optional dependency: imported where a mesh is built
    import torch


@dataclass(frozen=True)
class Launch:
    """What ``torchrun`` put in this process's environment."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    agent_store: bool = False  # the launcher hosts the store (torchrun), not rank 0
    restart: int = 0  # the launcher's restart count: a fresh key space per attempt

    @staticmethod
    def from_env(env: Optional[dict] = None) -> "Launch":
        env = os.environ if env is None else env
        try:
            world = int(env.get("WORLD_SIZE", "1"))
            rank = int(env.get("RANK", "0"))
            local = int(env.get("LOCAL_RANK", str(rank)))
            port = int(env.get("MASTER_PORT", "29500"))
            restart = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
        except ValueError:
            raise AvatarRenderError(
                "WORLD_SIZE, RANK, LOCAL_RANK and MASTER_PORT must be integers (set them with torchrun).") from None
        if world < 1 or not 0 <= rank < world:
            raise AvatarRenderError(f"RANK={rank} does not fit WORLD_SIZE={world}; start the processes with torchrun.")
        return Launch(rank=rank, world=world, local_rank=local, master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                      master_port=port, agent_store=env.get("TORCHELASTIC_USE_AGENT_STORE") == "True", restart=restart)


@dataclass(frozen=True)
class Mesh:
    rank: int
    world: int
    # where this process computes; None when it runs alone (the models' setting decides)
    device: Optional["torch.device"]
    backend: str  # "gloo" | "nccl" | "none"
    sp: int = 1
    affinity: str = ""  # one log line: where each process's CPU affinity was set (dist.numa)
    _fsdp: object = None  # torch DeviceMesh, 1D ("fsdp",)
    _grid: object = None  # torch DeviceMesh, 2D ("rep", "sp")
    control: object = None  # a gloo group of all processes, for the host-side agreements (see launch)

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def is_writer(self) -> bool:
        """The one process that writes the output file, journal and report."""
        return self.rank == 0

    def axis(self, name: str):
        """The 1D torch DeviceMesh of axis ``name`` that this process belongs to."""
        if not self.distributed:
            raise AssertionError("a single-process mesh has no axes")
        if name == "fsdp":
            return self._fsdp
        if name in ("rep", "sp"):
            return self._grid[name]
        raise KeyError(f"unknown mesh axis {name!r}")

    def size(self, name: str) -> int:
        if not self.distributed:
            return 1
        return self.axis(name).size()

    def group(self, name: str):
        """The torch ProcessGroup of axis ``name``."""
        return self.axis(name).get_group()


def single() -> Mesh:
    """The mesh of a process that runs alone: no process group, no axes."""
    return Mesh(rank=0, world=1, device=None, backend="none")


def require_cuda(want: str) -> None:
    """Refuse a ``model.device`` setting that asks for a GPU where none is visible."""
    import torch

    if want.startswith("cuda") and not torch.cuda.is_available():
        raise AvatarRenderError(
            f"model.device={want} was asked for, but no CUDA device is visible; use model.device=cpu.")


def resolve_device(want: str, launched: Optional["torch.device"] = None) -> "torch.device":
    """Where this process's models go, the one reading of the ``model.device`` setting ``want``:
    ``auto`` a GPU when one is visible, else the CPU; ``cuda`` (``cuda:N``) a GPU or an error; ``cpu``
    the CPU even where a GPU is visible. ``launched``: the device ``pick_device`` gave this process of
    a launch (``mesh.device``), taken for any setting but the CPU."""
    import torch

    require_cuda(want)
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    own = torch.device(want)
    return launched if launched is not None and own.type != "cpu" else own


def pick_device(launch: Launch, want: str = "auto") -> tuple["torch.device", str]:
    """NCCL on this process's GPU, or gloo on the CPU, for the models' device setting ``want``."""
    import torch

    if resolve_device(want).type != "cpu" and torch.cuda.is_available():
        if launch.local_rank >= torch.cuda.device_count():
            raise AvatarRenderError(
                f"Process {launch.rank} wants GPU {launch.local_rank}, but only {torch.cuda.device_count()} are "
                "visible; start at most one process per GPU."
            )
        torch.cuda.set_device(launch.local_rank)
        return torch.device("cuda", launch.local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def build_mesh(launch: Launch, *, sp: int, device: "torch.device", backend: str, affinity: str = "") -> Mesh:
    """The axes over an initialised default process group (collective: every process calls it)."""
    from torch.distributed.device_mesh import init_device_mesh

    if launch.world % sp:
        raise AvatarRenderError(f"Config key 'dist.sp' ({sp}) must divide the number of processes ({launch.world}).")
    fsdp = init_device_mesh(device.type, (launch.world,), mesh_dim_names=("fsdp",))
    grid = init_device_mesh(device.type, (launch.world // sp, sp), mesh_dim_names=("rep", "sp"))
    return Mesh(rank=launch.rank, world=launch.world, device=device, backend=backend, sp=sp, affinity=affinity,
                _fsdp=fsdp, _grid=grid)
