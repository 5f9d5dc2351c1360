"""What the writer hands its encoded fragments to: the MP4 file (the record) and the live sinks."""

from __future__ import annotations

from typing import Optional, Protocol

from avatar_render.errors import AvatarRenderError
from avatar_render.io.encoder import Fragment
from avatar_render.io.fmp4 import MuxerState, Tracks


class Sink(Protocol):
    """Called on the writer thread, in this order: ``open`` once, then ``write`` for each fragment and
    ``end_gop`` where a GOP is complete (the next fragment opens one), then ``close`` (the stream
    ended: an end of stream on the wire, the playlist's end) or ``abort`` (stopped at once)."""

    name: str  # how messages name it: 'rtmp://host/app/key', "'live.m3u8'"

    def open(self, tracks: Tracks, start: MuxerState, *, first_frame: int) -> None:
        """Before the first fragment; ``start``: the counters where this run's stream begins
        (non-zero when a render is resumed), ``first_frame``: its first frame's index."""

    def write(self, fragment: Fragment) -> None: ...

    def end_gop(self) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None:
        """Never raises."""

    @property
    def failed(self) -> Optional[AvatarRenderError]:
        """Why a live sink gave up (its target lost for good), else None; the render goes on without it."""
