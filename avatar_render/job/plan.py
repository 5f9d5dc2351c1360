"""A dry run: every check a render makes before its first frame, then what it would do (frames, chunks,
memory, backend, face), with nothing written, no model loaded and no server started."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from avatar_render.backends import backend
from avatar_render.config import Config
from avatar_render.errors import AvatarRenderError
from avatar_render.face.detect import FaceDetector, choose_face
from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.files.names import shown
from avatar_render.files.render_paths import render_paths
from avatar_render.io.audio import AudioReader
from avatar_render.io.audio_length import length_note
from avatar_render.io.audio_stream import is_stream
from avatar_render.io.reference import open_reference
from avatar_render.job.journal import Journal
from avatar_render.job.live import Live, live_request
from avatar_render.job.output import (
    check_finished,
    check_output,
    check_partial,
    check_report,
    request_inputs,
)
from avatar_render.job.request import RenderRequest
from avatar_render.job.resume import prior_commit
from avatar_render.job.run import render_identity
from avatar_render.pipeline.schedule import iter_schedule

# The preview's resident memory: the process and its models, then frames in flight (calibrated on the peaks
# docs/benchmarks.md measured: 169 MB at 256x256 and 280 MB at 512x512 with 50-frame chunks).
_PREVIEW_BASE_MB = 130
_FRAMES_IN_FLIGHT_CHUNKS = 2.75  # chunks of frames held besides the writer's queue


@dataclass(frozen=True)
class RenderPlan:
    backend: str
    size: tuple[int, int]
    fps: float
    reference: str  # what the reference is
    audio: str  # what the audio is
    frames: Optional[int]  # from the audio's metadata (None when it does not say)
    n_chunks: Optional[int]
    i_chunks: Optional[int]
    chunking: str  # the N/I schedule's settings and order
    face: str  # which face is rendered
    face_model: str  # what places the face's points
    memory: str  # what memory it needs
    resume_from: Optional[int]  # --resume: the frame the render goes on from (None: from the beginning)
    writes: tuple[str, ...]  # the files and streams it writes
    words: str = ""  # the preview's transcript (preview.transcript), when given: what is done with it
    warnings: tuple[str, ...] = ()  # what the render would warn of its inputs before it starts

    def rows(self) -> list[tuple[str, str]]:
        w, h = self.size
        frames = "unknown until the audio is read" if self.frames is None else (
            f"{self.frames} ({self.frames / self.fps:.2f} s at {self.fps:g} fps, {w}x{h})")
        chunks = "?" if self.n_chunks is None else f"{self.n_chunks} N + {self.i_chunks} I"
        start = "the beginning" if self.resume_from is None else f"frame {self.resume_from} (--resume)"
        return [("backend", self.backend), ("reference", self.reference), ("audio", self.audio),
                ("frames", frames), ("chunks", f"{chunks}: {self.chunking}"), ("face", self.face),
                ("face model", self.face_model), *([("words", self.words)] if self.words else []),
                ("memory", self.memory), ("starts from", start), ("writes", ", ".join(self.writes)),
                *(("warning", text) for text in self.warnings)]


def plan_render(request: RenderRequest) -> RenderPlan:
    """The checks of ``run_job`` up to the models' loading, in the same words, and the plan."""
    request = live_request(request)
    cfg = request.config
    writes: list[str] = []
    live = None
    if request.live.active:  # targets, playlists and addresses checked; the server is not started
        live = Live(dataclasses.replace(request, live=dataclasses.replace(request.live, serve=None)),
                    on_message=lambda level, text: None)
        live.close()
        writes += [t.shown for t in live.targets]
        if request.live.serve is not None:
            from avatar_render.io.live.targets import parse_serve

            host, port = parse_serve(request.live.serve)
            writes.append(f"a watch page on {host}:{port}")
    elif request.output is None:
        raise AvatarRenderError("Give an output file (-o), a live target (--live) or --serve.")
    resume_from = None
    inputs = request_inputs(request)
    if request.output is not None:
        output = Path(request.output)
        check_finished(output, resume=request.resume, force=request.force)
        check_output(output, force=request.force, resume=request.resume)
        own = render_paths(output)
        written = own.written()
        for what, path in written.items():
            inputs.check(path, what=what)
        inputs = inputs.plus_outputs(written)
        journal = Journal.open(own.journal, create=False)  # (an existing one: locked and read)
        try:
            check_partial(output, journal)
            prior = prior_commit(journal, output=output, partial=own.partial, resume=request.resume,
                                 force=request.force, fps=cfg.fps)
            why = None if prior is None else journal.mismatch(render_identity(request, live))
            if why:
                raise AvatarRenderError(f"Cannot resume {shown(output)}: {why} (resume with the same inputs and "
                                        "config, or start over with --force instead of --resume).")
        finally:
            if journal is not None:
                journal.close()
        resume_from = None if prior is None else prior.frames
        writes.insert(0, shown(output))
    elif request.resume:
        raise AvatarRenderError("--resume needs -o: the resume journal lives beside the output file.")
    if request.report is not None:
        check_report(Path(request.report), force=request.force, inputs=inputs)
        writes.append(shown(Path(request.report)))
    image, video = open_reference(request.reference, fps=cfg.fps, timing=cfg.reference.timing)
    with AudioReader(request.audio, fps=cfg.fps) as audio:
        info = audio.info
    seconds = info.estimated_seconds
    frames = None if seconds is None else math.ceil(seconds * cfg.fps)
    limit = None if video is None else video.timeline.frame_limit
    if frames is not None and limit is not None:
        frames = min(frames, limit)
    if video is None:
        reference = f"image {image.shape[1]}x{image.shape[0]}"
    else:
        src = video.timeline.info
        reference = (f"video {src.width}x{src.height}, {float(src.duration):.2f} s at {src.fps:.3g} fps "
                     f"(reference.timing={cfg.reference.timing})")
    channels = f"{info.channels} channel{'s' if info.channels != 1 else ''}"
    length = "length unknown" if seconds is None else f"{seconds:.2f} s"
    sizes = _chunk_sizes(cfg)
    n_chunks, i_chunks, order = _schedule(sizes, frames)
    return RenderPlan(
        backend=_backend(cfg), size=(cfg.video.width, cfg.video.height), fps=float(cfg.fps),
        reference=f"{shown(Path(request.reference))}: {reference}",
        audio=f"{shown(Path(request.audio))}: {length}, {info.codec}, {info.sample_rate} Hz, {channels}",
        frames=frames, n_chunks=n_chunks, i_chunks=i_chunks,
        chunking=_chunking(sizes, order),
        face=_face(image, cfg), face_model=_face_model(cfg), memory=_memory(cfg, sizes),
        resume_from=resume_from, writes=tuple(writes), words=_words(cfg, request),
        warnings=() if is_stream(request.audio) or (note := length_note(Path(request.audio))) is None else (note,))


def _backend(cfg: Config) -> str:
    if not backend(cfg.backend).weights:
        return f"{cfg.backend} (CPU, no weights)"
    weights = f"weights from {cfg.model.root}" if cfg.model.root else "random weights (no model.root)"
    return f"{cfg.backend} ({cfg.model.size}, {weights}, device {cfg.model.device}, {cfg.model.steps} steps)"


def _chunk_sizes(cfg: Config) -> dict[str, int]:
    c, own = cfg.chunk, backend(cfg.backend)
    if own.check_sizes:
        own.load("check_sizes")(cfg)
    return {"chunk_frames": c.chunk_frames, "transition_frames": c.transition_frames,
            "context_frames": c.context_frames, "lead_frames": own.lead_frames, "first_frames": c.first_frames}


def _chunking(sizes: dict[str, int], order: str) -> str:
    first = f" (the first {sizes['first_frames']})" if sizes["first_frames"] else ""
    seams = (f"{sizes['transition_frames']} frames regenerated over each seam" if sizes["transition_frames"]
             else "no I chunks (chunk.transition_frames=0)")
    return f"{sizes['chunk_frames']} frames each{first}, {seams}; order {order}"


def _schedule(sizes: dict[str, int], frames: Optional[int]) -> tuple[Optional[int], Optional[int], str]:
    """N and I chunk counts and the order they run in (its first chunks)."""
    if frames is None:
        return None, None, "N0, N1, I0, N2, I1, ..." if sizes["transition_frames"] else "N0, N1, N2, ..."
    plans = list(iter_schedule(chunk_frames=sizes["chunk_frames"], transition_frames=sizes["transition_frames"],
                               context_frames=sizes["context_frames"], lead_frames=sizes["lead_frames"],
                               first_frames=sizes["first_frames"] or None, frames_upto=lambda n: min(n, frames)))
    names = [f"{p.kind}{p.index}" for p in plans]
    order = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    return sum(p.kind == "N" for p in plans), sum(p.kind == "I" for p in plans), order


def _face(image, cfg: Config) -> str:
    if cfg.face.box is not None:
        return f"placed by face.box={cfg.face.box}"
    path = find_model(cfg.face.landmarks) if backend(cfg.backend).rig else None  # (the render looks with it too)
    is_face = None if path is None else LandmarkModel(path).finds_face(image)
    layout, note = choose_face(image, FaceDetector(index=cfg.face.index), None, is_face=is_face)
    if layout is None:
        if cfg.run.no_face == "error":
            raise AvatarRenderError("No face was found in the reference; place it with face.box=[x,y,w,h], or pass "
                                    "run.no_face=warn to render it without one.")
        if backend(cfg.backend).rig:
            return "none found: the picture is shown still (face.box places the face)"
        return "none found: assumed at the image centre (face.box places it)"
    f = layout.face
    return note or f"1 face, {f.w:.0f}x{f.h:.0f} px at x={f.x:.0f}, y={f.y:.0f}"


def _words(cfg: Config, request: RenderRequest) -> str:
    transcript = cfg.preview.transcript
    if not backend(cfg.backend).transcript or not transcript or not cfg.preview.phones:
        return ""
    from avatar_render.preview.script import transcript_plan

    return f"{shown(Path(transcript))}: {transcript_plan(transcript, stream=is_stream(request.audio))}"


def _face_model(cfg: Config) -> str:
    if not backend(cfg.backend).rig:
        return "OpenCV's face detector (the layout of the face for the crop)"
    path = find_model(cfg.face.landmarks)
    if path is None:
        why = "face.landmarks=template" if cfg.face.landmarks == "template" else "no face mesh model installed"
        return f"a template mesh on the detector's boxes ({why})"
    return f"MediaPipe face mesh, 468 points ({path.name})"


def _memory(cfg: Config, sizes: dict[str, int]) -> str:
    frame_mb = cfg.video.width * cfg.video.height * 3 / 2**20
    chunk = sizes["chunk_frames"] + sizes["transition_frames"]
    frames_mb = (cfg.run.queue_chunks + _FRAMES_IN_FLIGHT_CHUNKS) * chunk * frame_mb
    if not backend(cfg.backend).weights:
        return (f"about {_PREVIEW_BASE_MB + frames_mb:.0f} MB resident, the same for any length of audio "
                f"({frames_mb:.0f} MB of it frames in flight)")
    weights = sum(p.stat().st_size for p in Path(cfg.model.root).rglob("*.safetensors")) if cfg.model.root else 0
    held = f"{weights / 2**30:.1f} GB of weights in {cfg.model.root}" if weights else "the model's weights"
    return f"{held} on {cfg.model.device}, and about {frames_mb:.0f} MB of frames in flight, for any length of audio"
