"""One request across the processes of a ``torchrun`` launch: mesh and launch, FSDP2 sharding
(parallelize), Ulysses sequence parallelism, CFG parallelism, the split VAE decode and NUMA pinning;
and, for one process, the DiT's blocks streamed from host memory (streaming). In a single process
the multi-process parts are no-ops, and importing the package does not import torch."""

from avatar_render.distributed.launch import agree, broadcast, distributed, is_writer_process, session
from avatar_render.distributed.mesh import Mesh, current

__all__ = ["Mesh", "agree", "broadcast", "current", "distributed", "is_writer_process", "session"]
