"""What a command reads: regular files only, checked before anything opens them; text and JSON read
with a size limit and turned into one sentence when they are not what they should be."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import kind_of, shown

TEXT_LIMIT = 64 << 20  # a manifest, a config, a ledger record or a report larger than this is not one


def regular_file(path: str | Path, *, what: str, give: str, empty_ok: bool = True) -> Path:
    """``path`` if it names a readable regular file, else one sentence: ``The {what} '...' is ...; give {give}.``

    ``what`` names the role ("reference", "audio", "config file"), ``give`` what to pass instead
    ("an image or video file"); ``empty_ok=False`` refuses a file of 0 bytes (media). Nothing is opened.
    """
    path = Path(path)
    name = f"The {what} {shown(path)}"
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise AvatarRenderError(f"{name} is a symbolic link to a file that does not exist; give {give}.") from None
        raise AvatarRenderError(f"{name} does not exist; check the path.") from None
    except NotADirectoryError:
        raise AvatarRenderError(f"{name} does not exist (a part of its path is a file, not a folder).") from None
    except PermissionError:
        raise AvatarRenderError(f"{name} cannot be read: permission denied.") from None
    except ValueError:  # an embedded NUL byte
        raise AvatarRenderError(f"{name} is not a valid path (it holds a NUL byte).") from None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise AvatarRenderError(f"{name} is too long a path for this system.") from None
        if e.errno == errno.ELOOP:
            raise AvatarRenderError(f"{name} is a symbolic link that loops back on itself; give {give}.") from None
        raise AvatarRenderError(f"{name} cannot be read: {e.strerror or e}.") from None
    kind = kind_of(st.st_mode)
    if kind is not None:
        raise AvatarRenderError(f"{name} is {kind}, not a regular file; give {give}.")
    if not os.access(path, os.R_OK):
        raise AvatarRenderError(f"{name} cannot be read: permission denied.")
    if not empty_ok and st.st_size == 0:
        raise AvatarRenderError(f"{name} is empty (0 bytes); give {give}.")
    return path


def read_bytes(path: str | Path, *, what: str, give: str, limit: int = TEXT_LIMIT) -> bytes:
    """The content of a regular file of at most ``limit`` bytes (checked first, then read)."""
    path = regular_file(path, what=what, give=give)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise AvatarRenderError(f"The {what} {shown(path)} cannot be read: {e.strerror or e}.") from None
    if len(data) > limit:
        raise AvatarRenderError(f"The {what} {shown(path)} is larger than {limit >> 20} MB; give {give}.")
    return data


def read_text(path: str | Path, *, what: str, give: str, limit: int = TEXT_LIMIT) -> str:
    """A regular file's UTF-8 text (a byte-order mark is dropped), at most ``limit`` bytes."""
    data = read_bytes(path, what=what, give=give, limit=limit)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise AvatarRenderError(f"The {what} {shown(path)} is not UTF-8 text (line {line}); give {give}.") from None


def parse_json(text: str, *, where: str) -> Any:
    """``json.loads`` with its failures as one sentence starting with ``where`` ("jobs.jsonl line 3")."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return _bad(where, f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})")
    except RecursionError:  # the decoder recurses once per nested array or object
        return _bad(where, "nested too deeply to be read")


def read_json(path: str | Path, *, what: str, give: str, limit: int = TEXT_LIMIT) -> Any:
    path = Path(path)
    return parse_json(read_text(path, what=what, give=give, limit=limit), where=f"The {what} {shown(path)}")


def _bad(where: str, why: str):
    raise AvatarRenderError(f"{where}: {why}.")
