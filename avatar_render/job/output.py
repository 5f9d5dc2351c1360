"""The paths a render writes beside its output, what it checks before writing anything, and putting
the finished file in place.

A render writes only what it creates and removes only what it wrote: ``NAME.partial.mp4`` and the
journal ``NAME.mp4.journal/`` (recognised by its marker), the report and, at the end, the output.
It never writes through a symbolic link, never over one of its inputs, and refuses a partial file or a
journal path that holds something it did not make."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Optional

from avatar_render.errors import AvatarRenderError
from avatar_render.files import shown
from avatar_render.job.journal import Journal, check_ours, journal_path


def partial_path(output: Path) -> Path:
    """Where a render in progress is written before it is moved into place."""
    return output.with_name(output.stem + ".partial" + output.suffix)


def check_output(output: Path, *, force: bool) -> None:
    """The output's name and folder, before anything is written (an existing output, a link there
    included, is only replaced with ``force``, and then as a whole: never written through)."""
    if _lstat_is(output, stat.S_ISDIR) or (output.is_symlink() and output.is_dir()):
        raise AvatarRenderError(f"Output {shown(output)} is a directory; give a file name ending in .mp4.")
    if output.suffix.lower() != ".mp4":
        raise AvatarRenderError(f"Output {shown(output)} must be a file name ending in .mp4.")
    if os.path.lexists(output) and not force:
        what = "is a symbolic link" if output.is_symlink() else "already exists"
        raise AvatarRenderError(f"Output {shown(output)} {what}; pass --force to replace it.")
    parent = output.parent
    if parent.exists() and not parent.is_dir():
        raise AvatarRenderError(f"Cannot write {shown(output)}: {shown(parent)} is a file, not a directory.")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AvatarRenderError(f"Cannot create the output directory {shown(parent)}: {e.strerror or e}.") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AvatarRenderError(f"Cannot write to the output directory {shown(parent)}.")
    _check_name_length(output)


def _check_name_length(output: Path) -> None:
    """The render's own names beside the output must fit the folder's file-name limit too."""
    try:
        limit = os.pathconf(output.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    longest = max(len(os.fsencode(p.name)) for p in (output, partial_path(output), journal_path(output)))
    if longest > limit:
        raise AvatarRenderError(
            f"The output name {shown(output.name)} is too long: with the render's '.partial' and '.journal' names "
            f"beside it, it passes this folder's limit of {limit} bytes per name; use a name at least "
            f"{longest - limit} bytes shorter."
        )


def check_report(report: Optional[Path], output: Optional[Path], *, force: bool) -> None:
    """The report's path, before the first frame: a file in a writable folder, not the output."""
    if report is None:
        return
    if _lstat_is(report, stat.S_ISDIR):
        raise AvatarRenderError(f"Cannot write the report to {shown(report)}: it is a folder; give a file name.")
    if not report.parent.is_dir():
        raise AvatarRenderError(
            f"Cannot write the report to {shown(report)}: the folder {shown(report.parent)} does not exist.")
    if not os.access(report.parent, os.W_OK | os.X_OK):
        raise AvatarRenderError(
            f"Cannot write the report to {shown(report)}: the folder {shown(report.parent)} is not writable.")
    if report.is_symlink() and not force:
        raise AvatarRenderError(f"The report path {shown(report)} is a symbolic link; pass --force to replace the link "
                                "(it is never written through).")
    if output is not None and (os.path.abspath(report) == os.path.abspath(output) or _same_file(report, output)):
        raise AvatarRenderError(
            f"The report and the output are the same file {shown(report)}; give them different names.")


def check_not_inputs(inputs: dict[str, Path], outputs: dict[str, Path]) -> None:
    """No path the render writes may be one of its inputs, by name or through links."""
    for what, target in outputs.items():
        for name, source in inputs.items():
            if os.path.abspath(target) == os.path.abspath(source) or _same_file(target, source):
                raise AvatarRenderError(f"The {what} {shown(target)} is the {name} file; the render never writes over "
                                        "its inputs, give another name.")


def check_partial(output: Path, journal: Optional[Journal]) -> None:
    """A partial file without this render's journal is somebody else's: refused, whatever the flags."""
    partial = partial_path(output)
    if not os.path.lexists(partial):
        return
    if journal is None:
        raise AvatarRenderError(
            f"{shown(partial)} exists but is not an interrupted render of {shown(output.name)} (there is no resume "
            "journal beside it); the render would write there, so move it away first."
        )
    if partial.is_symlink() or not partial.is_file():
        raise AvatarRenderError(
            f"{shown(partial)} is not a file this render made (a link or a folder); move it away first.")


def move_into_place(src: Path, dst: Path, *, partial: Path, force: bool) -> None:
    """Rename ``src`` to ``dst``; without ``force`` never over anything that appeared meanwhile (a
    link included); with it, whatever is at ``dst`` is replaced as a whole, never written through."""
    if force:
        os.replace(src, dst)
        return
    try:
        os.link(src, dst)  # fails if dst exists, unlike rename
    except FileExistsError:
        raise AvatarRenderError(f"{shown(dst)} was created by something else during the render and is kept; the new "
                                f"video is in {shown(partial)}.") from None
    except OSError:  # no hard links here
        if os.path.lexists(dst):
            raise AvatarRenderError(f"{shown(dst)} was created by something else during the render and is kept; the "
                                    f"new video is in {shown(partial)}.") from None
        os.replace(src, dst)
    else:
        src.unlink()


def finished_before(output: Path) -> bool:
    """Whether an earlier render of ``output`` had put it in place and stopped before tidying up
    (its journal still holds the finished file, the same file as the output); then tidy up."""
    folder = journal_path(output)
    complete = folder / "complete.mp4"
    try:
        check_ours(folder)
    except (AvatarRenderError, OSError):  # (OSError: a name too long, said by check_output)
        return False
    if not (os.path.lexists(output) and complete.is_file() and not output.is_symlink()
            and _same_file(output, complete)):
        return False
    partial = partial_path(output)
    if partial.is_file() and not partial.is_symlink():
        partial.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    return True


def forget_empty_render(output: Path) -> None:
    """Remove the partial file and journal of a render that committed no frame (those that did are
    kept for a resume, as after any crash). Best effort: runs when another process ended this one."""
    folder = journal_path(output)
    try:
        check_ours(folder)
    except AvatarRenderError:
        return
    commit = Journal(folder, lock_fd=-1).commit_info  # read only, no lock
    if commit is None or not commit.frames:
        partial = partial_path(output)
        if not partial.is_symlink():
            partial.unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _lstat_is(path: Path, kind) -> bool:
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False
