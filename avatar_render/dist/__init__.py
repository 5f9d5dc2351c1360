"""One request across the processes of a ``torchrun`` launch: mesh, launch, FSDP2 sharding and
Ulysses sequence parallelism. In a single process everything here is a no-op, and importing the package does not import torch."""

from avatar_render.dist.launch import agree, broadcast, distributed, is_writer_process, session
from avatar_render.dist.mesh import Mesh, current

__all__ = ["Mesh", "agree", "broadcast", "current", "distributed", "is_writer_process", "session"]
