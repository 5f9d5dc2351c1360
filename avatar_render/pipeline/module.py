"""Module: one model (or other weight-bearing component) and the checkpoint it is loaded from."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from pathlib import Path


class Placement(enum.Enum):
    """Where a module's weights live right now."""

    UNLOADED = "unloaded"  # built (or not), no weights read
    CPU = "cpu"  # weights in host memory
    PINNED = "pinned"  # weights in pinned host memory, ready for fast upload
    DEVICE = "device"  # weights on the accelerator
    SHARDED = "sharded"  # weights split across the ranks of a device mesh
    STREAMED = "streamed"  # repeated blocks in pinned host memory, each copied to the device for its forward


class Module(ABC):
    """A component with weights. Subclasses say which local files hold them and how to read them.

    ``load`` reads the weights (from local paths only, never a hub) and fails with an
    AvatarRenderError naming any missing file or key. ``offload`` and ``prefetch`` move weights
    between host and device; for host-only modules they are no-ops.
    """

    name: str = "module"

    def __init__(self) -> None:
        self.placement = Placement.UNLOADED

    @abstractmethod
    def weight_files(self) -> list[Path]:
        """The local files this module reads when loaded."""

    @abstractmethod
    def _load(self) -> None:
        """Read the weights; called once by ``load``."""

    def load(self) -> None:
        if self.placement is Placement.UNLOADED:
            self._load()
            self.placement = Placement.CPU

    def offload(self) -> None:
        """Move weights to host memory (no-op for host-only modules)."""

    def prefetch(self) -> None:
        """Start moving weights to where they run next (no-op for host-only modules)."""

    def release(self) -> None:
        """Drop the weights (``load`` reads them again): for a module that will not run again soon."""
        self.placement = Placement.UNLOADED

    def missing_files(self) -> list[Path]:
        return [p for p in self.weight_files() if not Path(p).is_file()]
