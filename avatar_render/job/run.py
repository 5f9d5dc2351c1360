"""The render of the writing process: its checks, the journal, the set-up and the chunk loop."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from omegaconf import OmegaConf

from avatar_render.distributed.device_mesh import Mesh
from avatar_render.distributed.launch import broadcast
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.files.render_paths import render_paths
from avatar_render.files.write import remove
from avatar_render.io.audio_stream import PUSHED, Pieces, StreamedAudio, is_stream
from avatar_render.job.journal import (
    ChunkRecord,
    Commit,
    Journal,
    identity,
)
from avatar_render.job.live import Live, gop_seconds, live_request
from avatar_render.job.loop import ChunkLoop
from avatar_render.job.output import (
    check_finished,
    check_output,
    check_partial,
    check_report,
    finished_before,
    request_inputs,
)
from avatar_render.job.request import OnMessage, Progress, RenderReport, RenderRequest
from avatar_render.job.resume import prior_commit
from avatar_render.job.session import open_stream, session_request
from avatar_render.job.setup import prepared
from avatar_render.job.stop import RenderStopped, StopNow
from avatar_render.pipeline.state import Checkpoint
from avatar_render.pipeline.types import StaticConditioning
from avatar_render.telemetry import Telemetry


def run_job(request: RenderRequest, mesh: Mesh, *, telemetry: Telemetry,
            on_progress: Optional[Callable[[Progress], None]],
            on_message: OnMessage, should_stop: Callable[[], bool]) -> RenderReport:
    """Everything is checked that can be before the models load; the journal then says whether this
    render starts afresh or goes on from an interrupted one (the resume point is handed to the other
    processes of a launch). Live sinks are checked (and the watch server started) first of all.
    A session (the audio is a stream) is read from once the watch server is up; a stop request ends
    its stream, and the render finishes with what came."""
    request = live_request(session_request(request))
    pieces = Pieces() if str(request.audio) == PUSHED else None
    live = Live(request, on_message=on_message, pieces=pieces) if request.live.active else None
    stream = None
    try:
        if is_stream(request.audio):
            stream = open_stream(request, pieces=pieces, should_stop=should_stop)
            if live is not None:
                live.clock = stream.clock_origin
        report = _run(request, mesh, live, stream or Path(request.audio), telemetry=telemetry,
                      on_progress=on_progress, on_message=on_message, should_stop=should_stop)
    except BaseException as exc:
        if live is not None:
            _end_live(live, "stopped" if isinstance(exc, (RenderStopped, StopNow)) else "failed", should_stop)
        raise
    finally:
        if stream is not None:
            stream.close()
    if live is not None:
        _end_live(live, "finished", should_stop)
    return report


def _end_live(live: Live, state: str, should_stop: Callable[[], bool]) -> None:
    """Say how the render ended to its watchers (who may be let finish watching), then close the live side: a
    stop signal while they watch still removes the watch folder it made."""
    try:
        live.ended(state, should_stop=should_stop)
    finally:
        live.close()


def _run(request: RenderRequest, mesh: Mesh, live: Optional[Live], audio: Path | StreamedAudio, *,
         telemetry: Telemetry, on_progress: Optional[Callable[[Progress], None]], on_message: OnMessage,
         should_stop: Callable[[], bool]) -> RenderReport:
    cfg = request.config
    if request.output is None:
        return _run_live_only(request, mesh, live, audio, telemetry=telemetry, on_progress=on_progress,
                              on_message=on_message, should_stop=should_stop)
    output = Path(request.output)
    check_finished(output, resume=request.resume, force=request.force)
    check_output(output, force=request.force, resume=request.resume)
    own = render_paths(output)
    written = own.written()
    inputs = request_inputs(request)
    for what, path in written.items():
        inputs.check(path, what=what)
    report = None if request.report is None else Path(request.report)
    check_report(report, force=request.force, inputs=inputs.plus_outputs({**written, **_playlists(live)}))
    journal = Journal.open(own.journal, create=False)
    try:
        check_partial(output, journal)
        if journal is not None and is_stream(request.audio) and not request.force:
            raise AvatarRenderError(
                f"An interrupted render of {shown(output)} is beside it ({shown(own.partial)}); a session "
                "cannot continue it (its audio is a stream): pass --force to start over, or move it away.")
        prior = prior_commit(journal, output=output, partial=own.partial, resume=request.resume,
                             force=request.force, fps=cfg.fps)
        with prepared(cfg, Path(request.reference), audio, mesh, clock=telemetry.stage) as job:
            for note in job.notes:
                on_message("warning", note)
            _check_face(job.static, request, on_message)
            journal, point = _start(journal, request, prior, telemetry, on_message, live=live)
            broadcast(mesh, point[0] if point else None)
            loop = ChunkLoop(request, job, telemetry, journal, on_progress=on_progress, should_stop=should_stop,
                             live=live)
            return loop.run(point, prior)
    finally:
        if journal is not None:
            journal.close()


def _run_live_only(request: RenderRequest, mesh: Mesh, live: Optional[Live], audio: Path | StreamedAudio, *,
                   telemetry: Telemetry,
                   on_progress: Optional[Callable[[Progress], None]], on_message: OnMessage,
                   should_stop: Callable[[], bool]) -> RenderReport:
    """No output file: no journal, nothing to resume; the live sinks are the only outputs."""
    if live is None:
        raise AvatarRenderError("Give an output file (-o), a live target (--live) or --serve.")
    if request.resume:
        raise AvatarRenderError("--resume needs -o: the resume journal lives beside the output file.")
    if request.report is not None:
        check_report(Path(request.report), force=request.force,
                     inputs=request_inputs(request).plus_outputs(_playlists(live)))
    with prepared(request.config, Path(request.reference), audio, mesh, clock=telemetry.stage) as job:
        for note in job.notes:
            on_message("warning", note)
        _check_face(job.static, request, on_message)
        broadcast(mesh, None)
        loop = ChunkLoop(request, job, telemetry, None, on_progress=on_progress, should_stop=should_stop, live=live)
        return loop.run(None, None)


def finished_render(request: RenderRequest, on_message: OnMessage) -> Optional[RenderReport]:
    """The report of a render of this output found finished (killed after it was put in place, before
    it tidied up: the leftovers are removed), when the request resumes it; else None."""
    if request.output is None:
        return None
    output = Path(request.output)
    if not finished_before(output):
        return None
    on_message("info", f"{shown(output)} was complete; the files its render had left beside it are removed.")
    return _finished_report(output, request.config) if request.resume else None


def _start(journal: Optional[Journal], request: RenderRequest, prior: Optional[Commit], telemetry: Telemetry,
           on_message: OnMessage, *,
           live: Optional[Live]) -> tuple[Journal, Optional[tuple[Checkpoint, list[ChunkRecord]]]]:
    """The journal to write, and the point to go on from (None: from the beginning)."""
    cfg, output = request.config, Path(request.output)
    with telemetry.stage("inputs"):
        ident = render_identity(request, live)
    if prior is not None:
        why = journal.mismatch(ident)
        if why:
            raise AvatarRenderError(f"Cannot resume {shown(output)}: {why} (resume with the same inputs and config, or "
                                    "start over with --force instead of --resume).")
        point = journal.resume_point()
        on_message(
            "info", f"Resuming {shown(output)} from frame {prior.frames} ({float(prior.frames / cfg.fps):.1f} s).")
        return journal, point
    if request.resume:
        on_message("info", f"Nothing to resume for {shown(output)}; starting from the beginning.")
    journal = journal or Journal.open(render_paths(output).journal, create=True)
    remove(render_paths(output).partial)  # (only ever this journal's: check_partial)
    journal.begin(ident)
    return journal, None


def render_identity(request: RenderRequest, live: Optional[Live]) -> dict:
    """What a render starts from, as its journal records it: the config, the inputs and the keyframe interval
    the live options give the file (a resume under other live options would change it mid-file)."""
    cfg = request.config
    audio = str(request.audio) if is_stream(request.audio) else Path(request.audio)
    ident = identity(OmegaConf.to_container(OmegaConf.structured(cfg)), Path(request.reference), audio)
    return {**ident, "gop_seconds": gop_seconds(cfg, live)}


def _playlists(live: Optional[Live]) -> dict[str, Path]:
    paths = [t.path for t in (live.targets if live else ()) if t.path is not None]
    return {"playlist" if i == 0 else f"playlist {i + 1}": path for i, path in enumerate(paths)}


def _check_face(static: StaticConditioning, request: RenderRequest, on_message: OnMessage) -> None:
    cfg = request.config
    if static.face_detected or cfg.face.box is not None:
        if static.face_note:
            on_message("warning", static.face_note)
        return
    if cfg.run.no_face == "error":
        raise AvatarRenderError(
            f"No face was found in the reference '{Path(request.reference).name}'; place it with "
            "face.box=[x,y,w,h], or pass run.no_face=warn to render it without one."
        )
    # (the backend says what it does without a face: the preview shows the picture still)
    on_message("warning", static.face_note or "no face was found in the reference; the face was assumed at the image "
                                              "centre (set face.box to place it).")


def _finished_report(output: Path, cfg) -> RenderReport:
    """The report of a render found finished: what the file holds (nothing was rendered now)."""
    import av

    with av.open(str(output)) as c:
        video = c.streams.video[0]
        frames = video.frames
        audio = c.streams.audio[0] if c.streams.audio else None
        seconds = (float(audio.duration * audio.time_base) if audio is not None and audio.duration
                   else frames / float(cfg.fps))
    return RenderReport(output=str(output), frames=frames, fps=float(cfg.fps), width=video.width, height=video.height,
                        duration_s=round(seconds, 4), num_chunks=0, face_detected=True, inputs_s=0.0,
                        time_to_first_frame_s=0.0,
                        first_frame_on_disk_s=None, wall_s=0.0, generated_fps=0.0, realtime_factor=0.0, peak_rss_mb=0.0,
                        stage_s={}, resumed_frames=frames)
