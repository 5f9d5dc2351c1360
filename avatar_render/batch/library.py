"""What the batch uses of the rest of the library, in one place: it calls the api like any script would."""

from __future__ import annotations

from pathlib import Path

from avatar_render.api import RenderRequest, render
from avatar_render.distributed.launch import is_writer_process
from avatar_render.stop import RenderStopped, StopNow, StopSignals

__all__ = ["RenderRequest", "RenderStopped", "StopNow", "StopSignals", "is_writer_process", "partial_path", "render"]


def partial_path(output: Path) -> Path:
    """Where an interrupted render of ``output`` left its video (``NAME.partial.mp4``, as the README documents)."""
    return output.with_name(output.stem + ".partial" + output.suffix)
