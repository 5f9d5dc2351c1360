"""The chunk loop of the writing process: from the writer's creation to the output moved into place.

Each published chunk goes to the MP4 writer, which hashes what it encoded the chunk to; each checkpoint is
committed to the journal by the writer thread once its frames are on disk. A stop request ends the
loop at the next checkpoint; a failure keeps what was committed for ``--resume`` (or removes the
partial output when nothing was)."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from functools import partial as bind
from pathlib import Path
from typing import Callable, Optional

from omegaconf import OmegaConf

from avatar_render.errors import AvatarRenderError, InputError, ResumeError
from avatar_render.files.names import os_reason, shown
from avatar_render.files.render_paths import render_paths
from avatar_render.files.write import remove
from avatar_render.io.audio_stream import is_stream
from avatar_render.io.writer import (
    Mp4Writer,
    WriterPosition,
    WriterResume,
    WriterSpec,
    WriterStats,
    remux_faststart,
)
from avatar_render.job.journal import COMPLETE, ChunkRecord, Commit, Journal, snapshot
from avatar_render.job.live import Live, gop_seconds
from avatar_render.job.output import move_into_place
from avatar_render.job.request import Progress, RenderReport, RenderRequest
from avatar_render.job.resume import replay_audio
from avatar_render.job.setup import Prepared
from avatar_render.job.stop import RenderStopped, StopNow
from avatar_render.pipeline.state import Checkpoint, Flat
from avatar_render.pipeline.types import Published
from avatar_render.telemetry import Telemetry, peak_gpu_mb, peak_rss_mb, write_report

Point = tuple[Checkpoint, list[ChunkRecord]]  # where a resumed render goes on from, and the chunks before it
# chunks published since the last checkpoint: their number in the writer, record (its video_sha256 not yet
# known: the writer encodes the chunk after this), telemetry stamp
Hashed = list[tuple[int, ChunkRecord, dict]]


@dataclass
class _Tally:
    """What has been published so far (this run's and, when resumed, the interrupted run's)."""

    frames: int = 0
    samples: int = 0  # output audio samples
    chunks: int = 0
    resumed: int = 0  # frames the interrupted run had published
    first_frame_s: Optional[float] = None  # this run's first publication, from the inputs being ready

    @staticmethod
    def after(prior: Optional[Commit]) -> _Tally:
        if prior is None:
            return _Tally()
        return _Tally(frames=prior.frames, samples=prior.audio_samples, chunks=prior.chunks, resumed=prior.frames)


class ChunkLoop:
    """Without an output (``request.output`` None: live only) there is no file and no journal: no
    resume points are marked, and nothing is left behind."""

    def __init__(self, request: RenderRequest, job: Prepared, telemetry: Telemetry, journal: Optional[Journal], *,
                 on_progress: Optional[Callable[[Progress], None]], should_stop: Callable[[], bool],
                 live: Optional[Live] = None) -> None:
        self.request, self.cfg, self.job = request, request.config, job
        self.telemetry, self.journal = telemetry, journal
        self.on_progress, self.should_stop = on_progress, should_stop
        self.live = live
        self.output = None if request.output is None else Path(request.output)
        self.session = is_stream(request.audio)  # a stop request ends the stream (the audio's reader sees it)
        self.partial = None if self.output is None else render_paths(self.output).partial
        assert (journal is None) == (self.output is None), "a journal exactly when there is an output"
        self.t_ready = 0.0
        self.t_ready_monotonic = 0.0
        self._chunks_put = 0  # chunks given to this run's writer
        self._writer: Optional[Mp4Writer] = None

    def run(self, point: Optional[Point], prior: Optional[Commit]) -> RenderReport:
        self.t_ready = self.telemetry.elapsed()
        self.t_ready_monotonic = time.monotonic()
        for r in point[1] if point else ():
            self.telemetry.chunk_done(**dataclasses.asdict(r), from_journal=True)
        tally = _Tally.after(prior)
        if self.should_stop():
            raise self._stopped(at_once=False)
        writer = self._writer = self._open_writer(point, prior)
        try:
            uncommitted = self._generate(writer, point[0] if point else None, tally)
            stats = self._finish(writer, uncommitted)
        except BaseException as exc:
            writer.abort()  # (nothing left to do once closed)
            explained = self._explain(exc)
            if explained is exc:
                raise
            raise explained from None
        if self.output is not None:
            remove(self.partial)
            self.journal.discard()
        return self._report(stats, tally)

    def _open_writer(self, point: Optional[Point], prior: Optional[Commit]) -> Mp4Writer:
        cfg, info = self.cfg, self.job.audio.info
        gop = gop_seconds(cfg, self.live)
        spec = WriterSpec(
            path=self.partial, width=cfg.video.width, height=cfg.video.height, fps=cfg.fps,
            crf=cfg.video.crf, preset=cfg.video.preset, audio_rate=info.output_rate,
            audio_channels=info.output_channels,
            audio_bitrate=cfg.video.audio_bitrate, gop_seconds=gop,
            queue_chunks=cfg.run.queue_chunks * self.job.pipeline.puts_per_chunk(),  # (a chunk put in pieces)
        )
        try:
            sinks = [] if self.live is None else self.live.make_sinks(
                spec, first_frame=prior.writer.frames if prior else 0, total_seconds=self._total_seconds)
            if prior is None:
                return Mp4Writer(spec, sinks=sinks)
            checkpoint, records = point
            replay = replay_audio(self.job.audio, checkpoint, prior, self.job.pipeline)
            resume = WriterResume(position=prior.writer, replay=replay,
                                  video_sha256=tuple(r.video_sha256 for r in records))
            try:
                return Mp4Writer(spec, resume=resume, sinks=sinks)
            except AvatarRenderError as exc:
                raise AvatarRenderError(
                    f"{str(exc).rstrip('.')}; start over with --force instead of --resume.") from None
        except BaseException:
            self._forget_if_empty()
            raise

    def _generate(self, writer: Mp4Writer, checkpoint: Optional[Checkpoint], tally: _Tally) -> Hashed:
        """The pipeline's chunks to the writer, its checkpoints to the journal, until the end or a stop;
        returns the chunks published after the last commit.

        A checkpoint is committed only where the writer opens a GOP (fresh encoders), so that a render
        resumed from it writes the bytes of the uninterrupted one; a stop waits for the next of those."""
        hashed: Hashed = []
        stream = self.job.pipeline.stream(self.job.static, self.job.audio, seed=self.cfg.seed,
                                          clock=self.telemetry.stage,
                                          resume=checkpoint, checkpoints=True, ahead=not self.session, pieces=True)
        for item in stream:
            if isinstance(item, Published):
                published = self._publish(writer, item, tally)
                if published is not None:
                    hashed.append(published)
                del item  # (not kept alive while the next chunk is made: the writer and the hashing hold it)
                continue
            if not writer.boundary(last=item.last_plan.last):
                continue
            if self.journal is not None:
                with self.telemetry.stage("journal"):
                    writer.mark(bind(self._commit, snapshot(item), hashed, plans_done=item.plans_done,
                                     frames=tally.frames, audio_samples=tally.samples))
            hashed = []
            if self.should_stop() and not item.last_plan.last and not self.session:  # (after the last plan,
                #   finishing is cheaper)
                writer.close(faststart=False)
                raise self._stopped(at_once=False)
        return hashed

    def _publish(self, writer: Mp4Writer, item: Published, tally: _Tally) -> Optional[tuple[int, ChunkRecord, dict]]:
        """Frames to the writer; a segment's record once all of it is put (None for a piece with more after it)."""
        telemetry = self.telemetry
        with telemetry.stage("write"):
            writer.put(item.frames, item.audio, more=item.more)
        if tally.first_frame_s is None:
            tally.first_frame_s = telemetry.elapsed() - self.t_ready
        if item.more:
            return None
        with telemetry.stage("journal"):
            record = ChunkRecord.of(item, video_sha256="")  # (filled in once the writer has encoded it)
        chunk, self._chunks_put = self._chunks_put, self._chunks_put + 1
        tally.frames, tally.samples, tally.chunks = item.end, tally.samples + item.audio.shape[1], tally.chunks + 1
        progress = Progress(chunks_done=tally.chunks, frames_done=tally.frames, frames_total=self._total(tally),
                            elapsed_s=telemetry.elapsed() - self.t_ready, fps=float(self.cfg.fps),
                            frames_resumed=tally.resumed, open_duration=self.session)
        if self.on_progress is not None:
            self.on_progress(progress)
        if self.live is not None:
            self.live.on_progress(progress,
                                  generated_fps=(tally.frames - tally.resumed) / max(progress.elapsed_s, 1e-9))
        return chunk, record, telemetry.chunk_stamp()

    def _total_seconds(self) -> Optional[float]:
        """The video's length in seconds as far as it is known (exact once the audio is read to its end)."""
        total = self._total(_Tally())
        return None if total is None else float(total / self.cfg.fps)

    def _total(self, tally: _Tally) -> Optional[int]:
        """Frames in the whole video: exact once the audio is read to its end, else the container's estimate."""
        audio = self.job.audio
        if audio.total_frames:
            return audio.total_frames
        if audio.info.estimated_seconds is None:
            return None
        return max(math.ceil(audio.info.estimated_seconds * self.cfg.fps), tally.frames)

    def _commit(self, flat: Flat, hashed: Hashed, position: WriterPosition, **counts: int) -> None:
        """On the writer thread, once the checkpoint's frames are on disk: record its chunks and commit it."""
        records = self._records(hashed)
        for record, (_, _, stamp) in zip(records, hashed):
            self.telemetry.chunk_done(stamp=stamp, **dataclasses.asdict(record))
        self.journal.commit(flat, records, position, **counts)

    def _records(self, hashed: Hashed) -> list[ChunkRecord]:
        """The records of chunks the writer has encoded (on its thread, or once it is closed)."""
        return [dataclasses.replace(record, video_sha256=self._writer.video_sha256(chunk))
                for chunk, record, _ in hashed]

    def _finish(self, writer: Mp4Writer, uncommitted: Hashed) -> WriterStats:
        """The last fragments written, the file copied into a regular MP4 and moved into place;
        ``uncommitted``: the chunks after the last commit, recorded in the telemetry only."""
        with self.telemetry.stage("write"):
            stats = writer.close(faststart=False)
        for record, (_, _, stamp) in zip(self._records(uncommitted), uncommitted):
            self.telemetry.chunk_done(stamp=stamp, **dataclasses.asdict(record))
        if self.output is None:
            return stats
        with self.telemetry.stage("write"):
            complete = self.journal.dir / COMPLETE
            remux_faststart(self.partial, complete)
        move_into_place(complete, self.output, partial=self.partial, force=self.request.force)
        return stats

    def _explain(self, exc: BaseException) -> BaseException:
        """What the caller is told about a loop that ended early (``exc`` itself when nothing is to add)."""
        if isinstance(exc, RenderStopped):
            return exc
        if isinstance(exc, StopNow):
            return self._stopped(at_once=True)
        if isinstance(exc, ResumeError):
            return AvatarRenderError(f"{str(exc).rstrip('.')}; start over with --force instead of --resume.")
        if self._forget_if_empty() or not isinstance(exc, AvatarRenderError) or self.journal is None:
            return exc
        if isinstance(exc, InputError):  # the fixed input is another input: a resume would be refused
            return AvatarRenderError(f"{str(exc).rstrip('.')}; then start over with --force.")
        done = self.journal.commit_info.frames
        return AvatarRenderError(f"{str(exc).rstrip('.')}; once that is fixed, run the same command with --resume to "
                                 f"continue from frame {done}.")

    def _forget_if_empty(self) -> bool:
        """Remove the partial file and the journal when no frame was committed (nothing worth keeping)."""
        if self.journal is None:
            return False
        commit = self.journal.commit_info
        if commit is not None and commit.frames:
            return False
        remove(self.partial)
        self.journal.discard()
        return True

    def _stopped(self, *, at_once: bool) -> RenderStopped:
        self._forget_if_empty()
        commit = None if self.journal is None else self.journal.commit_info
        frames = commit.frames if commit else 0
        return RenderStopped(output=self.output, partial=self.partial, frames=frames,
                             seconds=float(frames / self.cfg.fps), at_once=at_once)

    def _idle(self) -> dict:
        """The silence a real-time session put in while no audio came (nothing for other renders)."""
        reader = getattr(self.job.audio, "reader", self.job.audio)  # (a TrimmedAudio wraps the reader)
        stream = reader.stream
        if stream is None or not stream.realtime:
            return {}
        return {"idle_s": round(stream.padded_samples / reader.info.sample_rate, 6),
                "idle": [[round(start, 6), round(length, 6)] for start, length in stream.idle]}

    def _report(self, stats: WriterStats, tally: _Tally) -> RenderReport:
        cfg, telemetry = self.cfg, self.telemetry
        wall = telemetry.elapsed()
        gen_s = max(wall - self.t_ready, 1e-9)
        duration = tally.samples / self.job.audio.info.output_rate
        on_disk = (None if stats.first_frame_on_disk_s is None
                   else round(stats.first_frame_on_disk_s - telemetry.t0 - self.t_ready, 4))
        live = None if self.live is None else self.live.figures(self.t_ready_monotonic)
        report = RenderReport(
            output=str(self.output) if self.output is not None else self.live.shown, frames=tally.frames,
            fps=float(cfg.fps), width=cfg.video.width, height=cfg.video.height,
            duration_s=round(duration, 4), num_chunks=tally.chunks, face_detected=self.job.static.face_detected,
            inputs_s=round(self.t_ready, 4), time_to_first_frame_s=round(tally.first_frame_s or 0.0, 4),
            first_frame_on_disk_s=on_disk,
            wall_s=round(wall, 4), generated_fps=round((tally.frames - tally.resumed) / gen_s, 2),
            realtime_factor=round((duration - tally.resumed / float(cfg.fps)) / wall, 3),
            peak_rss_mb=round(peak_rss_mb(), 1), stage_s={k: round(v, 4) for k, v in telemetry.stage_seconds.items()},
            resumed_frames=tally.resumed, peak_gpu_mb=None if (gpu := peak_gpu_mb()) is None else round(gpu, 1),
            live=live, open_duration=self.session, **self._idle(),
        )
        if self.request.report is not None:
            summary = {**dataclasses.asdict(report), "config": OmegaConf.to_container(OmegaConf.structured(cfg))}
            try:
                write_report(Path(self.request.report), summary, telemetry.records())
            except OSError as e:
                done = (f"{shown(self.output)} is complete ({tally.frames} frames)" if self.output is not None
                        else "The render finished")
                raise AvatarRenderError(f"{done}, but its report {shown(self.request.report)} could not be written: "
                                        f"{os_reason(e)}.") from None
        return report
