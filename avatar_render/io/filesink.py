"""The record: the fragmented MP4 file the writer grows, one fragment per chunk, flushed at once."""

from __future__ import annotations

import os
from typing import BinaryIO

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.files.write import create_new, open_own, remove
from avatar_render.io.codecs import create_error, write_error
from avatar_render.io.encoder import Fragment
from avatar_render.io.fmp4 import Fmp4Muxer, MuxerState, Tracks, scan_fragments, video_digests
from avatar_render.io.spec import WriterSpec


class FileSink:
    """``spec.path`` created new (never over anything there), or, when ``resume`` is a position
    (bytes, sequence, the SHA-256 of each fragment's video up to there: none, not checked), reopened without
    following a link and cut back to it once checked."""

    def __init__(self, spec: WriterSpec, *, resume: tuple[int, int, tuple[str, ...]] | None = None) -> None:
        self.path = spec.path
        self.name = shown(spec.path)
        self._resume = resume
        try:
            self.file: BinaryIO = create_new(spec.path) if resume is None else open_own(spec.path, "r+b")
        except OSError as exc:
            raise AvatarRenderError(create_error(spec.path, exc)) from None
        self.muxer: Fmp4Muxer | None = None

    @property
    def failed(self) -> None:
        return None

    def open(self, tracks: Tracks, start: MuxerState, *, first_frame: int) -> None:
        self.muxer = Fmp4Muxer(self.file, tracks, start)
        try:
            if self._resume is None:
                self.muxer.write_init()
            else:
                self._cut_back(*self._resume)
        except OSError as exc:
            raise AvatarRenderError(write_error(self.path, exc)) from None

    def discard(self) -> None:
        """Close a file that was never opened: a new one is removed, a resumed one left as it was."""
        self.file.close()
        if self._resume is None:
            remove(self.path)

    def _cut_back(self, size: int, sequence: int, digests: tuple[str, ...]) -> None:
        path, init = self.path, self.muxer.init_segment()
        if self.file.read(len(init)) != init:
            raise AvatarRenderError(
                f"The partial video {shown(path)} was written with other encoder settings or versions.")
        try:
            if os.fstat(self.file.fileno()).st_size < size:
                raise ValueError("it is shorter than the journal says")
            found = scan_fragments(self.file, size)
        except ValueError as exc:
            raise AvatarRenderError(f"The partial video {shown(path)} does not match its journal: {exc}.") from None
        if found != sequence:
            raise AvatarRenderError(f"The partial video {shown(path)} does not match its journal: it ends at fragment "
                                    f"{found}, not {sequence}.")
        if digests:
            try:
                held = video_digests(self.file, size)
            except ValueError as exc:
                raise AvatarRenderError(f"The partial video {shown(path)} does not match its journal: {exc}.") from None
            changed = next((i for i, (a, b) in enumerate(zip(held, digests)) if a != b), None)
            if len(held) != len(digests) or changed is not None:
                at = min(len(held), len(digests)) if changed is None else changed
                raise AvatarRenderError(f"The partial video {shown(path)} does not match its journal: its chunk "
                                        f"{at + 1} is not what was written there (the file was changed or damaged).")
        self.file.truncate(size)
        self.file.seek(size)

    def write(self, fragment: Fragment) -> None:
        self.muxer.write_fragment(fragment.video, fragment.audio)

    def end_gop(self) -> None:
        pass

    @property
    def bytes(self) -> int:
        return self.file.tell()

    def close(self) -> None:
        self.file.close()

    def abort(self) -> None:
        self.file.close()
