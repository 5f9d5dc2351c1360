"""The paths a render writes beside its output, the checks made before anything is written, and
putting the finished file in place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from avatar_render.errors import AvatarRenderError
from avatar_render.job.journal import Journal, journal_path


def partial_path(output: Path) -> Path:
    """Where a render in progress is written before it is moved into place."""
    return output.with_name(output.stem + ".partial" + output.suffix)


def check_output(output: Path, *, force: bool) -> None:
    if output.is_dir():
        raise AvatarRenderError(f"Output '{output}' is a directory; give a file name ending in .mp4.")
    if output.suffix.lower() != ".mp4":
        raise AvatarRenderError(f"Output '{output}' must be a file name ending in .mp4.")
    if output.exists() and not force:
        raise AvatarRenderError(f"Output '{output}' already exists; pass --force to overwrite it.")
    parent = output.parent
    if parent.exists() and not parent.is_dir():
        raise AvatarRenderError(f"Cannot write '{output}': '{parent}' is a file, not a directory.")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AvatarRenderError(f"Cannot create the output directory '{parent}': {e.strerror or e}.") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AvatarRenderError(f"Cannot write to the output directory '{parent}'.")


def check_report(report: Optional[Path], output: Path) -> None:
    if report is None:
        return
    if report.resolve() == output.resolve() or report.is_dir() or not report.parent.is_dir():
        raise AvatarRenderError(f"Cannot write the report to '{report}': give a file in an existing directory.")


def move_into_place(src: Path, dst: Path, *, partial: Path, force: bool) -> None:
    """Rename ``src`` to ``dst``; without ``force`` never over a file that appeared meanwhile."""
    if force:
        os.replace(src, dst)
        return
    try:
        os.link(src, dst)  # fails if dst exists, unlike rename
    except FileExistsError:
        raise AvatarRenderError(f"'{dst}' was created by something else during the render and is kept; the new video is in '{partial}'.") from None
    except OSError:  # no hard links here
        if dst.exists():
            raise AvatarRenderError(f"'{dst}' was created by something else during the render and is kept; the new video is in '{partial}'.") from None
        os.replace(src, dst)
    else:
        src.unlink()


def forget_empty_render(output: Path) -> None:
    """Remove the partial file and journal of a render that committed no frame (those that did are
    kept for a resume, as after any crash). Best effort: runs when another process ended this one."""
    folder = journal_path(output)
    commit = Journal(folder, lock_fd=-1).commit_info if folder.is_dir() else None  # read only, no lock
    if commit is None or not commit.frames:
        partial_path(output).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
