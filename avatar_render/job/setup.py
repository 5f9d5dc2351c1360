"""The set-up of one request, the same in every process of a launch (and in the benchmarks): the
backend's pipeline, the inputs opened, the static conditioning computed."""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from avatar_render.backends import backend
from avatar_render.config import Config
from avatar_render.distributed.device_mesh import Mesh
from avatar_render.distributed.launch import broadcast
from avatar_render.io.audio import AudioReader
from avatar_render.io.audio_length import length_note
from avatar_render.io.audio_stream import StreamedAudio
from avatar_render.io.reference import open_reference
from avatar_render.io.trimmed_audio import TrimmedAudio
from avatar_render.io.video_source import VideoReference
from avatar_render.pipeline.pipeline import Pipeline
from avatar_render.pipeline.types import RequestInput, StaticConditioning

Clock = Callable[[str], AbstractContextManager]


def build_pipeline(cfg: Config, mesh: Mesh) -> Pipeline:
    """The pipeline of ``cfg.backend`` for this process of the launch ``mesh`` describes."""
    return backend(cfg.backend).load("build")(cfg, mesh)


def request_input(cfg: Config, reference: np.ndarray, reference_path: Path, video=None,
                  audio: Path | None = None) -> RequestInput:
    """What the init stage needs of one request: the reference image (and video), the frame size, the seed and
    the audio file (None for a stream)."""
    return RequestInput(reference=reference, reference_path=Path(reference_path),
                        width=cfg.video.width, height=cfg.video.height, seed=cfg.seed, video=video, audio_path=audio)


@dataclass(frozen=True)
class Prepared:
    """A request ready for its chunk loop."""

    pipeline: Pipeline
    static: StaticConditioning  # the static conditioning, kept for the whole request
    audio: AudioReader | TrimmedAudio  # open; read as the chunk loop goes
    notes: tuple[str, ...] = ()  # warnings for the user: the pipeline's, then the inputs'



@contextmanager
def prepared(cfg: Config, reference: Path, audio: Path | StreamedAudio, mesh: Mesh, *,
             clock: Clock = lambda name: nullcontext()) -> Iterator[Prepared]:
    """Build the pipeline, open the inputs and compute the static conditioning; the audio stays open
    inside the block. ``clock(name)`` times the parts ("inputs", "load", "init"). A stream in real time
    is read without look-ahead past what the chunk loop asks for (it would wait for it)."""
    pipeline = build_pipeline(cfg, mesh)
    with clock("inputs"):
        image, video = open_reference(reference, fps=cfg.fps, timing=cfg.reference.timing)
        live = isinstance(audio, StreamedAudio) and audio.realtime
        reader = AudioReader(audio, fps=cfg.fps, model_rate=pipeline.audio_rate, lookahead_s=0.0 if live else 0.5)
    limit = None if video is None else video.timeline.frame_limit
    with reader:
        file = None if isinstance(audio, StreamedAudio) else Path(audio)
        static = pipeline.prepare(request_input(cfg, image, reference, video, file), clock=clock)  # times load, init
        del image
        length = None if file is None else length_note(file)
        notes = (*pipeline.notes, *static.notes, *(() if video is None else video_notes(video, cfg)),
                 *(() if length is None else (length,)))
        yield Prepared(pipeline=pipeline, static=static, audio=reader if limit is None else TrimmedAudio(reader, limit),
                       notes=notes)


def video_notes(video: VideoReference, cfg: Config) -> tuple[str, ...]:
    """What a user should know about a video reference's frame rate against the output's."""
    info, fps = video.timeline.info, float(cfg.fps)
    if info.variable_rate or abs(info.fps - fps) <= 0.01 * fps:
        return ()
    own = backend(cfg.backend)
    effect = (f"about one source frame in {max(2, round(info.fps / (info.fps - fps)))} is skipped" if info.fps > fps
              else f"about one source frame in {max(2, round(fps / (fps - info.fps)))} is shown twice")
    hint = f"; set {own.section}.fps={info.fps:.3g} to keep every frame" if own.fps_free else ""
    return (f"The reference video runs at {info.fps:.3g} fps and the output at {fps:.3g} fps: {effect}{hint}.",)


def follow(cfg: Config, reference: Path, audio: Path, mesh: Mesh) -> None:
    """The chunk loop of a process that does not write: the same pipeline, inputs and seed as the
    writing process, so that its collectives (FSDP all-gathers, sequence-parallel all-to-alls) match,
    from the resume point the writing process hands over; its frames are dropped."""
    with prepared(cfg, reference, audio, mesh) as job:
        resume = broadcast(mesh, None)
        for _ in job.pipeline.stream(job.static, job.audio, seed=cfg.seed, resume=resume):
            pass
