"""An HLS event playlist of fMP4 segments, written as the render goes.

A segment is a GOP: the fragments of the file from one keyframe to the next, byte for byte, in
``STEM-FFFFFFFFF.m4s`` (F: its first frame), beside ``STEM-init.mp4`` (the file's init segment). A
segment is listed as soon as its GOP ends; ``#EXT-X-ENDLIST`` closes the playlist at the end, at a
stop and after a failure. A resumed render cuts the playlist back to the frame it resumes from (the
segments after it are written again, with the same bytes) and appends to it.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO, Optional

from avatar_render.errors import AvatarRenderError
from avatar_render.files import create_new, replace_atomically, shown
from avatar_render.io.codecs import os_reason
from avatar_render.io.encoder import Fragment
from avatar_render.io.fmp4 import Fmp4Muxer, MuxerState, Tracks

MARK = "## written by avatar-render"  # a comment (players ignore it): this playlist is the render's own
_ENTRY = re.compile(r"^(?P<stem>.+)-(?P<first>\d{9})\.m4s$")


@dataclass(frozen=True)
class Segment:
    uri: str
    first_frame: int
    frames: int


def init_name(playlist: Path) -> str:
    return f"{playlist.stem}-init.mp4"


def read_playlist(playlist: Path, fps: Fraction) -> tuple[list[Segment], bool]:
    """The segments a playlist of ours lists and whether it is ended. Raises AvatarRenderError for a
    file that is not one of ours."""
    try:
        lines = playlist.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AvatarRenderError(
            f"Cannot read the playlist {shown(playlist)}: {getattr(exc, 'strerror', None) or exc}.") from None
    if MARK not in lines:
        raise AvatarRenderError(
            f"{shown(playlist)} is not a playlist this renderer wrote; it is left alone (choose another name).")
    segments, duration = [], None
    for line in lines:
        if line.startswith("#EXTINF:"):
            duration = Fraction(line[len("#EXTINF:"):].split(",")[0])
        elif line and not line.startswith("#"):
            match = _ENTRY.match(line)
            if match is None or duration is None or match["stem"] != playlist.stem:
                raise AvatarRenderError(
                    f"The playlist {shown(playlist)} lists '{line}', which this renderer did not write.")
            segments.append(Segment(line, int(match["first"]), round(duration * fps)))
            duration = None
    return segments, "#EXT-X-ENDLIST" in lines


def remove_playlist(playlist: Path, fps: Fraction) -> None:
    """A playlist of ours and the segments it lists (nothing else) removed: for --force."""
    segments, _ = read_playlist(playlist, fps)
    for s in segments:
        (playlist.parent / s.uri).unlink(missing_ok=True)
    (playlist.parent / init_name(playlist)).unlink(missing_ok=True)
    playlist.unlink()


class HlsSink:
    def __init__(self, playlist: Path, *, fps: Fraction, target_seconds: int) -> None:
        self.playlist = Path(playlist)
        self.folder = self.playlist.parent
        self.name = shown(self.playlist)
        self.fps = fps
        self.target = max(1, target_seconds)
        self.segments: list[Segment] = []
        self.first_listed_at: Optional[float] = None  # time.monotonic() when the first segment was listed
        self._muxer: Optional[Fmp4Muxer] = None
        self._file: Optional[BinaryIO] = None  # the segment being written
        self._first = 0  # its first frame
        self._frames = 0  # its frames so far
        self._ended = False

    @property
    def failed(self) -> None:
        return None

    def open(self, tracks: Tracks, start: MuxerState, *, first_frame: int) -> None:
        self._muxer = Fmp4Muxer(None, tracks, start)
        init = self._muxer.init_segment()
        try:
            if first_frame and self.playlist.exists():
                self._cut_back(first_frame, init)
            else:
                assert not self.playlist.exists(), ("checked before the render: an existing playlist is refused or "
                                                    "removed")
                replace_atomically(self.folder / init_name(self.playlist), lambda f: f.write(init))
            if self.segments:  # (a new playlist appears with its first segment: players refuse an empty one)
                self._write_playlist()
        except OSError as exc:
            raise self._error(exc) from None

    def _cut_back(self, first_frame: int, init: bytes) -> None:
        segments, _ = read_playlist(self.playlist, self.fps)
        keep = [s for s in segments if s.first_frame < first_frame]
        end = keep[-1].first_frame + keep[-1].frames if keep else first_frame
        try:
            same_init = (self.folder / init_name(self.playlist)).read_bytes() == init
        except OSError:
            same_init = False
        if end != first_frame or not same_init:
            raise AvatarRenderError(f"The playlist {shown(self.playlist)} does not fit the render being resumed; "
                                    "remove it or start over with --force.")
        for s in segments[len(keep):]:
            (self.folder / s.uri).unlink(missing_ok=True)
        self.segments = keep

    def write(self, fragment: Fragment) -> None:
        if self._ended:
            return
        if self._file is None:
            if not fragment.video:
                return  # the audio tail after a stop at a keyframe: a resumed render sends it again
            self._first, self._frames = fragment.first_frame, 0
            path = self.folder / self._uri(self._first)
            try:
                path.unlink(missing_ok=True)  # left by a run killed before it listed it
                self._file = create_new(path)
            except OSError as exc:
                raise self._error(exc) from None
        data = self._muxer.fragment(fragment.video, fragment.audio)
        try:
            view = memoryview(data)
            while view:
                view = view[self._file.write(view):]
        except OSError as exc:
            raise self._error(exc) from None
        self._frames += len(fragment.video)

    def end_gop(self) -> None:
        if self._file is None:
            return
        self._file.close()
        self._file = None
        self.segments.append(Segment(self._uri(self._first), self._first, self._frames))
        try:
            self._write_playlist()
        except OSError as exc:
            raise self._error(exc) from None
        if self.first_listed_at is None:
            self.first_listed_at = time.monotonic()

    def close(self) -> None:
        self.end_gop()
        self._end()

    def abort(self) -> None:
        """The segment being written is not listed; the playlist is ended (a resume opens it again)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        try:
            self._end()
        except (OSError, AvatarRenderError):
            pass

    def _end(self) -> None:
        self._ended = True
        try:
            self._write_playlist()
        except OSError as exc:
            raise self._error(exc) from None

    def _uri(self, first: int) -> str:
        return f"{self.playlist.stem}-{first:09d}.m4s"

    def _write_playlist(self) -> None:
        longest = max((s.frames for s in self.segments), default=0) / self.fps
        self.target = max(self.target, math.ceil(round(longest, 6)))
        lines = ["#EXTM3U", "#EXT-X-VERSION:7", f"#EXT-X-TARGETDURATION:{self.target}", "#EXT-X-PLAYLIST-TYPE:EVENT",
                 "#EXT-X-MEDIA-SEQUENCE:0", "#EXT-X-INDEPENDENT-SEGMENTS", MARK,
                 f'#EXT-X-MAP:URI="{init_name(self.playlist)}"']
        for s in self.segments:
            lines += [f"#EXTINF:{float(s.frames / self.fps):.6f},", s.uri]
        if self._ended:
            lines.append("#EXT-X-ENDLIST")
        text = ("\n".join(lines) + "\n").encode()
        replace_atomically(self.playlist, lambda f: f.write(text))

    def _error(self, exc: OSError) -> AvatarRenderError:
        return AvatarRenderError(f"Could not write the HLS stream {self.name}: {os_reason(exc)}.")
