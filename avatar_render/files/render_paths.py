"""The paths one render owns beside its output, named in this one place: the job writes them, the
batch looks for an interrupted render through them, the manifest leaves room for their names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PARTIAL, JOURNAL = ".partial", ".journal"
JOURNAL_MARKER = ".avatar-render-journal"  # the file in a journal folder that says this program made it
EXTRA_BYTES = len(PARTIAL) + len(JOURNAL)  # at most this longer than the output's name, the names beside it


@dataclass(frozen=True)
class RenderPaths:
    output: Path  # NAME.mp4, put in place when the last chunk is written
    partial: Path  # NAME.partial.mp4: the render in progress (fragmented, readable while it grows)
    journal: Path  # NAME.mp4.journal/: the resume journal (recognised by its marker)

    def written(self) -> dict[str, Path]:
        """What a render may write, by what it is to the user (for the checks against its inputs)."""
        return {"output": self.output, "partial file": self.partial, "resume journal": self.journal}

    def beside(self) -> tuple[str, str]:
        """The names of the files the render writes beside its output."""
        return self.partial.name, self.journal.name


def render_paths(output: Path) -> RenderPaths:
    output = Path(output)
    return RenderPaths(output=output, partial=output.with_name(output.stem + PARTIAL + output.suffix),
                       journal=output.with_name(output.name + JOURNAL))


def owning_render(path: Path) -> Path | None:
    """The output of the render, interrupted or running, whose partial file ``path`` is or whose journal holds it
    (that journal is there, with its marker); None for any other path."""
    path = Path(path)
    if path.stem.endswith(PARTIAL):
        output = path.with_name(path.stem[: -len(PARTIAL)] + path.suffix)
    elif path.parent.name.endswith(JOURNAL):
        output = path.parent.with_name(path.parent.name[: -len(JOURNAL)])
    else:
        return None
    journal = render_paths(output).journal
    try:
        ours = journal.is_dir() and not journal.is_symlink() and (journal / JOURNAL_MARKER).is_file()
    except OSError:  # (a name too long: the checks after say so)
        return None
    return output if ours else None
