"""The paths a render writes beside its output, what it checks before writing anything, and putting
the finished file in place.

A render writes only what it creates and removes only what it wrote: ``NAME.partial.mp4`` and the
journal ``NAME.mp4.journal/`` (recognised by its marker), the report and, at the end, the output.
It never writes through a symbolic link, never over one of its inputs, and refuses a partial file or a
journal path that holds something it did not make."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import same_file, shown
from avatar_render.files.render_paths import render_paths
from avatar_render.files.targets import Inputs, check_target
from avatar_render.files.write import link_into_place, remove
from avatar_render.io.audio_stream import is_stream
from avatar_render.job.journal import COMPLETE, Journal, check_ours, remove_journal
from avatar_render.telemetry import REPORT


def check_output(output: Path, *, force: bool, resume: bool = False) -> None:
    """The output's name and folder, before anything is written (an existing output, a link there
    included, is only replaced with ``force``, and then as a whole: never written through). Its folder
    must exist: a render makes no folder."""
    if resume and not force and os.path.lexists(output) and os.path.lexists(render_paths(output).journal):
        raise AvatarRenderError(f"The output {shown(output)} exists beside an interrupted render of it: pass --force "
                                "--resume to finish that render and replace the output with it, or move the output "
                                "away first.")
    if _is_folder(output):
        raise AvatarRenderError(f"Output {shown(output)} is a folder; give a file name ending in .mp4.")
    if output.suffix.lower() != ".mp4":
        raise AvatarRenderError(f"Output {shown(output)} must be a file name ending in .mp4.")
    check_target(output, what="output", force=force,
                 siblings=render_paths(output).beside())


def check_finished(output: Path, *, resume: bool, force: bool) -> None:
    """``--resume`` of an output that is there and has no interrupted render beside it: nothing to resume."""
    own = render_paths(output)
    if resume and not force and os.path.lexists(output) and not os.path.lexists(own.partial) \
            and not os.path.lexists(own.journal):
        raise AvatarRenderError(f"Nothing to resume: {shown(output)} is complete (no interrupted render of it is "
                                "left); pass --force instead of --resume to render it again.")


def check_report(report: Optional[Path], *, force: bool, inputs: Inputs) -> None:
    """The report's path, before the first frame: a file in a folder that takes it, not an input or
    another output; an existing file is replaced only if it is a report of ours (or with ``force``)."""
    if report is not None:
        check_target(report, what="report", force=force, kind=REPORT, inputs=inputs)


def request_inputs(request) -> Inputs:
    """What a render reads (``request``: a RenderRequest): none of its outputs may be one of them."""
    audio = None if is_stream(request.audio) else Path(request.audio)
    return Inputs({"reference file": Path(request.reference), "audio file": audio,
                   "config file": None if request.config_file is None else Path(request.config_file)})


def check_partial(output: Path, journal: Optional[Journal]) -> None:
    """A partial file without this render's journal is somebody else's: refused, whatever the flags."""
    partial = render_paths(output).partial
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
    """Put ``src`` at ``dst``, ``src`` kept until the journal it lies in is removed (``finished_before`` tells
    the finished output by it); without ``force`` never over anything that appeared meanwhile (a link included);
    with it, whatever is at ``dst`` is replaced as a whole, never written through."""
    try:
        link_into_place(src, dst, replace=force)
    except FileExistsError:
        raise AvatarRenderError(f"{shown(dst)} was created by something else during the render and is kept; the new "
                                f"video is in {shown(partial)}.") from None


def finished_before(output: Path) -> bool:
    """Whether an earlier render of ``output`` had put it in place and stopped before tidying up
    (its journal still holds the finished file, the same file as the output); then tidy up."""
    folder = render_paths(output).journal
    complete = folder / COMPLETE
    try:
        check_ours(folder)
    except (AvatarRenderError, OSError):  # (OSError: a name too long, said by check_output)
        return False
    if not (os.path.lexists(output) and complete.is_file() and not output.is_symlink()
            and same_file(output, complete)):
        return False
    partial = render_paths(output).partial
    if partial.is_file() and not partial.is_symlink():
        remove(partial)
    remove_journal(folder)
    return True


def forget_empty_render(output: Path) -> None:
    """Remove the partial file and journal of a render that committed no frame (those that did are
    kept for a resume, as after any crash). Best effort: runs when another process ended this one."""
    folder = render_paths(output).journal
    try:
        check_ours(folder)
    except AvatarRenderError:
        return
    commit = Journal(folder, lock_fd=-1).commit_info  # read only, no lock
    if commit is None or not commit.frames:
        partial = render_paths(output).partial
        if not partial.is_symlink():
            remove(partial)
        remove_journal(folder)


def _is_folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:  # a name too long: said by check_target
        return False
