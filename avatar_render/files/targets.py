"""Whether a path may be written, decided before any work starts.

A command writes a file only where it may: not over one of its own inputs (by name, or device and
inode through links), not into a folder that does not exist or cannot take a new file, not over
anything this program did not write unless the user passed ``--force`` (and then as a whole, a link
included: never written through). What the program wrote carries its signature in its first bytes
(``signature``), so a later run knows its own report, plot or summary from somebody else's file.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Iterable, Optional

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import NO_FOLLOW, kind_of, lstat_or_none, os_reason, shown
from avatar_render.files.render_paths import owning_render
from avatar_render.files.write import remove, temp_beside

TEMP_EXTRA = len(".") + len(".XXXXXXXX.tmp")  # what ``temp_beside`` adds to a name
_HEAD = 4096  # the signature is in a file's first bytes


def signature(kind: str) -> str:
    """Who wrote a file, e.g. ``avatar-render report``: the first key of its JSON (``written_by``),
    the ``Software`` text of a PNG, the ``generator`` of an HTML page."""
    return f"avatar-render {kind}"


def is_ours(path: Path, kind: str) -> bool:
    """Whether the regular file at ``path`` (not a link) begins with this program's signature of ``kind``."""
    sign = re.escape(signature(kind).encode())
    marks = (rb'^\{\s*"written_by":\s*"' + sign + rb'"', rb"tEXtSoftware\x00" + sign,
             rb'<meta name="generator" content="' + sign + rb'">')
    try:
        fd = os.open(path, os.O_RDONLY | NO_FOLLOW | os.O_NONBLOCK)
    except (OSError, ValueError):
        return False
    try:
        if kind_of(os.fstat(fd).st_mode) is not None:
            return False
        head = os.read(fd, _HEAD)
    except OSError:
        return False
    finally:
        os.close(fd)
    return any(re.search(m, head) for m in marks)


class Inputs:
    """The files one run reads, by role ("audio file", "reference of jobs.csv line 3"): nothing it
    writes may be one of them (by name, or by device and inode through links). ``outputs``: paths the
    run writes itself, which no other of its outputs may be either. Lookups are by dictionary, so a
    batch of thousands of jobs checks each output once."""

    def __init__(self, named: dict[str, Optional[Path]], *,
                 outputs: Optional[dict[str, Optional[Path]]] = None) -> None:
        self._names: dict[str, tuple[str, bool]] = {}
        self._ids: dict[tuple[int, int], tuple[str, bool]] = {}
        for role, p in named.items():
            self.add(role, p, is_input=True)
        for role, p in (outputs or {}).items():
            self.add(role, p, is_input=False)

    def add(self, role: str, path: Optional[Path], *, is_input: bool = True) -> None:
        if path is None:
            return
        try:
            self._names.setdefault(os.path.abspath(path), (role, is_input))
            st = os.stat(path)
        except (OSError, ValueError):
            return
        self._ids.setdefault((st.st_dev, st.st_ino), (role, is_input))

    def plus_outputs(self, outputs: dict[str, Optional[Path]]) -> Inputs:
        more = Inputs({})
        more._names, more._ids = dict(self._names), dict(self._ids)
        for role, p in outputs.items():
            more.add(role, p, is_input=False)
        return more

    def check(self, path: Path, *, what: str) -> None:
        try:
            found = self._names.get(os.path.abspath(path))
            if found is None:
                st = os.stat(path)
                found = self._ids.get((st.st_dev, st.st_ino))
        except (OSError, ValueError):
            found = None
        if found is not None:
            role, is_input = found
            why = "; nothing is ever written over an input, give another name." if is_input else \
                ", which is written too; give another name."
            raise AvatarRenderError(f"The {what} {shown(path)} is the {role}{why}")


def check_target(path: Path, *, what: str, force: bool, kind: Optional[str] = None,
                 inputs: Optional[Inputs] = None, siblings: Iterable[str] = (),
                 flag: str = "--force") -> Path:
    """Refuse, in one sentence, to write the file ``path`` (the ``what``: "report", "plot") where it may
    not be written; see the module docstring. An existing file is replaced only if it carries the
    signature of ``kind`` or with ``force``. ``siblings``: other names the command will write beside it
    (they must fit the folder's name limit too). Nothing is written; returns ``path``."""
    path = Path(path)
    name = f"The {what} {shown(path)}"
    try:
        st = lstat_or_none(path)
    except ValueError:
        raise AvatarRenderError(f"{name} is not a valid path (it holds a NUL byte).") from None
    except OSError as e:
        raise AvatarRenderError(f"{name} cannot be written: {os_reason(e)}.") from None
    if st is not None and kind_of(st.st_mode) == "a folder":
        raise AvatarRenderError(f"{name} is a folder; give a file name.")
    check_folder_takes(path, what=what, siblings=siblings)
    if inputs is not None:
        inputs.check(path, what=what)
    owner = owning_render(path)
    if owner is not None:  # (not even with force: that render's work would be lost)
        raise AvatarRenderError(
            f"{name} belongs to the render of {shown(owner)}, interrupted or running (its resume journal is beside "
            "it); give another name, or let that render finish (--resume).")
    if st is None or force:
        return path
    if os.path.islink(path):
        raise AvatarRenderError(f"{name} is a symbolic link; pass {flag} to replace the link (it is never written "
                                "through).")
    if kind_of(st.st_mode) is not None:
        raise AvatarRenderError(f"{name} is {kind_of(st.st_mode)}; give the name of a file.")
    if kind is not None and is_ours(path, kind):
        return path
    if kind is None:
        raise AvatarRenderError(f"{name} already exists; pass {flag} to replace it.")
    raise AvatarRenderError(f"{name} already exists and was not written by avatar-render; pass {flag} to replace it, "
                            "or give another name.")


def check_folder_takes(path: Path, *, what: str, siblings: Iterable[str] = ()) -> None:
    """``path``'s folder exists and takes a new file of that name (and of each of ``siblings``, plus
    the temporary name a replacement is written under): tried for real, with a temporary file."""
    folder = path.parent
    name = f"Cannot write the {what} {shown(path)}"
    try:
        folder_st = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        raise AvatarRenderError(f"{name}: the folder {shown(folder)} does not exist (create it first).") from None
    except OSError as e:
        raise AvatarRenderError(f"{name}: {os_reason(e)}.") from None
    if kind_of(folder_st.st_mode) != "a folder":
        raise AvatarRenderError(f"{name}: {shown(folder)} is not a folder.")
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    longest = max(len(os.fsencode(n)) for n in (path.name, *siblings)) + TEMP_EXTRA
    if longest > limit:
        raise AvatarRenderError(f"{name}: the name is too long for this folder (at most {limit - TEMP_EXTRA} "
                                f"bytes with the names written beside it; give a name {longest - limit} bytes "
                                "shorter).")
    try:
        remove(temp_beside(path))
    except OSError as e:
        why = "it is not writable" if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else os_reason(e)
        raise AvatarRenderError(f"{name}: the folder {shown(folder)} cannot take a new file ({why}).") from None


def check_folder(folder: Path, *, what: str, create: bool) -> bool:
    """A folder the user named for a command's outputs (``batch --out``, ``bench --out``): an existing
    folder, or with ``create`` one made now inside an existing folder. Whether it was made."""
    folder = Path(folder)
    name = f"The {what} {shown(folder)}"
    try:
        st = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except ValueError:
        raise AvatarRenderError(f"{name} is not a valid path (it holds a NUL byte).") from None
    except OSError as e:
        raise AvatarRenderError(f"{name} cannot be used: {os_reason(e)}.") from None
    if st is not None:
        if kind_of(st.st_mode) != "a folder":
            raise AvatarRenderError(f"{name} is not a folder; give a folder.")
        return False
    if not create:
        raise AvatarRenderError(f"{name} does not exist; create it first.")
    if not folder.parent.is_dir():
        raise AvatarRenderError(f"{name} does not exist, nor does the folder {shown(folder.parent)} it would be "
                                "made in; create that first.")
    try:
        folder.mkdir()
    except OSError as e:
        raise AvatarRenderError(f"Cannot create the {what} {shown(folder)}: {os_reason(e)}.") from None
    return True


def inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` lies under ``folder`` once links and ``..`` are resolved."""
    try:
        Path(path).resolve().relative_to(Path(folder).resolve())
    except (ValueError, OSError, RuntimeError):  # (RuntimeError: a link loop, before Python 3.13)
        return False
    return True
