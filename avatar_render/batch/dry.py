"""``batch --dry-run``: the batch's checks (sources, configs, inputs readable, the ledger's decisions) and
each job's plan, with nothing written."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from avatar_render.api import render_paths
from avatar_render.backends import backend
from avatar_render.batch.run import BatchRequest, plan_batch
from avatar_render.batch.sources import TRANSCRIPT_SUFFIXES
from avatar_render.config import load_config
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.io.audio import AudioReader
from avatar_render.io.reference import open_reference
from avatar_render.preview.script import read_transcript


@dataclass(frozen=True)
class JobPlan:
    name: str
    action: str  # render | resume | skip | fail; unused: a file of the folder no job takes (not a job)
    reason: str  # skip: why; fail: the sentence the job would fail with; render, resume: its transcript, if any
    frames: Optional[int]  # from the audio's metadata


def dry_run_batch(request: BatchRequest) -> tuple[JobPlan, ...]:
    """What ``run_batch`` would do with each job of this shard; raises what it would refuse at once."""
    out = Path(request.out)
    if not out.is_dir() and not out.parent.is_dir():
        raise AvatarRenderError(f"The output folder {shown(out)} does not exist, nor does the folder "
                                f"{shown(out.parent)} it would be made in; create that first.")
    plan = plan_batch(request)
    config = Path(request.config).resolve() if request.config else None
    plans = []
    for job in plan.jobs:
        decision = plan.decisions[job.key]
        frames = plan.frames_expected.get(job.key)
        if decision.action == "skip":
            plans.append(JobPlan(job.name, "skip", decision.reason, frames))
            continue
        if decision.action == "refuse":
            plans.append(JobPlan(job.name, "fail", decision.reason, frames))
            continue
        resumes = not decision.force and render_paths(job.output).partial.exists()
        try:
            cfg = load_config(config, request.overrides + job.overrides)
            open_reference(job.reference, fps=cfg.fps, timing=cfg.reference.timing)
            with AudioReader(job.audio, fps=cfg.fps):
                pass
            words = cfg.preview.transcript if backend(cfg.backend).transcript else None
            if words:
                read_transcript(words)
        except AvatarRenderError as e:
            plans.append(JobPlan(job.name, "fail", str(e), frames))
            continue
        said = f"the words of {shown(Path(words).name)}" if words else ""
        plans.append(JobPlan(job.name, "resume" if resumes else "render", said, frames))
    for path in plan.unpaired:  # (the real run warns of each)
        why = ("its job has more than one transcript and renders without" if path.suffix.lower() in TRANSCRIPT_SUFFIXES
               else "no partner of the same name, or more than one: not rendered")
        plans.append(JobPlan(path.name, "unused", why, None))
    return tuple(plans)
