"""What a batch is made of: jobs, the spec a worker renders one from, and what became of each."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

STATUSES = ("done", "resumed", "skipped", "failed", "stopped", "not run")
EVENT_PREFIX = "@avatar-batch "  # marks the worker's JSON event lines on its stdout (see ``worker``)


@dataclass(frozen=True)
class Job:
    name: str  # shown in tables: the output's path inside the batch folder, without .mp4
    reference: Path
    audio: Path
    output: Path  # absolute
    overrides: tuple[str, ...] = ()  # the job's own config overrides, applied after the batch's
    origin: str = ""  # where it came from, for messages: "jobs.csv line 4", "folder 'clips'"

    @property
    def output_name(self) -> str:
        """The output as a user names it: its path inside the batch folder ('en/grace.mp4')."""
        return self.name + self.output.suffix

    @property
    def key(self) -> str:
        """A file-name-safe id, unique per name (so per output): names the job's ledger record, report and
        thumbnail. Made from the name, not the absolute path, so that a batch folder can be moved."""
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", self.name)[-60:]
        return f"{stem}-{hashlib.sha256(self.name.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class JobSpec:
    """All a worker needs to render one job (JSON-serialisable: it crosses a process boundary)."""

    reference: str
    audio: str
    output: str
    report: str
    config: Optional[str] = None  # the batch's YAML config file
    overrides: tuple[str, ...] = ()  # the batch's overrides, then the job's
    force: bool = False
    resume: bool = True  # continue the job's journal when it has one (with none the render starts afresh)
    retry_marker: Optional[str] = None  # (Ray) a file whose presence marks a retried attempt: resume even with force

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "overrides": list(self.overrides)}

    @staticmethod
    def from_json(data: dict[str, Any]) -> JobSpec:
        return JobSpec(**{**data, "overrides": tuple(data.get("overrides", ()))})


ELSEWHERE = "another batch into this folder is rendering it right now"  # the reason a job is skipped so


@dataclass(frozen=True)
class Outcome:
    job: Job
    status: str  # one of STATUSES
    reason: str = ""  # for failed, stopped and skipped jobs: one sentence
    frames: int = 0
    duration_s: float = 0.0  # of the video
    generated_fps: float = 0.0  # frames generated per second of this run (resumed frames not counted)
    wall_s: float = 0.0  # this run's time on the job
    resumed_frames: int = 0
    processes: int = 1  # that rendered it (more under torchrun)
    report: Optional[Path] = None  # the job's JSON render report
    figures_from: str = ""  # a skipped job: when the earlier run its figures come from ended ("": this run's)

    def __post_init__(self) -> None:
        assert self.status in STATUSES, self.status
