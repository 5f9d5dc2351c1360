"""Continuing an interrupted render: whether there is one to continue, and the audio its writer needs again."""

from __future__ import annotations

import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.io.audio import AudioReader
from avatar_render.io.writer import replay_start
from avatar_render.job.journal import Commit, Journal
from avatar_render.pipeline.pipeline import Pipeline
from avatar_render.pipeline.state import Checkpoint


def prior_commit(journal: Journal | None, *, output: Path, partial: Path, resume: bool, force: bool,
                 fps: Fraction) -> Commit | None:
    """The commit to resume from, or None to start afresh; refuses to throw an interrupted render away unasked."""
    if journal is None or not os.path.lexists(partial):
        return None  # nothing, or a stale journal that begin() clears
    if journal.damaged:
        if resume:
            raise AvatarRenderError(f"Cannot resume {shown(output)}: its journal is damaged ({journal.damaged}); start "
                                    "over with --force instead of --resume.")
        if not force:
            raise AvatarRenderError(
                f"A render of {shown(output)} was interrupted and its journal is damaged; pass --force to start over.")
        return None
    commit = journal.commit_info
    if commit is None:
        return None
    if not resume and not force:
        seconds = commit.frames / fps
        raise AvatarRenderError(
            f"A render of {shown(output)} was interrupted after {commit.frames} frames ({float(seconds):.1f} s); "
            "pass --resume to continue it, or --force to start over."
        )
    return commit if resume else None


def replay_audio(audio: AudioReader, checkpoint: Checkpoint, prior: Commit, pipeline: Pipeline) -> np.ndarray:
    """Output audio from ``replay_start`` to the last published sample; the audio before it is decoded
    and dropped as it goes (constant memory however far the render had got)."""
    rate, fps = audio.info.output_rate, pipeline.fps
    start = replay_start(prior.writer)
    first = max(0, math.floor(Fraction(start) * fps / rate))  # frame whose first sample is at or before `start`
    keep = min(first, pipeline.audio_kept_from(checkpoint.last_plan))
    for f in range(0, keep, max(1, pipeline.sizes.chunk_frames)):
        audio.probe(f)
        audio.release(f)
    audio.release(keep)
    block = audio.output_audio(first, prior.frames)
    offset = start - (prior.audio_samples - block.shape[1])
    if not 0 <= offset <= block.shape[1]:
        raise AvatarRenderError(
            "The resume journal does not match the audio, so the render cannot be resumed; start over with --force.")
    return block[:, offset:]
