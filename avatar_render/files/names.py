"""Paths in messages, and what is at a path, without following links."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def shown(path: str | Path) -> str:
    """``path`` quoted for a one-line message; control characters (a newline in a name) are escaped."""
    text = str(path)
    return f"'{text}'" if text.isprintable() else ascii(text)


def os_reason(exc: OSError) -> str:
    """An OSError as the end of a sentence: 'no space left on device'."""
    text = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno == errno.EFBIG:
        text = "the file is larger than this system allows"
    elif exc.errno == errno.ENAMETOOLONG:
        text = "the name is too long for this system"
    return text[:1].lower() + text[1:]


def kind_of(mode: int) -> str | None:
    """What a non-regular file is ("a folder", "a named pipe (FIFO)", ...), None for a regular file."""
    return next((kind for test, kind in KINDS if test(mode)), None)


def lstat_or_none(path: Path) -> os.stat_result | None:
    """The entry at ``path`` itself (a link is not followed); None when nothing is there. Paths the
    system cannot take (too long, a NUL byte) raise OSError / ValueError."""
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (device and inode, links followed)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def is_link(path: Path) -> bool:
    return Path(path).is_symlink()
