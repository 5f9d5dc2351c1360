"""An HLS event playlist of fMP4 segments, written as the render goes.

A segment is a GOP: the fragments of the file from one keyframe to the next, byte for byte, in
``STEM-FFFFFFFFF.m4s`` (F: its first frame), beside ``STEM-init.mp4`` (the file's init segment). A
segment is listed as soon as its GOP ends; ``#EXT-X-ENDLIST`` closes the playlist at the end, at a
stop and after a failure. A resumed render cuts the playlist back to the frame it resumes from (the
segments after it are written again, with the same bytes) and appends to it.

The folder may hold other files: the render writes only names of its own pattern, and never over a
file it did not write. A segment grows under a temporary name of its own and is put in place, never
over anything, when its GOP ends; the files a playlist of ours lists (and its init segment) are the
only ones it ever replaces or removes. A file already at a segment's name with the very bytes the
render made (a run killed between putting the segment in place and listing it) is kept as it is.
"""

from __future__ import annotations

import glob
import math
import os
import re
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO, Optional

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import os_reason, shown
from avatar_render.files.read import read_text
from avatar_render.files.write import open_own, place, remove, replace_atomically, temp_beside
from avatar_render.io.encoder import Fragment
from avatar_render.io.fmp4 import Fmp4Muxer, MuxerState, Tracks

PLAYLIST_LIMIT = 256 << 20  # a playlist of ours lists a segment in about 60 bytes: years of video
MARK = "## written by avatar-render"  # a comment (players ignore it): this playlist is the render's own
_ENTRY = re.compile(r"^(?P<stem>.+)-(?P<first>\d{9})\.m4s$")


@dataclass(frozen=True)
class Segment:
    uri: str
    first_frame: int
    frames: int


def init_name(playlist: Path) -> str:
    return f"{playlist.stem}-init.mp4"


def written_names(playlist: Path) -> list[Path]:
    """The files in the playlist's folder with the names a render of it writes (init and segments)."""
    folder, stem = playlist.parent, playlist.stem
    found = [p for p in folder.glob(f"{glob.escape(stem)}-*.m4s") if _ENTRY.match(p.name)
             and _ENTRY.match(p.name)["stem"] == stem]
    init = folder / init_name(playlist)
    return sorted(found) + ([init] if os.path.lexists(init) else [])


def claimed_names(playlist: Path, fps: Fraction) -> set[str]:
    """The names a playlist of ours answers for: itself, its init segment and the segments it lists."""
    segments, _ = read_playlist(playlist, fps)
    return {playlist.name, init_name(playlist), *(s.uri for s in segments)}


def read_playlist(playlist: Path, fps: Fraction) -> tuple[list[Segment], bool]:
    """The segments a playlist of ours lists and whether it is ended. Raises AvatarRenderError for a
    file that is not one of ours."""
    try:
        lines = read_text(playlist, what="playlist", give="a playlist this renderer wrote, or a new name",
                          limit=PLAYLIST_LIMIT).splitlines()
    except AvatarRenderError as exc:
        raise AvatarRenderError(f"{str(exc).rstrip('.')} (it is left alone).") from None
    if MARK not in lines:
        raise AvatarRenderError(
            f"{shown(playlist)} is not a playlist this renderer wrote; it is left alone (choose another name).")
    segments, duration = [], None
    for line in lines:
        if line.startswith("#EXTINF:"):
            try:
                duration = Fraction(line[len("#EXTINF:"):].split(",")[0])
            except (ValueError, ZeroDivisionError):
                raise AvatarRenderError(f"The playlist {shown(playlist)} has a line '{line[:80]}' that this "
                                        "renderer did not write.") from None
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
        remove(playlist.parent / s.uri)
    remove(playlist.parent / init_name(playlist))
    remove(playlist)


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
        self._file: Optional[BinaryIO] = None  # the segment being written, under its temporary name
        self._temp: Optional[Path] = None  # that name
        self.served: frozenset[str] = frozenset()  # the names of the files written and listed (for a server)
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
                self._put(self.folder / init_name(self.playlist), init)
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
            remove(self.folder / s.uri)
        self.segments = keep

    def write(self, fragment: Fragment) -> None:
        if self._ended:
            return
        if self._file is None:
            if not fragment.video:
                return  # the audio tail after a stop at a keyframe: a resumed render sends it again
            self._first, self._frames = fragment.first_frame, 0
            try:
                self._temp = temp_beside(self.folder / self._uri(self._first))
                self._file = open_own(self._temp, "ab")
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
        temp, self._temp = self._temp, None
        self.segments.append(Segment(self._uri(self._first), self._first, self._frames))
        try:
            self._put_file(temp, self.folder / self.segments[-1].uri)
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
            remove(self._temp)
            self._temp = None
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
        replace_atomically(self.playlist, text)
        self.served = frozenset({self.playlist.name, init_name(self.playlist), *(s.uri for s in self.segments)})

    def _put(self, path: Path, data: bytes) -> None:
        """``data`` at ``path``, never over anything (but the same bytes, left by an earlier run of this render)."""
        temp = temp_beside(path)
        try:
            with open_own(temp, "ab") as f:
                f.write(data)
        except BaseException:
            remove(temp)
            raise
        self._put_file(temp, path)

    def _put_file(self, temp: Path, path: Path) -> None:
        try:
            place(temp, path, replace=False)
        except FileExistsError:
            same = _same_bytes(temp, path)
            remove(temp)
            if not same:
                raise AvatarRenderError(f"Could not write the HLS stream {self.name}: {shown(path.name)} appeared in "
                                        "its folder during the render and is not the render's; it is kept.") from None

    def _error(self, exc: OSError) -> AvatarRenderError:
        return AvatarRenderError(f"Could not write the HLS stream {self.name}: {os_reason(exc)}.")


def _same_bytes(a: Path, b: Path) -> bool:
    try:
        if os.path.islink(b) or os.path.getsize(a) != os.path.getsize(b):
            return False
        return a.read_bytes() == b.read_bytes()
    except OSError:
        return False
