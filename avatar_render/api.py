"""The library entry point: ``render(RenderRequest) -> RenderReport``. The CLI is a thin layer over it.

A render writes ``NAME.partial.mp4`` (fragmented, readable while it grows) and a resume journal
``NAME.mp4.journal/`` beside the output; when the last chunk is written, the partial file is copied
into a regular MP4 that is moved into place, and both are removed. A render that stops early (a
signal, a crash, a full disk) leaves them, and ``RenderRequest(resume=True)`` goes on from the last
chunk the journal recorded.
"""

from __future__ import annotations

import dataclasses
import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial as bind
from pathlib import Path
from typing import Callable, Literal, Optional

import numpy as np
from omegaconf import OmegaConf

from avatar_render.config import Config
from avatar_render.errors import AvatarRenderError
from avatar_render.io.audio import AudioReader
from avatar_render.io.reference import load_reference
from avatar_render.io.writer import Mp4Writer, WriterPosition, WriterResume, WriterSpec, remux_faststart
from avatar_render.journal import ChunkRecord, Commit, Journal, identity, journal_path, snapshot
from avatar_render.pipeline.pipeline import Pipeline
from avatar_render.pipeline.state import CannotResume, Checkpoint, Flat
from avatar_render.pipeline.types import RequestInput, StaticConditioning
from avatar_render.preview.engine import build_preview
from avatar_render.resume import move_into_place, prior_commit, replay_audio
from avatar_render.distributed.launch import distributed, share_resume_point
from avatar_render.stop import RenderStopped, StopNow
from avatar_render.telemetry import Telemetry, peak_gpu_mb, peak_rss_mb, write_report

OnMessage = Callable[[Literal["info", "warning"], str], None]
_HASHING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-hash")  # the journal's frame hashes


@dataclass(frozen=True)
class RenderRequest:
    reference: Path
    audio: Path
    output: Path
    config: Config = field(default_factory=Config)
    force: bool = False  # replace an existing output file; discard an interrupted render's partial output
    report: Optional[Path] = None  # write a JSON report here
    resume: bool = False  # go on from an interrupted render's journal (start afresh when there is none)


@dataclass(frozen=True)
class Progress:
    chunks_done: int
    frames_done: int
    frames_total: Optional[int]  # exact once the audio has been read to its end, else an estimate (or None)
    elapsed_s: float  # since the inputs were ready
    fps: float  # output frame rate
    frames_resumed: int = 0  # of frames_done, those an earlier, interrupted run rendered


@dataclass(frozen=True)
class RenderReport:
    output: str
    frames: int
    fps: float
    width: int
    height: int
    duration_s: float  # of the audio, hence of the video
    num_chunks: int  # chunks published (the report's "chunks" list has one record each)
    face_detected: bool
    inputs_s: float  # reading the inputs and the static conditioning
    time_to_first_frame_s: float  # from the inputs being ready to the first frame published to the writer
    first_frame_on_disk_s: Optional[float]  # from the inputs being ready to the first fragment on disk
    wall_s: float  # whole job, inputs included
    generated_fps: float  # frames / (wall time after the inputs were ready)
    realtime_factor: float  # video seconds per wall second (> 1 is faster than real time)
    peak_rss_mb: float
    stage_s: dict[str, float]
    resumed_frames: int = 0  # frames taken over from an interrupted run (not counted in the speeds)
    peak_gpu_mb: Optional[float] = None  # GPU memory allocated at the peak (this process), None without a GPU


def build_pipeline(cfg: Config) -> Pipeline:
    if cfg.backend == "preview":
        return build_preview(cfg)
    if cfg.backend == "infinitetalk":
        try:
            from avatar_render.infinitetalk.engine import build_infinitetalk
        except ImportError as e:
            raise AvatarRenderError(
                f"The infinitetalk backend needs PyTorch, diffusers and transformers ({e.name} is missing): "
                "pip install -e '.[model]' after installing torch for your hardware."
            ) from None
        return build_infinitetalk(cfg)
    raise AvatarRenderError(f"Backend '{cfg.backend}' is not available.")


def request_input(cfg: Config, reference: np.ndarray, reference_path: Path) -> RequestInput:
    """What the init stage needs of one request: the reference image, the frame size and the seed."""
    return RequestInput(reference=reference, reference_path=Path(reference_path),
                        width=cfg.video.width, height=cfg.video.height, seed=cfg.seed)


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


@distributed  # under torchrun: process 0 writes, the others run the same chunk loop
def render(
    request: RenderRequest, *, on_progress: Callable[[Progress], None] | None = None,
    on_message: OnMessage | None = None, should_stop: Callable[[], bool] | None = None,
) -> RenderReport:
    """Render one talking-avatar MP4. Raises AvatarRenderError for anything the user can fix; an
    existing output is only replaced when the new one is complete. When ``should_stop()`` turns true
    the render stops after the current chunk and raises RenderStopped (the journal is kept)."""
    cfg = request.config
    output = Path(request.output)
    check_output(output, force=request.force)
    if request.report is not None:
        report = Path(request.report)
        if report.resolve() == output.resolve() or report.is_dir() or not report.parent.is_dir():
            raise AvatarRenderError(f"Cannot write the report to '{report}': give a file in an existing directory.")
    journal = Journal.open(journal_path(output), create=False)
    try:
        prior = prior_commit(journal, output=output, partial=partial_path(output), resume=request.resume,
                             force=request.force, fps=cfg.fps)
        telemetry = Telemetry(keep_records=request.report is not None)
        try:
            pipeline = build_pipeline(cfg)
            for note in pipeline.notes if on_message is not None else ():
                on_message("warning", note)
            with telemetry.stage("inputs"):
                reference = load_reference(request.reference)
                audio = AudioReader(request.audio, fps=cfg.fps, model_rate=pipeline.audio_rate)
            with audio:
                with telemetry.stage("init"):
                    static = pipeline.prepare(request_input(cfg, reference, request.reference))
                del reference
                _check_face(static, request, on_message)
                with telemetry.stage("inputs"):
                    ident = identity(OmegaConf.to_container(OmegaConf.structured(cfg)), Path(request.reference), Path(request.audio))
                if prior is not None:
                    why = journal.mismatch(ident)
                    if why:
                        raise AvatarRenderError(f"Cannot resume '{output}': {why} (resume with the same inputs and config, or start over with --force instead of --resume).")
                    point = journal.resume_point()
                    if on_message is not None:
                        seconds = float(prior.frames / cfg.fps)
                        on_message("info", f"Resuming '{output}' from frame {prior.frames} ({seconds:.1f} s).")
                else:
                    if request.resume and on_message is not None:
                        on_message("info", f"Nothing to resume for '{output}'; starting from the beginning.")
                    journal = journal or Journal.open(journal_path(output), create=True)
                    journal.begin(ident)
                    point = None
                share_resume_point(point[0] if point else None)  # the other processes of a torchrun launch
                run = _Run(request, pipeline, static, audio, telemetry, journal, on_progress, should_stop)
                return run.stream(point, prior)
        finally:
            telemetry.close()
    finally:
        if journal is not None:
            journal.close()


def _check_face(static: StaticConditioning, request: RenderRequest, on_message: OnMessage | None) -> None:
    cfg = request.config
    if static.face_detected or cfg.face.box is not None:
        return
    if cfg.run.no_face == "error":
        raise AvatarRenderError(
            f"No face was found in the reference '{Path(request.reference).name}'; place it with "
            "face.box=[x,y,w,h], or pass run.no_face=warn to go on with the face assumed at the centre."
        )
    if on_message is not None:
        on_message("warning", "no face was found in the reference; the face was assumed at the image centre (set face.box to place it).")


class _Run:
    """The chunk loop of one render, from the writer's creation to the output moved into place."""

    def __init__(self, request, pipeline, static, audio, telemetry, journal, on_progress, should_stop) -> None:
        self.request, self.pipeline, self.static, self.audio = request, pipeline, static, audio
        self.telemetry, self.journal = telemetry, journal
        self.on_progress, self.should_stop = on_progress, should_stop or (lambda: False)
        self.output = Path(request.output)
        self.partial = partial_path(self.output)

    def stream(self, point: tuple[Checkpoint, list[ChunkRecord]] | None, prior: Commit | None) -> RenderReport:
        cfg, audio, telemetry = self.request.config, self.audio, self.telemetry
        fps = cfg.fps
        t_ready = telemetry.elapsed()
        checkpoint = point[0] if point else None
        for r in point[1] if point else ():
            telemetry.chunk_done(**dataclasses.asdict(r), from_journal=True)
        frames = resumed = prior.frames if prior else 0
        samples = prior.audio_samples if prior else 0
        chunks = prior.chunks if prior else 0
        if self.should_stop():
            self._stopped(at_once=False)
        try:
            writer = self._open_writer(checkpoint, prior)
        except BaseException:
            self._forget_if_empty()
            raise
        estimate = None if audio.info.estimated_seconds is None else math.ceil(audio.info.estimated_seconds * fps)
        # Chunks published since the last checkpoint: their records (being hashed) and telemetry stamps.
        hashed: list[tuple[Future[ChunkRecord], dict]] = []
        first_frame_s: float | None = None
        try:
            for item in self.pipeline.stream(self.static, audio, seed=cfg.seed, clock=telemetry.stage,
                                             resume=checkpoint, checkpoints=True):
                if isinstance(item, Checkpoint):
                    with telemetry.stage("journal"):
                        commit = bind(self._commit, snapshot(item), hashed, plans_done=item.plans_done,
                                      frames=frames, audio_samples=samples)
                        writer.mark(commit)
                    hashed = []
                    if self.should_stop() and not item.last_plan.last:  # (after the last plan, finishing is cheaper)
                        writer.close(faststart=False)
                        self._stopped(at_once=False)
                    continue
                with telemetry.stage("write"):
                    writer.put(item.frames, item.audio)
                with telemetry.stage("journal"):
                    record = _HASHING.submit(ChunkRecord.of, item)  # beside the chunk loop and the writer
                if first_frame_s is None:
                    first_frame_s = telemetry.elapsed() - t_ready
                frames, samples, chunks = item.end, samples + item.audio.shape[1], chunks + 1
                hashed.append((record, telemetry.chunk_stamp()))
                if self.on_progress is not None:
                    total = audio.total_frames or (max(estimate, frames) if estimate else None)
                    self.on_progress(Progress(chunks_done=chunks, frames_done=frames, frames_total=total,
                                              elapsed_s=telemetry.elapsed() - t_ready, fps=float(fps), frames_resumed=resumed))
            if hashed:  # (each plan entry's chunks are followed by its checkpoint)
                raise RuntimeError("chunks published after the last checkpoint would be missing from the journal")
            with telemetry.stage("write"):
                stats = writer.close(faststart=False)
                complete = self.journal.dir / "complete.mp4"
                remux_faststart(self.partial, complete)
            move_into_place(complete, self.output, partial=self.partial, force=self.request.force)
        except RenderStopped:
            raise
        except StopNow:
            writer.abort()
            self._stopped(at_once=True)
        except CannotResume as exc:
            writer.abort()
            raise AvatarRenderError(f"{str(exc).rstrip('.')}; start over with --force instead of --resume.") from None
        except AvatarRenderError as exc:
            writer.abort()
            if self._forget_if_empty():
                raise
            done = self.journal.commit_info.frames
            raise AvatarRenderError(f"{str(exc).rstrip('.')}; once that is fixed, run the same command with --resume to continue from frame {done}.") from None
        except BaseException:
            writer.abort()
            self._forget_if_empty()
            raise
        self.partial.unlink(missing_ok=True)
        self.journal.discard()
        return self._report(stats, frames, samples, chunks, resumed, t_ready, first_frame_s)

    def _commit(self, flat: Flat, hashed: list[tuple[Future[ChunkRecord], dict]], position: WriterPosition, **counts: int) -> None:
        """On the writer thread, once the checkpoint's frames are on disk: record its chunks and commit it."""
        records = [future.result() for future, _ in hashed]
        for record, (_, stamp) in zip(records, hashed):
            self.telemetry.chunk_done(stamp=stamp, **dataclasses.asdict(record))
        self.journal.commit(flat, records, position, **counts)

    def _open_writer(self, checkpoint: Checkpoint | None, prior: Commit | None) -> Mp4Writer:
        cfg, info = self.request.config, self.audio.info
        spec = WriterSpec(
            path=self.partial, width=cfg.video.width, height=cfg.video.height, fps=cfg.fps,
            crf=cfg.video.crf, preset=cfg.video.preset, audio_rate=info.output_rate, audio_channels=info.output_channels,
            audio_bitrate=cfg.video.audio_bitrate, queue_chunks=cfg.run.queue_chunks,
        )
        if prior is None:
            return Mp4Writer(spec)
        replay = replay_audio(self.audio, checkpoint, prior, self.pipeline)
        try:
            return Mp4Writer(spec, resume=WriterResume(position=prior.writer, replay=replay))
        except AvatarRenderError as exc:
            raise AvatarRenderError(f"{str(exc).rstrip('.')}; start over with --force instead of --resume.") from None

    def _forget_if_empty(self) -> bool:
        """Remove the partial file and the journal when no frame was committed (nothing worth keeping)."""
        commit = self.journal.commit_info
        if commit is not None and commit.frames:
            return False
        self.partial.unlink(missing_ok=True)
        self.journal.discard()
        return True

    def _stopped(self, *, at_once: bool) -> None:
        self._forget_if_empty()
        commit = self.journal.commit_info
        frames = commit.frames if commit else 0
        raise RenderStopped(output=self.output, partial=self.partial, frames=frames,
                            seconds=float(frames / self.request.config.fps), at_once=at_once)

    def _report(self, stats, frames, samples, chunks, resumed, t_ready, first_frame_s) -> RenderReport:
        cfg, telemetry = self.request.config, self.telemetry
        wall = telemetry.elapsed()
        gen_s = max(wall - t_ready, 1e-9)
        duration = samples / self.audio.info.output_rate
        on_disk = None if stats.first_frame_on_disk_s is None else round(stats.first_frame_on_disk_s - telemetry.t0 - t_ready, 4)
        report = RenderReport(
            output=str(self.output), frames=frames, fps=float(cfg.fps), width=cfg.video.width, height=cfg.video.height,
            duration_s=round(duration, 4), num_chunks=chunks, face_detected=self.static.face_detected,
            inputs_s=round(t_ready, 4), time_to_first_frame_s=round(first_frame_s or 0.0, 4), first_frame_on_disk_s=on_disk,
            wall_s=round(wall, 4), generated_fps=round((frames - resumed) / gen_s, 2),
            realtime_factor=round((duration - resumed / float(cfg.fps)) / wall, 3),
            peak_rss_mb=round(peak_rss_mb(), 1), stage_s={k: round(v, 4) for k, v in telemetry.stage_seconds.items()},
            resumed_frames=resumed, peak_gpu_mb=None if (gpu := peak_gpu_mb()) is None else round(gpu, 1),
        )
        if self.request.report is not None:
            summary = {**dataclasses.asdict(report), "config": OmegaConf.to_container(OmegaConf.structured(cfg))}
            try:
                write_report(Path(self.request.report), summary, telemetry.records())
            except OSError as e:
                raise AvatarRenderError(f"Cannot write the report '{self.request.report}': {e.strerror or e}.") from None
        return report
