"""Writing only what the render made: files created exclusively, opened without following links, and
replaced atomically through a temporary file of its own."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)


def create_new(path: Path, *, mode: int = 0o644) -> BinaryIO:
    """A new regular file at ``path`` for writing; FileExistsError if anything (a link too) is there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NO_FOLLOW, mode)
    return os.fdopen(fd, "wb", buffering=0)


def open_own(path: Path, mode: str = "r+b") -> BinaryIO:
    """An existing regular file, never through a link (OSError otherwise); ``mode`` "r+b" or "ab"."""
    flags = {"r+b": os.O_RDWR, "ab": os.O_WRONLY | os.O_APPEND}[mode]
    fd = os.open(path, flags | NO_FOLLOW)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IsADirectoryError(f"'{path}' is not a regular file")
    return os.fdopen(fd, mode, buffering=0)


def replace_atomically(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """Write a temporary file of our own beside ``path`` with ``write(file)``, then rename it over
    ``path`` (a link there is replaced, never written through). A failure leaves ``path`` as it was."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_link(path: Path) -> bool:
    return Path(path).is_symlink()
