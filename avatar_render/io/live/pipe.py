"""Fragmented MP4 on standard output (or any file descriptor): the file's bytes, for piping into
ffmpeg, GStreamer or a player."""

from __future__ import annotations

import os
from typing import Optional

from avatar_render.errors import AvatarRenderError
from avatar_render.io.encoder import Fragment
from avatar_render.io.fmp4 import Fmp4Muxer, MuxerState, Tracks
from avatar_render.io.live.push import Say


class PipeSink:
    def __init__(self, fd: int = 1, *, say: Say) -> None:
        self.fd, self.say = fd, say
        self.name = "standard output"
        self._muxer: Optional[Fmp4Muxer] = None
        self._failed: Optional[AvatarRenderError] = None

    @property
    def failed(self) -> Optional[AvatarRenderError]:
        return self._failed

    def open(self, tracks: Tracks, start: MuxerState, *, first_frame: int) -> None:
        self._muxer = Fmp4Muxer(None, tracks, start)
        self._write(self._muxer.init_segment())

    def write(self, fragment: Fragment) -> None:
        data = self._muxer.fragment(fragment.video, fragment.audio)
        if self._failed is None:
            self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:  # the reader went away (EPIPE), or the pipe broke
            self._failed = AvatarRenderError(
                f"The reader of standard output went away ({os.strerror(exc.errno or 0).lower()}).")
            self.say("warning", f"live: {self._failed} The render goes on without it.")

    def end_gop(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass
