"""One job, rendered through the library API like any script would; run as its own process by the
local pool (``python -m avatar_render.batch.worker SPEC_JSON``, also under torchrun) or inside a Ray task.

The process speaks JSON lines on stdout, each prefixed with ``EVENT_PREFIX`` (other output is ignored):
``progress``, ``message``, then one of ``done`` (the render report), ``failed`` (one sentence) or
``stopped``. Standard input takes ``stop`` (go on to the next keyframe, keep the journal) and ``now``
(stop at once); its end counts as ``stop``, so a worker whose batch died does not go on alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from avatar_render.batch.jobs import EVENT_PREFIX, JobSpec
from avatar_render.errors import AvatarRenderError
from avatar_render.files.write import create_new, make_folder

Emit = Callable[[dict[str, Any]], None]


def run_job(spec: JobSpec, *, emit: Emit, should_stop: Optional[Callable[[], bool]] = None) -> dict[str, Any]:
    """Render the job; returns the final event (done, failed or stopped). Unexpected errors are
    turned into a failure with their type and message (the traceback goes to stderr)."""
    from avatar_render.api import RenderRequest, RenderStopped, render, render_paths
    from avatar_render.config import load_config

    def on_progress(p) -> None:
        emit({"event": "progress", **dataclasses.asdict(p)})

    def on_message(level: str, text: str) -> None:
        emit({"event": "message", "level": level, "text": text})

    try:
        cfg = load_config(Path(spec.config) if spec.config else None, tuple(spec.overrides))
        force = spec.force
        # resume when the job left a partial render (else the api would say there is nothing to resume)
        resume = spec.resume and render_paths(Path(spec.output)).partial.exists()
        if spec.retry_marker is not None:
            marker = Path(spec.retry_marker)
            try:
                make_folder(marker.parent)  # (in the batch's own folder)
                create_new(marker).close()
            except FileExistsError:  # an earlier attempt of this job died: go on from its journal
                resume = True
        request = RenderRequest(
            reference=Path(spec.reference),
            audio=Path(spec.audio),
            output=Path(spec.output),
            config=cfg,
            force=force,
            resume=resume,
            report=Path(spec.report),
        )
        report = render(request, on_progress=on_progress, on_message=on_message, should_stop=should_stop)
    except AvatarRenderError as e:
        return {"event": "failed", "reason": _for_batch(str(e))}
    except RenderStopped as e:
        reason = f"Stopped after {e.frames} frames ({e.seconds:.1f} s); running the batch again resumes it."
        if not e.frames:
            reason = "Stopped before its first chunk was written."
        return {"event": "stopped", "reason": reason, "frames": e.frames}
    except Exception as e:  # noqa: BLE001 - a job's bug must not take the batch down
        traceback.print_exc()
        return {"event": "failed", "reason": f"Unexpected internal error ({type(e).__name__}: {e})."}
    return {"event": "done", "report": dataclasses.asdict(report), "processes": report.processes}


def _for_batch(message: str) -> str:
    """The render's advice, as it reads for a batch: running the batch again resumes the job by itself."""
    return message.replace("run the same command with --resume", "run the batch again")


class _Control:
    """Stop requests from signals and from the batch on stdin: the first asks for a stop at the
    next keyframe, any later one stops at once (StopSignals does the raising)."""

    def __init__(self, stopping) -> None:
        self.stopping = stopping
        self.lock = threading.Lock()
        self.closed = False  # the render is over: nothing left to stop

    def request(self, *, at_once: bool) -> None:
        with self.lock:
            first = self.stopping.signum is None
            if first:
                self.stopping.signum = signal.SIGTERM
        if at_once and not first and not self.closed:
            os.kill(os.getpid(), signal.SIGINT)  # the handler sees a second request and raises StopNow

    def read(self, stream) -> None:
        for line in stream:
            self.request(at_once=line.strip() == "now")
        self.request(at_once=False)


def main(argv: list[str]) -> int:
    from avatar_render.api import StopNow, StopSignals, is_writer_process

    spec = JobSpec.from_json(json.loads(argv[0]))
    writer = is_writer_process()  # under torchrun only process 0 reports
    out = sys.stdout
    lock = threading.Lock()

    def emit(event: dict[str, Any]) -> None:
        if writer:
            with lock:
                out.write(EVENT_PREFIX + json.dumps(event) + "\n")
                out.flush()

    sys.stdout = sys.stderr  # anything else printed goes to the job's log
    stopping = StopSignals()
    control = _Control(stopping)
    if writer:
        threading.Thread(target=control.read, args=(sys.stdin,), daemon=True).start()
    try:
        with stopping:
            final = run_job(spec, emit=emit, should_stop=stopping)
            control.closed = True
    except StopNow:
        final = {"event": "stopped", "reason": "Stopped at once; the journal keeps what was written.", "frames": 0}
    emit(final)
    return {"done": 0, "failed": 1}.get(final["event"], 130)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
