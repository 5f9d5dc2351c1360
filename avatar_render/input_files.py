"""The files a render reads (reference, audio, config): checked before anything opens them.

Opening a FIFO blocks until a writer comes, and a character device streams forever, so only regular
files (symbolic links followed) get past ``regular_file``.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from avatar_render.errors import AvatarRenderError

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
