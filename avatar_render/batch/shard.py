"""Deterministic, disjoint parts of a batch: part I of N takes jobs I, I+N, I+2N, ... of the source's
order (manifest rows, or a folder's stems sorted), so N processes that read the same source need no
coordination; every job falls in exactly one part."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, TypeVar

from avatar_render.errors import AvatarRenderError

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    index: int  # 0-based
    count: int

    def __post_init__(self) -> None:
        assert 0 <= self.index < self.count, self

    def select(self, items: Sequence[T]) -> list[T]:
        return list(items[self.index :: self.count])

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``I/N`` with 0 <= I < N (Slurm's array indices start at 0 by default)."""
    try:
        index, count = (int(v) for v in text.split("/"))
    except ValueError:
        raise AvatarRenderError(
            f"--shard takes I/N, for example 0/4 for the first of four parts; got '{text}'."
        ) from None
    if count < 1 or not 0 <= index < count:
        raise AvatarRenderError(f"--shard {text}: I must be between 0 and N-1 (the first of four parts is 0/4).")
    return Shard(index, count)


def slurm_shard(env: Mapping[str, str] = os.environ) -> Optional[Shard]:
    """The part of a Slurm array task (``sbatch --array=0-(N-1)``), or None outside an array."""
    if "SLURM_ARRAY_TASK_ID" not in env or "SLURM_ARRAY_TASK_COUNT" not in env:
        return None
    try:
        index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        count = int(env["SLURM_ARRAY_TASK_COUNT"])
    except ValueError:
        raise AvatarRenderError("SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT must be numbers.") from None
    if count < 1 or not 0 <= index < count:
        raise AvatarRenderError(
            f"Slurm array task {env['SLURM_ARRAY_TASK_ID']} is not one of {count} consecutive tasks; "
            "submit the batch with a range such as --array=0-3, or pass --shard I/N."
        )
    return Shard(index, count)
