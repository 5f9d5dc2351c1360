"""What ``run_batch`` reports as it goes, for a progress view (all frozen, all small)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

from avatar_render.batch.jobs import Job, Outcome


@dataclass(frozen=True)
class Planned:
    to_run: tuple[Job, ...]
    skipped: tuple[Outcome, ...]  # complete with the same inputs and config
    refused: tuple[Outcome, ...]  # failed before running (an output that is not the batch's, ...)
    unpaired: tuple[Path, ...]  # files of a folder source that found no partner
    workers: int  # jobs run side by side on this machine (0: as many as Ray places)
    where: str  # "this machine" or the Ray cluster's address
    frames_expected: tuple[Optional[int], ...] = ()  # per job of to_run: its frames from the audio's metadata


@dataclass(frozen=True)
class JobStarted:
    job: Job


@dataclass(frozen=True)
class JobProgress:
    job: Job
    frames_done: int
    frames_total: Optional[int]
    frames_resumed: int
    elapsed_s: float


@dataclass(frozen=True)
class JobMessage:
    job: Job
    level: str  # info | warning
    text: str


@dataclass(frozen=True)
class JobFinished:
    outcome: Outcome


@dataclass(frozen=True)
class Stopping:
    at_once: bool


Event = Union[Planned, JobStarted, JobProgress, JobMessage, JobFinished, Stopping]
OnEvent = Callable[[Event], None]
