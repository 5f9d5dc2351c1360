"""What a command writes: files it creates exclusively (never through a link), files it replaces as a
whole through a temporary file of its own, and removal of only what it made."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO, BinaryIO, Callable, Iterator, Union

from avatar_render.files.names import NO_FOLLOW

Content = Union[bytes, Callable[[BinaryIO], None]]


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


def replace_atomically(path: Path, content: Content) -> None:
    """Write a temporary file of our own beside ``path`` (``content``: bytes, or ``write(file)``), then
    rename it over ``path`` (a link there is replaced, never written through). A failure leaves
    ``path`` as it was."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | NO_FOLLOW), "wb") as f:  # buffered: every byte written
            content(f) if callable(content) else f.write(content)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def temp_beside(path: Path) -> Path:
    """A new, empty, hidden file of our own in ``path``'s folder (``.NAME.XXXXXXXX.tmp``), for a writer
    that needs a name (FFmpeg); ``place`` or ``os.replace`` then puts it at ``path``."""
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=f".{Path(path).name}.", suffix=".tmp")
    os.fchmod(fd, 0o644)
    os.close(fd)
    return Path(tmp)


def place(src: Path, dst: Path, *, replace: bool) -> None:
    """Move our finished file ``src`` to ``dst``. With ``replace`` whatever is at ``dst`` (a link too)
    is replaced as a whole; without, FileExistsError if anything is there, even if it appeared a moment
    ago (a hard link fails where a rename would not)."""
    if replace:
        os.replace(src, dst)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError:  # no hard links on this file system
        if os.path.lexists(dst):
            raise FileExistsError(dst) from None
        os.replace(src, dst)
    else:
        os.unlink(src)


def link_into_place(src: Path, dst: Path, *, replace: bool) -> None:
    """Give our finished file ``src`` the name ``dst`` too (a hard link: ``src`` is kept, so that a command
    killed before it tidies up can tell that ``dst`` is its own finished file), with ``place``'s rules for
    what is at ``dst``. Where the file system has no hard links, ``src`` is moved there instead."""
    try:
        if not replace:
            os.link(src, dst, follow_symlinks=False)
            return
        temp = temp_beside(dst)
        os.unlink(temp)  # (its name, free: the link takes it)
        os.link(src, temp, follow_symlinks=False)
        try:
            os.replace(temp, dst)
        except BaseException:
            remove(temp)
            raise
    except FileExistsError:
        raise
    except OSError:  # no hard links on this file system
        place(src, dst, replace=replace)


def remove(path: Path) -> None:
    """Remove a file (or a link: never what it points to) that this program made; nothing if it is
    gone. A folder is never removed here."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def remove_tree(folder: Path) -> None:
    """Remove a folder this program made, with everything in it (links inside are removed, never
    followed); a link at ``folder`` itself is left alone."""
    if Path(folder).is_symlink():
        return
    shutil.rmtree(folder, ignore_errors=True)


def remove_empty_folder(folder: Path) -> None:
    """Remove a folder this program made, if nothing is in it (a command that fails before writing there)."""
    with contextlib.suppress(OSError):
        Path(folder).rmdir()


def make_folder(path: Path, *, parents: bool = False) -> bool:
    """Create the folder ``path`` (and, with ``parents``, the missing folders above it); whether it
    was made now. A folder already there is kept; anything else there raises FileExistsError."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        return False
    path.mkdir(parents=parents)
    return True


def open_lock(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created if missing, never through a link), for flock/lockf."""
    return os.open(path, os.O_RDWR | os.O_CREAT | NO_FOLLOW, 0o644)


def fresh_file(path: Path) -> BinaryIO:
    """A new empty file of our own that has already replaced whatever of ours was at ``path`` (a
    job's log in the batch's own folder), open for writing."""
    tmp = temp_beside(path)
    os.replace(tmp, path)
    return open_own(path, "ab")


def scratch_file(mode: str = "w+") -> IO:
    """An anonymous temporary file (no name anywhere; gone when closed)."""
    return tempfile.TemporaryFile(mode)


@contextlib.contextmanager
def temp_folder(prefix: str = "avatar-render-") -> Iterator[Path]:
    """A new private folder in the system's temporary place, removed with everything in it at the end."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        remove_tree(folder)


def new_temp_folder(prefix: str = "avatar-render-") -> Path:
    """A new private folder in the system's temporary place; the caller removes it with ``remove_tree``."""
    return Path(tempfile.mkdtemp(prefix=prefix))
