"""The rolling state of one request: all that survives from one chunk to the next."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from avatar_render.pipeline.types import Segment


@dataclass(frozen=True)
class RollingState:
    carries: tuple[Any, ...]  # one per generation stage
    decode_carry: Any  # e.g. a causal decoder cache
    anchors: dict[int, Any] = field(default_factory=dict)  # frame -> state, for I chunks still to run
    pending: tuple[Segment, ...] = ()  # final segments waiting for earlier frames
    next_frame: int = 0  # first frame not yet published

    def with_anchors(self, add: dict[int, Any], drop: tuple[int, ...] = ()) -> "RollingState":
        anchors = {f: a for f, a in self.anchors.items() if f not in drop}
        anchors.update(add)
        return replace(self, anchors=anchors)

    def pop_ready(self) -> tuple["RollingState", Segment | None]:
        """The pending segment that starts at next_frame, if any."""
        for i, seg in enumerate(self.pending):
            if seg.start == self.next_frame:
                rest = self.pending[:i] + self.pending[i + 1 :]
                return replace(self, pending=rest, next_frame=seg.end), seg
        return self, None
