"""The render's files on disk. What it reads (reference, audio, config) is checked before anything
opens it: opening a FIFO blocks until a writer comes and a character device streams forever, so only
regular files (symbolic links followed) get past ``regular_file``. What it writes is created
exclusively, opened without following links and replaced atomically through a temporary file of its own.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

from avatar_render.errors import AvatarRenderError

NO_FOLLOW = getattr(os, "O_NOFOLLOW", 0)
_KINDS = (
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


def regular_file(path: str | Path, *, what: str, give: str) -> Path:
    """``path`` if it names a readable regular file, else one sentence: ``The {what} '...' is ...; give {give}.``

    ``what`` names the role ("reference", "audio", "config file"), ``give`` what to pass instead
    ("an image or video file"). Nothing is opened.
    """
    path = Path(path)
    name = f"The {what} {shown(path)}"
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if path.is_symlink():
            raise AvatarRenderError(f"{name} is a symbolic link to a file that does not exist; give {give}.") from None
        raise AvatarRenderError(f"{name} does not exist; check the path.") from None
    except NotADirectoryError:
        raise AvatarRenderError(f"{name} does not exist (a part of its path is a file, not a folder).") from None
    except PermissionError:
        raise AvatarRenderError(f"{name} cannot be read: permission denied.") from None
    except ValueError:  # an embedded NUL byte
        raise AvatarRenderError(f"{name} is not a valid path.") from None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise AvatarRenderError(f"{name} is too long a path for this system.") from None
        if e.errno == errno.ELOOP:
            raise AvatarRenderError(f"{name} is a symbolic link that loops back on itself; give {give}.") from None
        raise AvatarRenderError(f"{name} cannot be read: {e.strerror or e}.") from None
    for test, kind in _KINDS:
        if test(mode):
            raise AvatarRenderError(f"{name} is {kind}, not a regular file; give {give}.")
    if not os.access(path, os.R_OK):
        raise AvatarRenderError(f"{name} cannot be read: permission denied.")
    return path


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
