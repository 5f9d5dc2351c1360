"""The same jobs as Ray tasks (``pip install -e ".[ray]"``): Ray places them by their CPU and GPU
needs and runs a task again when its worker dies (``max_retries``); the retry goes on from the job's
journal, as ``--resume`` would. Each task renders through the api in its Ray worker process.

A small actor carries what the tasks report (started, progress, messages) to the driver and the
driver's stop request to the tasks (checked after every chunk, like Ctrl-C for ``render``)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Sequence

from avatar_render.api import StopNow
from avatar_render.batch.events import JobMessage, JobProgress, JobStarted, OnEvent, Stopping
from avatar_render.batch.pool import POLL_S, OnFinished, Task
from avatar_render.errors import AvatarRenderError


def _ray():
    try:
        import ray
    except ImportError:
        raise AvatarRenderError("--ray needs Ray: pip install -e '.[ray]' (or pip install ray).") from None
    return ray


class _Control:
    """(A Ray actor) the tasks' reports, drained by the driver, and the stop level: 0 go on, 1 stop
    at the next keyframe, 2 at once."""

    def __init__(self) -> None:
        self.level = 0
        self.events: list[tuple[str, dict]] = []

    def stop(self, level: int) -> None:
        self.level = max(self.level, level)

    def stopping(self) -> int:
        return self.level

    def report(self, key: str, event: dict) -> None:
        self.events.append((key, event))

    def drain(self) -> list[tuple[str, dict]]:
        events, self.events = self.events, []
        return events


def _task(spec_json: dict, key: str, control: Any) -> dict:
    """(A Ray task) render one job; returns its final event."""
    import ray

    from avatar_render.batch.jobs import JobSpec
    from avatar_render.batch.worker import run_job

    control.report.remote(key, {"event": "started"})
    emit: Callable[[dict], Any] = lambda event: control.report.remote(key, event)  # noqa: E731
    return run_job(JobSpec.from_json(spec_json), emit=emit, should_stop=lambda: ray.get(control.stopping.remote()) > 0)


def run_on_ray(
    tasks: Sequence[Task],
    *,
    address: Optional[str],
    cpus_per_job: float,
    gpus_per_job: float,
    retries: int,
    on_event: OnEvent,
    on_finished: OnFinished,
    should_stop: Callable[[], bool],
) -> bool:
    """Submit every task, report as they go; returns whether the batch was stopped."""
    ray = _ray()
    try:
        ray.init(address=address or None, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise AvatarRenderError(
            f"Cannot reach the Ray cluster{f' at {address}' if address else ''}: {str(e).splitlines()[0]}"
        ) from None
    try:
        control = ray.remote(num_cpus=0)(_Control).remote()
        remote = ray.remote(_task)
        by_key = {t.job.key: t for t in tasks}
        refs = {
            remote.options(
                num_cpus=cpus_per_job,
                num_gpus=gpus_per_job,
                max_retries=retries,
                retry_exceptions=False,
                name=f"avatar-render {t.job.name}",
            ).remote(t.spec.to_json(), t.job.key, control): t
            for t in tasks
        }
        started: dict[str, float] = {}
        stopped = at_once = False
        while refs:
            try:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=POLL_S)
                for key, event in ray.get(control.drain.remote()):
                    _report(by_key[key], event, started, on_event)
                for ref in ready:
                    task = refs.pop(ref)
                    wall = time.monotonic() - started.get(task.job.key, time.monotonic())
                    on_finished(task, _final(ray, ref, retries, started=task.job.key in started), wall)
                if not stopped and should_stop():
                    stopped = True
                    on_event(Stopping(at_once=False))
                    control.stop.remote(1)
                    for ref, task in refs.items():
                        if task.job.key not in started:
                            ray.cancel(ref)
            except StopNow:
                stopped = True
                if not at_once:
                    at_once = True
                    on_event(Stopping(at_once=True))
                    control.stop.remote(2)
                    for ref in refs:
                        ray.cancel(ref)
        return stopped
    finally:
        ray.shutdown()


def _report(task: Task, event: dict, started: dict[str, float], on_event: OnEvent) -> None:
    kind, job = event.get("event"), task.job
    if kind == "started":
        if job.key not in started:  # (a retry reports again)
            started[job.key] = time.monotonic()
            on_event(JobStarted(job))
    elif kind == "progress":
        on_event(
            JobProgress(
                job,
                frames_done=event["frames_done"],
                frames_total=event["frames_total"],
                frames_resumed=event.get("frames_resumed", 0),
                elapsed_s=event["elapsed_s"],
            )
        )
    elif kind == "message":
        on_event(JobMessage(job, level=event["level"], text=event["text"]))


def _final(ray, ref, retries: int, *, started: bool) -> dict:
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError:  # only the driver's stop cancels
        if started:
            return {"event": "stopped", "reason": "Stopped at once with the batch; run it again to resume."}
        return {"event": "not run", "reason": "The batch was stopped before this job started."}
    except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.LocalRayletDiedError) as e:
        return {
            "event": "failed",
            "reason": f"The Ray worker rendering this job died {retries + 1} times "
            f"({type(e).__name__}); run the batch again to resume it from its journal.",
        }
    except ray.exceptions.RayError as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        return {"event": "failed", "reason": f"The Ray task failed: {first.strip()[:300]}"}
