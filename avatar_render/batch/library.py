"""What the batch uses of the rest of the library, in one place: it calls the api like any script would."""

from __future__ import annotations

from avatar_render.api import RenderRequest, render
from avatar_render.distributed.launch import is_writer_process
from avatar_render.job.output import partial_path
from avatar_render.job.stop import RenderStopped, StopNow, StopSignals

__all__ = ["RenderRequest", "RenderStopped", "StopNow", "StopSignals", "is_writer_process", "partial_path", "render"]
