"""The library entry point: ``render(RenderRequest) -> RenderReport``. The CLI is a thin layer over it.

A render writes ``NAME.partial.mp4`` (fragmented, readable while it grows) and a resume journal
``NAME.mp4.journal/`` beside the output; when the last chunk is written, the partial file is copied
into a regular MP4 that is moved into place, and both are removed. A render that stops early (a
signal, a crash, a full disk) leaves them, and ``RenderRequest(resume=True)`` goes on from the last
chunk the journal recorded.

Under ``torchrun`` every process calls ``render`` with the same request: process 0 writes, the others
run the same chunk loop (their share of the models' work) and drop their frames; all return process
0's report.
"""

from __future__ import annotations

import dataclasses
from functools import partial as bind
from pathlib import Path
from typing import Callable, Optional

from avatar_render.distributed.device_mesh import Launch
from avatar_render.distributed.launch import agree, broadcast, is_writer_process, session
from avatar_render.errors import AvatarRenderError
from avatar_render.files.render_paths import render_paths
from avatar_render.io.audio_stream import is_stream
from avatar_render.job.output import forget_empty_render
from avatar_render.job.plan import RenderPlan, plan_render
from avatar_render.job.request import LiveOptions, OnMessage, Progress, RenderReport, RenderRequest
from avatar_render.job.run import finished_render, run_job
from avatar_render.job.setup import follow
from avatar_render.job.stop import RenderStopped, StopNow, StopSignals, stopping_notice
from avatar_render.telemetry import Telemetry

__all__ = ["LiveOptions", "Progress", "RenderPlan", "RenderReport", "RenderRequest", "RenderStopped", "StopNow",
           "StopSignals", "is_writer_process", "plan_render", "render", "render_paths", "stopping_notice"]


def render(
    request: RenderRequest, *, on_progress: Optional[Callable[[Progress], None]] = None,
    on_message: Optional[OnMessage] = None, should_stop: Optional[Callable[[], bool]] = None,
    telemetry: Optional[Telemetry] = None,
) -> RenderReport:
    """Render one talking-avatar MP4. Raises AvatarRenderError for anything the user can fix; an
    existing output is only replaced when the new one is complete. When ``should_stop()`` turns true
    the render stops at the next resume point (a keyframe: every ``video.gop_seconds``) and raises
    RenderStopped (the journal is kept).
    ``telemetry`` measures the render (a fresh one by default; a caller's is left open)."""
    cfg = request.config
    launch = Launch.from_env()
    writes = launch.rank == 0
    with session(launch, sp=cfg.dist.sp, device=cfg.model.device,
                 on_abort=bind(forget_empty_render, Path(request.output))
                 if writes and request.output is not None else None) as mesh:
        if mesh.distributed and is_stream(request.audio):
            raise AvatarRenderError("A session (its audio a stream) runs in one process: its stream cannot be read "
                                    "by every process of a launch; run it without torchrun.")
        agree(mesh, "seed and config", {"seed": cfg.seed, "config": repr(cfg)})
        say = on_message or (lambda level, text: None)
        # A render found finished (killed while being moved into place) needs no chunk loop: every process hears so.
        finished = broadcast(mesh, finished_render(request, say) if mesh.is_writer else None)
        if finished is not None:
            return dataclasses.replace(finished, processes=mesh.world)
        if not mesh.is_writer:
            follow(cfg, Path(request.reference), Path(request.audio), mesh)
            return broadcast(mesh, None)
        if mesh.distributed:
            say("info", mesh.affinity)
        own = telemetry is None
        telemetry = telemetry or Telemetry(keep_records=request.report is not None)
        try:
            report = run_job(request, mesh, telemetry=telemetry, on_progress=on_progress, on_message=say,
                             should_stop=should_stop or (lambda: False))
        finally:
            if own:
                telemetry.close()
        return broadcast(mesh, dataclasses.replace(report, processes=mesh.world))
