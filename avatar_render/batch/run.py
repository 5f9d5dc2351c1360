"""``run_batch(BatchRequest) -> BatchResult``: read the jobs, take this shard's, decide from the ledger
what to skip, render the rest (on this machine or on Ray), record each outcome, write the summary."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import avatar_render.batch.ledger as ledger_mod
from avatar_render.api import render_paths
from avatar_render.backends import backend
from avatar_render.batch.events import JobFinished, OnEvent, Planned
from avatar_render.batch.jobs import ELSEWHERE, Job, JobSpec, Outcome
from avatar_render.batch.ledger import Decision, Ledger, batch_dir, own_batch_dir, own_folder
from avatar_render.batch.locks import JobLocks
from avatar_render.batch.pool import LocalPool, Task
from avatar_render.batch.shard import Shard, slurm_shard
from avatar_render.batch.sources import load_jobs
from avatar_render.batch.summary import SUMMARY, summary_record, thumbnail, write_summary
from avatar_render.config import Config, load_config
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import os_reason, shown
from avatar_render.files.targets import check_folder, check_target
from avatar_render.files.write import make_folder, remove
from avatar_render.io.audio import estimated_seconds
from avatar_render.io.reference import open_reference


@dataclass(frozen=True)
class BatchRequest:
    source: Path  # a folder or a .csv/.jsonl manifest
    out: Path  # the videos (by default), the summary and the ledger
    config: Optional[Path] = None
    overrides: tuple[str, ...] = ()  # for every job, before each job's own
    ref: Optional[Path] = None  # (folder source) one reference for every audio file
    jobs: Optional[int] = None  # run side by side; None: CPU cores for the preview backend, GPUs for the diffusion one
    procs_per_job: int = 1  # processes (GPUs) per job, launched with torchrun when > 1
    shard: Optional[Shard] = None  # None: the Slurm array task's part when there is one, else all jobs
    force: bool = False  # render every job again, replacing outputs and discarding partial renders
    ray: bool = False  # run the jobs as Ray tasks (on Ray's default cluster, or a new local one), not on this machine
    ray_address: Optional[str] = None  # the Ray cluster (implies ray)
    cpus_per_job: float = 1.0  # (Ray) CPUs a job's task asks for
    retries: int = 3  # (Ray) times a task whose worker died is run again


    @property
    def on_ray(self) -> bool:
        return self.ray or self.ray_address is not None


@dataclass(frozen=True)
class BatchPlan:
    jobs: tuple[Job, ...]
    unpaired: tuple[Path, ...]
    decisions: dict[str, Decision]
    identities: dict[str, dict]  # key -> identity and input fingerprints
    shard: Optional[Shard]
    config: Config
    frames_expected: dict[str, Optional[int]] = field(default_factory=dict)  # key -> frames (from metadata)


@dataclass(frozen=True)
class BatchResult:
    outcomes: tuple[Outcome, ...]
    unpaired: tuple[Path, ...]
    summary_json: Path
    summary_html: Path
    stopped: bool

    @property
    def failed(self) -> int:
        return sum(o.status == "failed" for o in self.outcomes)


def plan_batch(request: BatchRequest) -> BatchPlan:
    """Everything that can be refused is refused here, before any job runs."""
    out = Path(request.out)
    if out.exists() and not out.is_dir():
        raise AvatarRenderError(f"--out '{out}' is a file; give a folder.")
    if request.on_ray and request.procs_per_job > 1:
        raise AvatarRenderError(
            "--procs-per-job runs a job over several processes of this machine; with --ray each job is one Ray task."
        )
    config = Path(request.config).resolve() if request.config else None
    base = load_config(config, request.overrides)
    if request.ref is not None:  # (the one reference of every job: refused once, before any job, if it is none)
        open_reference(Path(request.ref), fps=base.fps, timing=base.reference.timing)
    listed = load_jobs(Path(request.source), out_dir=out.resolve(), ref=request.ref)
    configs: dict[tuple[str, ...], Config] = {(): base}
    for job in listed.jobs:  # each distinct set of overrides once
        if job.overrides not in configs:
            try:
                configs[job.overrides] = load_config(config, request.overrides + job.overrides)
            except AvatarRenderError as e:
                raise AvatarRenderError(f"{job.origin}: {e}") from None
    shard = request.shard or slurm_shard()
    jobs = tuple(shard.select(listed.jobs)) if shard else listed.jobs
    ledger = Ledger(out)
    decisions, identities, frames = {}, {}, {}
    for job in jobs:
        frames[job.key] = expected_frames(job.audio, configs[job.overrides])
        known = ledger.get(job) or {}
        words = configs[job.overrides].preview.transcript  # (its words changed: rendered again, as its inputs)
        try:
            ref_fp = ledger_mod.fingerprint(job.reference, known.get("reference_fp"))
            audio_fp = ledger_mod.fingerprint(job.audio, known.get("audio_fp"))
            words_fp = ledger_mod.fingerprint(Path(words)) if words else None
        except OSError as e:
            raise AvatarRenderError(f"{job.origin}: cannot read '{e.filename}': {e.strerror}.") from None
        ident = ledger_mod.identity(ledger_mod.config_digest(configs[job.overrides]), ref_fp, audio_fp, words_fp)
        identities[job.key] = {"identity": ident, "reference_fp": ref_fp, "audio_fp": audio_fp}
        decisions[job.key] = ledger.decide(
            job, ident, partial_exists=render_paths(job.output).partial.exists(), force=request.force
        )
    return BatchPlan(
        jobs=jobs, unpaired=listed.unpaired, decisions=decisions, identities=identities, shard=shard, config=base,
        frames_expected=frames,
    )


def expected_frames(audio: Path, cfg: Config) -> Optional[int]:
    """The frames a job will have, from its audio's metadata (None when it does not say)."""
    try:
        seconds = estimated_seconds(audio)
    except AvatarRenderError:  # the job fails in its turn, with its own message
        return None
    return None if seconds is None else math.ceil(seconds * cfg.fps)


def run_batch(
    request: BatchRequest, *, on_event: Optional[OnEvent] = None, should_stop: Optional[Callable[[], bool]] = None
) -> BatchResult:
    """Render the batch; a failed job is recorded and the others go on. When ``should_stop()`` turns
    true the running jobs stop at their next keyframe (their journals kept) and no more start."""
    t0, started = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S%z")
    plan = plan_batch(request)
    emit = on_event or (lambda event: None)
    check_folder(Path(request.out), what="output folder", create=True)
    out = Path(request.out).resolve()
    summary_path = out / f"{_summary_name(plan.shard)}.json"
    for path in (summary_path, summary_path.with_suffix(".html")):
        check_target(path, what="batch summary", force=request.force, kind=SUMMARY)
    files = own_batch_dir(out)
    with JobLocks(files) as locks:
        return _run_locked(request, plan, locks, out=out, files=files, summary_path=summary_path, emit=emit,
                           should_stop=should_stop, t0=t0, started=started)


def _run_locked(request: BatchRequest, plan: BatchPlan, locks: JobLocks, *, out: Path, files: Path, summary_path: Path,
                emit: OnEvent, should_stop: Optional[Callable[[], bool]], t0: float, started: str) -> BatchResult:
    ledger = Ledger(out)
    outcomes: dict[str, Outcome] = {}
    tasks = []
    for job in plan.jobs:
        decision = plan.decisions[job.key]
        if decision.action != "skip":
            if not locks.take(job.key):
                outcomes[job.key] = Outcome(job, "skipped", reason=ELSEWHERE)
                continue
            # decided again now that the job is ours: another batch may have finished it meanwhile
            decision = ledger.decide(job, plan.identities[job.key]["identity"],
                                     partial_exists=render_paths(job.output).partial.exists(), force=request.force)
        if decision.action == "skip":  # the figures of the run that rendered it, marked as such
            record = ledger.get(job) or {}
            kept = {
                k: v
                for k, v in record.get("summary", {}).items()
                if k in ("frames", "duration_s", "generated_fps", "wall_s", "resumed_frames")
            }
            outcomes[job.key] = Outcome(
                job, "skipped", reason=decision.reason, **kept, report=files / "reports" / f"{job.key}.json",
                figures_from=str(record.get("updated", "")) if kept else "",
            )
        elif decision.action == "refuse":
            outcomes[job.key] = Outcome(job, "failed", reason=decision.reason)
        else:
            try:
                tasks.append(_task(job, decision, request, files, started_at=t0))
            except AvatarRenderError as e:
                outcomes[job.key] = Outcome(job, "failed", reason=str(e))
    workers = max(1, min(request.jobs or default_workers(plan.config, request.procs_per_job), len(tasks) or 1))
    launch = _launcher(request, plan.config, workers)
    emit(
        Planned(
            to_run=tuple(t.job for t in tasks),
            skipped=tuple(o for o in outcomes.values() if o.status == "skipped"),
            refused=tuple(o for o in outcomes.values() if o.status == "failed"),
            unpaired=plan.unpaired,
            frames_expected=tuple(plan.frames_expected.get(t.job.key) for t in tasks),
            workers=0 if request.on_ray else workers,
            where=f"Ray ({request.ray_address or 'its default cluster'})" if request.on_ray else "this machine",
        )
    )

    def finished(task: Task, final: dict, wall_s: float) -> None:
        outcome = _outcome(task, final, wall_s)
        outcomes[task.job.key] = outcome
        ident = plan.identities[task.job.key]
        if outcome.status in ("done", "resumed"):
            summary = {
                k: getattr(outcome, k) for k in ("frames", "duration_s", "generated_fps", "wall_s", "resumed_frames")
            }
            ledger.put(
                task.job, status="done", **ident, output_stat=ledger_mod.file_stat(task.job.output), summary=summary
            )
        elif outcome.status != "not run":
            ledger.put(task.job, status=outcome.status, **ident, reason=outcome.reason)
        emit(JobFinished(outcome))

    for task in tasks:
        ledger.put(task.job, status="started", **plan.identities[task.job.key])
    stopped = (
        launch(tasks, on_event=emit, on_finished=finished, should_stop=should_stop or (lambda: False))
        if tasks
        else False
    )
    for marker in (files / "attempts").glob("*"):
        remove(marker)
    ordered = tuple(outcomes[job.key] for job in plan.jobs)
    meta = {
        "source": str(request.source),
        "out": str(out),
        "shard": plan.shard.label if plan.shard else None,
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": round(time.monotonic() - t0, 3),
        "workers": workers,
        "where": "ray" if request.on_ray else "local",
        "stopped": stopped,
        "config": str(request.config) if request.config else None,
        "overrides": list(request.overrides),
        "unpaired": [str(p) for p in plan.unpaired],
    }
    json_path, html_path = _summary(ordered, meta, out, summary_path)
    return BatchResult(
        outcomes=ordered, unpaired=plan.unpaired, summary_json=json_path, summary_html=html_path, stopped=stopped
    )


def _launcher(request: BatchRequest, cfg: Config, workers: int) -> Callable[..., bool]:
    """How the tasks run: Ray tasks, or a pool of processes here (GPUs shared out for the diffusion backend)."""
    if request.on_ray:
        from avatar_render.batch.ray_launcher import run_on_ray

        return partial(
            run_on_ray,
            address=request.ray_address,
            cpus_per_job=request.cpus_per_job,
            gpus_per_job=1.0 if backend(cfg.backend).gpu else 0.0,
            retries=request.retries,
        )
    devices = visible_gpus() or None if backend(cfg.backend).gpu else None
    if devices is not None and len(devices) < workers * request.procs_per_job:
        raise AvatarRenderError(
            f"{workers} jobs of {request.procs_per_job} GPUs each need {workers * request.procs_per_job} GPUs; "
            f"{len(devices)} are visible."
        )
    return LocalPool(workers=workers, procs_per_job=request.procs_per_job, devices=devices).run


def _summary_name(shard: Optional[Shard]) -> str:
    return "batch-summary" + (f".shard-{shard.index}-of-{shard.count}" if shard else "")


def _summary(outcomes: tuple[Outcome, ...], meta: dict, out: Path, path: Path) -> tuple[Path, Path]:
    shown_jobs = [o for o in outcomes if o.status in ("done", "resumed", "skipped") and o.job.output.exists()]
    thumbs_dir = own_folder(batch_dir(out) / "thumbs") if shown_jobs else None
    thumbs = {o.job.key: thumbnail(o.job.output, thumbs_dir / f"{o.job.key}.jpg") for o in shown_jobs}
    return write_summary(summary_record(outcomes, meta=meta, out_dir=out, thumbs=thumbs), path)


def _task(job: Job, decision: Decision, request: BatchRequest, files: Path, *, started_at: float) -> Task:
    marker = None
    if request.on_ray and decision.force:  # a retry must not throw away what its first attempt wrote
        marker = str(files / "attempts" / f"{job.key}.{os.getpid()}-{started_at:.0f}")
    spec = JobSpec(
        reference=str(job.reference),
        audio=str(job.audio),
        output=str(job.output),
        report=str(files / "reports" / f"{job.key}.json"),
        config=str(Path(request.config).resolve()) if request.config else None,
        overrides=request.overrides + job.overrides,
        force=decision.force,
        resume=not decision.force,
        retry_marker=marker,
    )
    own_folder(files / "reports")
    try:
        make_folder(job.output.parent, parents=True)  # (inside the output folder: the manifest's rule)
    except OSError as e:
        raise AvatarRenderError(f"Cannot create its folder {shown(job.output.parent)}: {os_reason(e)}.") from None
    return Task(job=job, spec=spec, log=own_folder(files / "logs") / f"{job.key}.log")


def _outcome(task: Task, final: dict, wall_s: float) -> Outcome:
    kind, job = final.get("event"), task.job
    if kind == "done":
        rep = final["report"]
        return Outcome(
            job,
            "resumed" if rep.get("resumed_frames") else "done",
            frames=rep["frames"],
            duration_s=rep["duration_s"],
            generated_fps=rep["generated_fps"],
            wall_s=round(wall_s, 3),
            resumed_frames=rep.get("resumed_frames", 0),
            processes=final.get("processes", 1),
            report=Path(task.spec.report),
        )
    if kind in ("failed", "stopped", "not run"):
        return Outcome(job, kind, reason=final.get("reason", ""), wall_s=round(wall_s, 3))
    return Outcome(
        job, "failed", reason=f"The render process sent an unknown result ({kind}).", wall_s=round(wall_s, 3)
    )


def default_workers(cfg: Config, procs_per_job: int = 1) -> int:
    """Jobs side by side when --jobs is not given: a CPU core each for the preview backend, else
    ``procs_per_job`` GPUs each (one job when no GPU is visible)."""
    if not backend(cfg.backend).gpu:
        return max(1, len(os.sched_getaffinity(0)) // procs_per_job)
    return max(1, len(visible_gpus()) // procs_per_job)


def visible_gpus() -> list[str]:
    """The CUDA devices this process may use, as CUDA_VISIBLE_DEVICES names them."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]
