"""Jobs side by side on this machine, one process each: a crash or a memory blow-up in one job ends
only that job. At most ``workers`` run at once; on GPUs each gets its own ``procs_per_job`` devices
(``CUDA_VISIBLE_DEVICES``) and runs under torchrun when that is more than one."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

from avatar_render.api import StopNow
from avatar_render.batch.events import JobMessage, JobProgress, JobStarted, OnEvent, Stopping
from avatar_render.batch.jobs import EVENT_PREFIX, Job, JobSpec
from avatar_render.files.write import fresh_file

POLL_S = 0.2


@dataclass(frozen=True)
class Task:
    job: Job
    spec: JobSpec
    log: Path  # the worker's stderr


OnFinished = Callable[[Task, dict, float], None]  # the task, its final event, its wall time in seconds


def worker_command(spec: JobSpec, *, procs: int = 1) -> list[str]:
    args = ["-m", "avatar_render.batch.worker", json.dumps(spec.to_json())]
    if procs > 1:  # one request over several processes (and GPUs): the api's torchrun support
        # (its own log folder would be a new torchelastic_* in the temp folder per job, never removed: the
        # worker's stderr is the job's log already)
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
                f"--log-dir={os.devnull}", *args]
    return [sys.executable, *args]


def crash_reason(returncode: int, log: Path) -> str:
    """One sentence for a worker that ended without saying how."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"The render process was killed ({name}); run the batch again to resume it from its journal."
    last = ""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
        last = lines[-1][:200] if lines else ""
    except OSError:
        pass
    return f"The render process exited with code {returncode}" + (f" ({last})." if last else f"; see '{log}'.")


class _Running:
    def __init__(self, task: Task, proc: subprocess.Popen, slot: int) -> None:
        self.task, self.proc, self.slot = task, proc, slot
        self.t0 = time.monotonic()
        self.final: Optional[dict] = None

    def tell(self, word: str) -> None:
        try:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):  # it is ending already
            pass


class LocalPool:
    def __init__(self, *, workers: int, procs_per_job: int = 1, devices: Optional[Sequence[str]] = None) -> None:
        assert workers >= 1 and procs_per_job >= 1
        self.workers, self.procs = workers, procs_per_job
        self.devices = list(devices) if devices else None
        if self.devices is not None:
            assert len(self.devices) >= workers * procs_per_job

    def run(
        self, tasks: Sequence[Task], *, on_event: OnEvent, on_finished: OnFinished, should_stop: Callable[[], bool]
    ) -> bool:
        """Run every task (or, once ``should_stop()`` turns true, let the running ones stop after their
        next keyframe and start no more); returns whether the batch was stopped."""
        pending, running = deque(tasks), {}
        events: queue.Queue = queue.Queue()
        free = list(range(self.workers))
        stopped = at_once = False
        try:
            while running or (pending and not stopped):
                try:
                    while pending and free and not stopped:
                        task, slot = pending.popleft(), free.pop(0)
                        running[id(task)] = self._start(task, slot, events)
                        on_event(JobStarted(task.job))
                    if not stopped and should_stop():
                        stopped = True
                        on_event(Stopping(at_once=False))
                        for r in running.values():
                            r.tell("stop")
                    try:
                        key, event = events.get(timeout=POLL_S)
                    except queue.Empty:
                        continue
                    r = running[key]
                    if event is None:  # its stdout closed: the process is ending
                        code = r.proc.wait()
                        del running[key]
                        free.append(r.slot)
                        r.proc.stdin.close()
                        final = r.final or {"event": "failed", "reason": crash_reason(code, r.task.log)}
                        on_finished(r.task, final, time.monotonic() - r.t0)
                    else:
                        self._handle(r, event, on_event)
                except StopNow:  # a second Ctrl-C: every running job stops at once
                    stopped = True
                    if not at_once:
                        at_once = True
                        on_event(Stopping(at_once=True))
                    for r in running.values():
                        r.tell("now")
            for task in pending:
                on_finished(task, {"event": "not run", "reason": "The batch was stopped before this job started."}, 0.0)
        finally:
            for r in running.values():  # only when something above failed: leave no orphan behind
                r.tell("now")
                try:
                    r.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    r.proc.kill()
        return stopped

    def _start(self, task: Task, slot: int, events: queue.Queue) -> _Running:
        env = dict(os.environ)
        if self.devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices[slot * self.procs : (slot + 1) * self.procs])
        with fresh_file(task.log) as log:  # (in the batch's own folder)
            proc = subprocess.Popen(
                worker_command(task.spec, procs=self.procs),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                start_new_session=True,
            )
        running = _Running(task, proc, slot)
        threading.Thread(target=_read, args=(proc.stdout, id(task), events), daemon=True).start()
        return running

    @staticmethod
    def _handle(r: _Running, event: dict, on_event: OnEvent) -> None:
        kind, job = event.get("event"), r.task.job
        if kind == "progress":
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
        else:
            r.final = event


def _read(stream, key: int, events: queue.Queue) -> None:
    """The worker's events, then None at the end of its output."""
    for line in stream:
        if line.startswith(EVENT_PREFIX):
            try:
                events.put((key, json.loads(line[len(EVENT_PREFIX) :])))
            except ValueError:
                pass
    events.put((key, None))
