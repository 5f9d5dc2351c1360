"""The library entry point: ``render(RenderRequest) -> RenderReport``. The CLI is a thin layer over it."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from omegaconf import OmegaConf

from avatar_render.config import Config
from avatar_render.errors import AvatarRenderError
from avatar_render.io.audio import AudioReader
from avatar_render.io.reference import load_reference
from avatar_render.io.writer import Mp4Writer, WriterSpec
from avatar_render.pipeline.pipeline import Pipeline
from avatar_render.pipeline.types import RequestInput, StaticConditioning
from avatar_render.preview.engine import build_preview
from avatar_render.telemetry import Telemetry, peak_rss_mb, write_report


@dataclass(frozen=True)
class RenderRequest:
    reference: Path
    audio: Path
    output: Path
    config: Config = field(default_factory=Config)
    force: bool = False  # replace an existing output file
    report: Optional[Path] = None  # write a JSON report here


@dataclass(frozen=True)
class Progress:
    chunks_done: int
    frames_done: int
    frames_total: Optional[int]  # exact once the audio has been read to its end, else an estimate (or None)
    elapsed_s: float  # since the inputs were ready
    fps: float  # output frame rate


@dataclass(frozen=True)
class RenderReport:
    output: str
    frames: int
    fps: float
    width: int
    height: int
    duration_s: float  # of the audio, hence of the video
    chunks: int
    face_detected: bool
    inputs_s: float  # reading the inputs and the static conditioning
    time_to_first_frame_s: float  # from the inputs being ready to the first frame published to the writer
    first_frame_on_disk_s: Optional[float]  # from the inputs being ready to the first fragment on disk
    wall_s: float  # whole job, inputs included
    generated_fps: float  # frames / (wall time after the inputs were ready)
    realtime_factor: float  # video seconds per wall second (> 1 is faster than real time)
    peak_rss_mb: float
    stage_s: dict[str, float]


def build_pipeline(cfg: Config) -> Pipeline:
    if cfg.backend == "preview":
        return build_preview(cfg)
    raise AvatarRenderError(f"Backend '{cfg.backend}' is not available.")


def partial_path(output: Path) -> Path:
    """Where a render in progress is written before it is moved into place."""
    return output.with_name(output.stem + ".partial" + output.suffix)


def check_output(output: Path, *, force: bool) -> None:
    if output.is_dir():
        raise AvatarRenderError(f"Output '{output}' is a directory; give a file name ending in .mp4.")
    if output.suffix.lower() != ".mp4":
        raise AvatarRenderError(f"Output '{output}' must be a file name ending in .mp4.")
    if output.exists() and not force:
        raise AvatarRenderError(f"Output '{output}' already exists; pass --force to overwrite it.")
    parent = output.parent
    if parent.exists() and not parent.is_dir():
        raise AvatarRenderError(f"Cannot write '{output}': '{parent}' is a file, not a directory.")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise AvatarRenderError(f"Cannot create the output directory '{parent}': {e.strerror or e}.") from None
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AvatarRenderError(f"Cannot write to the output directory '{parent}'.")


def render(request: RenderRequest, *, on_progress: Callable[[Progress], None] | None = None) -> RenderReport:
    """Render one talking-avatar MP4. Raises AvatarRenderError for anything the user can fix; an
    existing output is only replaced when the new one is complete."""
    cfg = request.config
    output = Path(request.output)
    check_output(output, force=request.force)
    if request.report is not None:
        report = Path(request.report)
        if report.resolve() == output.resolve() or report.is_dir() or not report.parent.is_dir():
            raise AvatarRenderError(f"Cannot write the report to '{report}': give a file in an existing directory.")
    telemetry = Telemetry(keep_records=request.report is not None)
    try:
        pipeline = build_pipeline(cfg)
        with telemetry.stage("inputs"):
            reference = load_reference(request.reference)
            audio = AudioReader(request.audio, fps=cfg.fps, model_rate=pipeline.audio_rate)
        with audio:
            with telemetry.stage("init"):
                static = pipeline.prepare(RequestInput(
                    reference=reference, reference_path=Path(request.reference),
                    width=cfg.video.width, height=cfg.video.height, seed=cfg.seed,
                ))
            del reference
            return _stream(request, pipeline, static, audio, telemetry, on_progress)
    finally:
        telemetry.close()


def _stream(request, pipeline: Pipeline, static: StaticConditioning, audio: AudioReader, telemetry: Telemetry, on_progress) -> RenderReport:
    cfg, output = request.config, Path(request.output)
    fps = cfg.fps
    t_ready = telemetry.elapsed()
    estimate = None if audio.info.estimated_seconds is None else math.ceil(audio.info.estimated_seconds * fps)
    tmp = partial_path(output)
    writer = Mp4Writer(WriterSpec(
        path=tmp, width=cfg.video.width, height=cfg.video.height, fps=fps,
        crf=cfg.video.crf, preset=cfg.video.preset,
        audio_rate=audio.info.output_rate, audio_channels=audio.info.output_channels,
        audio_bitrate=cfg.video.audio_bitrate, queue_chunks=cfg.run.queue_chunks,
    ))
    frames = samples = chunks = 0
    first_frame_s: float | None = None
    try:
        for pub in pipeline.stream(static, audio, seed=cfg.seed, clock=telemetry.stage):
            with telemetry.stage("write"):
                writer.put(pub.frames, pub.audio)
            if first_frame_s is None:
                first_frame_s = telemetry.elapsed() - t_ready
            frames, samples, chunks = pub.end, samples + pub.audio.shape[1], chunks + 1
            telemetry.chunk_done(kind=pub.plan.kind, index=pub.plan.index, start=pub.start, end=pub.end)
            if on_progress is not None:
                on_progress(Progress(chunks_done=chunks, frames_done=frames,
                                     frames_total=audio.total_frames or (max(estimate, frames) if estimate else None),
                                     elapsed_s=telemetry.elapsed() - t_ready, fps=float(fps)))
        with telemetry.stage("write"):
            stats = writer.close()
    except BaseException:
        writer.abort()
        raise
    os.replace(tmp, output)
    wall = telemetry.elapsed()
    gen_s = max(wall - t_ready, 1e-9)
    duration = samples / audio.info.output_rate
    report = RenderReport(
        output=str(output), frames=frames, fps=float(fps), width=cfg.video.width, height=cfg.video.height,
        duration_s=round(duration, 4), chunks=chunks, face_detected=static.face_detected,
        inputs_s=round(t_ready, 4), time_to_first_frame_s=round(first_frame_s or 0.0, 4),
        first_frame_on_disk_s=None if stats.first_frame_on_disk_s is None else round(stats.first_frame_on_disk_s - telemetry.t0 - t_ready, 4),
        wall_s=round(wall, 4), generated_fps=round(frames / gen_s, 2), realtime_factor=round(duration / wall, 3),
        peak_rss_mb=round(peak_rss_mb(), 1), stage_s={k: round(v, 4) for k, v in telemetry.stage_seconds.items()},
    )
    if request.report is not None:
        summary = {**dataclasses.asdict(report), "config": OmegaConf.to_container(OmegaConf.structured(cfg))}
        try:
            write_report(Path(request.report), summary, telemetry.records())
        except OSError as e:
            raise AvatarRenderError(f"Cannot write the report '{request.report}': {e.strerror or e}.") from None
    return report
