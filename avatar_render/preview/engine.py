"""The preview backend: the pipeline's stages implemented by a CPU animation of the reference.

init: face box, dense landmarks (or a template on the box), the rig. context: per chunk, loudness and
phones (PocketSphinx) -> raw mouth shapes over the chunk and a few frames either side. a2v: mouth
scaled by loudness, blinks, head motion; an I chunk takes the mouth shapes both N chunks saw around
its seam from their anchors and bends its motion onto them. decode: the rig's warp of the reference.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from avatar_render.config import Config
from avatar_render.face.detect import FaceDetector, choose_face
from avatar_render.face.fit import fit_to_frame
from avatar_render.face.landmarks import GET_MODEL, LandmarkModel, find_model
from avatar_render.face.layout import fallback_layout
from avatar_render.face.mesh import FaceMesh, template_mesh
from avatar_render.face.segment import PersonSegmenter
from avatar_render.face.segment import find_model as find_segmenter
from avatar_render.face.teeth import open_to_teeth
from avatar_render.pipeline.pipeline import ChunkSizes, Pipeline
from avatar_render.pipeline.stage import Stage
from avatar_render.pipeline.types import ChunkInput, Frames, Generated, RequestInput, Segment, StaticConditioning
from avatar_render.preview import early
from avatar_render.preview.dub import DubSource, dub_source, render_dub
from avatar_render.preview.frames import FramePool
from avatar_render.preview.motion import (
    BLINK,
    HEAD,
    MOUTH,
    PARAMS,
    MotionCarry,
    blink_track,
    emphasis,
    frame_energy_db,
    head_track,
    lifted,
    loudness_targets,
    pause_track,
    running_peak,
    shape_mouth,
    speaking,
    without_offset,
)
from avatar_render.preview.phones import PhoneRecognizer, lip_closures, model_dir
from avatar_render.preview.render import render_frame
from avatar_render.preview.rig import FaceRig, build_rig, still_rig
from avatar_render.preview.script import NO_SPHINX_NOTE, STREAM_NOTE, Script, align_script, read_transcript
from avatar_render.preview.visemes import mouth_targets

SPEECH_RATE = 16_000  # the rate the speech analysis runs at
PHONE_PAD_S = 0.32  # audio each chunk's phone recognition sees beyond its frames, each side
AHEAD = 4  # frames of the next chunk's mouth handed over (smooths a seam without I chunks)


@dataclass(frozen=True)
class PreviewStatic(StaticConditioning):
    rig: FaceRig
    landmarks: str  # "model", "template" (on the detector's boxes) or "fallback" (no face found)
    dub: DubSource | None = None  # a video reference: its frames, with the mouth redone (preview/dub.py)
    script: Script | None = None  # the transcript's phones placed in the audio (preview.transcript)
    frames: FramePool = field(default_factory=FramePool, repr=False)  # the decode's frame buffers


@dataclass(frozen=True)
class SpeechFeatures:
    chunk: ChunkInput
    first: int  # frame of energy_db[0] and targets[0]
    energy_db: np.ndarray  # (m,) float32 level per frame
    targets: np.ndarray | None  # (m, 2) float32 mouth shapes from the phones, before loudness; None for an I chunk


@dataclass(frozen=True)
class MotionAnchor:
    params: np.ndarray  # (len(PARAMS),) float32 at the anchor frame
    first: int  # frame of mouth[0]
    mouth: np.ndarray  # (m, 2) float32 the N chunk's mouth (open, width) over its frames and a few either side


@dataclass(frozen=True)
class MotionSegment(Segment):
    params: np.ndarray  # (end - start, len(PARAMS)) float32

    def piece(self, start: int, end: int) -> MotionSegment:
        return MotionSegment(start=start, end=end, params=self.params[start - self.start : end - self.start])


@dataclass(frozen=True)
class MotionChunk(Generated):
    params: np.ndarray  # (plan.num_frames, len(PARAMS)) float32
    first: int
    mouth: np.ndarray  # (m, 2) float32, from frame ``first``: the mouth this chunk made of what it heard

    def segment(self, start: int, end: int) -> MotionSegment:
        s = start - self.plan.start
        return MotionSegment(start=start, end=end, params=self.params[s : s + end - start].copy())

    def anchor(self, frame: int) -> MotionAnchor:
        return MotionAnchor(
            params=self.params[frame - self.plan.start].copy(), first=self.first, mouth=self.mouth.copy()
        )


class PreviewInit(Stage[RequestInput, PreviewStatic]):
    name = "init"
    input_type = RequestInput
    output_type = PreviewStatic

    def __init__(self, *, face_box: list[int] | None, landmarks: str, cache_mb: int = 256,
                 face_index: int | None = None, transcript: str | None = None, head_motion: float = 1.0) -> None:
        self.face_box = face_box
        self.transcript = transcript  # the words spoken (the file's text), or None
        self.cache_mb = cache_mb
        self.detector = FaceDetector(index=face_index)
        path = find_model(landmarks)
        self.landmarks = LandmarkModel(path) if path is not None else None
        self.head_motion = head_motion
        seg = find_segmenter() if head_motion > 0 else None  # (a still head moves no background)
        self.segmenter = PersonSegmenter(seg) if seg is not None else None

    def modules(self):
        return ((() if self.face_box else (self.detector,)) + ((self.landmarks,) if self.landmarks else ())
                + ((self.segmenter,) if self.segmenter else ()))

    def run(self, x: RequestInput, *, static: Any, carry: Any) -> tuple[PreviewStatic, None]:
        found = None if self.face_box else early.take_face(x.reference, self.detector.index, self.landmarks)
        if found is None:  # (not looked for already)
            is_face = None if self.landmarks is None else self.landmarks.finds_face(x.reference)
            found = choose_face(x.reference, self.detector, self.face_box, is_face=is_face)
        layout, note = found
        detected = layout is not None and layout.detected
        focus = None if layout is None else (layout.face.x, layout.face.y, layout.face.w, layout.face.h)
        image, fit = fit_to_frame(x.reference, x.width, x.height, focus=focus)
        mesh: FaceMesh | None = None
        if layout is not None and self.landmarks is not None:
            mesh = self.landmarks.from_box(x.reference, layout.face, layout.roll)
        if mesh is not None:
            mesh, kind = mesh.mapped(fit), "model"
        elif layout is not None:
            mesh, kind = open_to_teeth(image, template_mesh(layout).mapped(fit)), "template"
        else:
            mesh, kind = template_mesh(fallback_layout(x.width, x.height)), "fallback"
        # (a video reference's own frames move its background; a still one's is kept still where it is known)
        person = self.segmenter.person if self.segmenter is not None and x.video is None else None
        rig = (build_rig(image, mesh, person=person, motion=self.head_motion) if kind != "fallback"
               else still_rig(image, mesh))
        if kind == "fallback" and x.video is None:
            note = ("no face was found in the reference; it is shown still, with the audio (place the face with "
                    "face.box=[x,y,w,h])")
        static = PreviewStatic(face_detected=detected, rig=rig, landmarks=kind, face_note=note)
        if x.video is not None:
            dub = dub_source(x, detector=self.detector, landmarks=self.landmarks, face_box=self.face_box,
                             cache_mb=self.cache_mb)
            static = dataclasses.replace(static, face_detected=dub.track.found > 0, dub=dub)
        if self.transcript is not None:
            script, why = self._script(x.audio_path)
            static = dataclasses.replace(static, script=script, notes=(why,) if why else ())
        return static, None

    def _script(self, audio: Path | None) -> tuple[Script | None, str]:
        if audio is None:
            return None, STREAM_NOTE
        if model_dir() is None:
            return None, NO_SPHINX_NOTE
        return align_script(audio, self.transcript)  # (the first stretch aligned; the others as chunks reach them)


class SpeechContext(Stage[ChunkInput, SpeechFeatures]):
    """Loudness per frame and, for N chunks, mouth shapes from the phones PocketSphinx hears in the chunk's
    audio window (the chunk and PHONE_PAD_S either side)."""

    name = "context"
    input_type = ChunkInput
    output_type = SpeechFeatures

    def __init__(self, *, phones: bool) -> None:
        self.recognizer = PhoneRecognizer() if phones and model_dir() is not None else None

    def modules(self):
        return (self.recognizer,) if self.recognizer else ()

    def run(self, x: ChunkInput, *, static: Any, carry: Any) -> tuple[SpeechFeatures, None]:
        plan, fps = x.plan, x.fps
        margin = 0 if plan.kind == "I" else extra_frames(x.audio_pad_s, fps)
        first, m = plan.start - margin, plan.num_frames + 2 * margin
        audio = without_offset(x.audio, rate=x.audio_rate)  # (a DC offset is not sound)
        energy = frame_energy_db(
            audio, rate=x.audio_rate, fps=fps, first=first, num_frames=m, pad_s=x.audio_pad_s, window_start=plan.start
        )
        if plan.kind == "I":
            return SpeechFeatures(chunk=x, first=first, energy_db=energy, targets=None), None
        if self.recognizer is None:
            return SpeechFeatures(chunk=x, first=first, energy_db=energy, targets=loudness_targets(energy)), None
        start = plan.start / float(fps) - x.audio_pad_s
        # the words spoken, aligned (here, a stretch at a time, as the chunks reach it): the window's phones from them
        script = None if static.script is None else static.script.window(start, start + len(audio) / x.audio_rate)
        phones = self.recognizer.recognize(audio) if script is None else lip_closures(script, audio)
        times = (np.arange(m) - margin + 0.5) / float(fps) + x.audio_pad_s  # seconds into the window
        return SpeechFeatures(chunk=x, first=first, energy_db=energy, targets=mouth_targets(phones, times)), None


def extra_frames(pad_s: float, fps: Fraction) -> int:
    """Frames either side of a chunk whose loudness window still lies inside its audio window."""
    return max(0, math.floor(pad_s * float(fps) - 0.25))


class PreviewAnimator(Stage[SpeechFeatures, MotionChunk]):
    """The A2V stage of the preview backend: audio features -> per-frame motion, state carried across chunks."""

    name = "a2v"
    input_type = SpeechFeatures
    output_type = MotionChunk

    def __init__(self, *, mouth_gain: float, lip_shape: float, blink_interval_s: float, head_motion: float) -> None:
        self.mouth_gain = mouth_gain
        self.lip_shape = lip_shape
        self.blink_interval_s = blink_interval_s
        self.head_motion = head_motion

    def init_carry(self, static: Any) -> MotionCarry:
        return MotionCarry()

    def run(self, x: SpeechFeatures, *, static: Any, carry: MotionCarry) -> tuple[MotionChunk, MotionCarry]:
        plan = x.chunk.plan
        if plan.kind == "I":
            return self._between(x, carry), carry
        fps, seed, n = x.chunk.fps, x.chunk.seed, plan.num_frames
        s = plan.start - x.first
        energy, speech_db = lifted(x.energy_db, carry.speech_db)  # (a quiet recording heard at a usual level)
        peaks = running_peak(energy[s : s + n], carry.peak_db, fps=fps)
        peak_ext = np.concatenate(
            [
                np.full(s, carry.peak_db, np.float32),
                peaks,
                np.full(len(energy) - s - n, peaks[-1] if n else carry.peak_db, np.float32),
            ]
        )
        targets = self._lip_shape(x.targets)
        pause, last_speech = pause_track(
            x.first, speaking(energy, peak_ext), carry.last_speech, start=plan.start, end=plan.start + n, fps=fps
        )
        mouth = shape_mouth(targets, energy, peak_ext, gain=self.mouth_gain, pause=pause)  # (m, 2)
        params = np.zeros((n, len(PARAMS)), np.float32)
        params[:, MOUTH] = mouth[s : s + n]
        for i, ahead in enumerate(carry.mouth_ahead[: min(AHEAD, n)]):
            w = 1.0 - i / AHEAD  # the last chunk's view of these frames, faded out
            params[i, MOUTH] = w * np.array(ahead, np.float32) + (1 - w) * params[i, MOUTH]
        params[:, BLINK], carry = blink_track(
            plan.start, n, carry, fps=fps, interval_s=self.blink_interval_s, seed=seed, advance=True
        )
        carry = emphasis(plan.start, energy[s : s + n], carry, fps=fps)
        params[:, HEAD] = head_track(plan.start, n, carry, fps=fps, amount=self.head_motion, seed=seed)
        ahead = tuple((float(o), float(w)) for o, w in mouth[s + n : s + n + AHEAD])
        carry = dataclasses.replace(
            carry, peak_db=float(peaks[-1]) if n else carry.peak_db, mouth_ahead=ahead, last_speech=last_speech,
            speech_db=speech_db,
        )
        return MotionChunk(plan=plan, params=params, first=x.first, mouth=mouth), carry

    def _lip_shape(self, targets: np.ndarray) -> np.ndarray:
        out = targets.copy()
        out[:, 1] *= self.lip_shape
        return out

    def _between(self, x: SpeechFeatures, carry: MotionCarry) -> MotionChunk:
        """An I chunk: the mouth both N chunks made of the seam's sound, crossfaded over it (each N chunk's own
        frames at the ends, so both edges continue their motion), but where the chunk that heard a frame with more
        of the audio around it shut the lips, shut as it did; blinks and nods replayed from the carry; all bent to
        land exactly on the two anchor frames."""
        plan, fps, seed, n = x.chunk.plan, x.chunk.fps, x.chunk.seed, x.chunk.plan.num_frames
        before, after = x.chunk.anchors  # MotionAnchor each
        frames = plan.start + np.arange(n)
        a, b = _mouth_at(before, frames), _mouth_at(after, frames)
        u = np.linspace(0.0, 1.0, n, dtype=np.float32)[:, None]
        w = u * u * (3 - 2 * u)
        mouth = np.nan_to_num(np.where(np.isnan(a), b, np.where(np.isnan(b), a, (1 - w) * a + w * b)))
        # (a closure one chunk heard, the other not, came out half shut: the crossfade of shut and open). A frame's
        # own chunk heard more audio after it than the other chunk heard before it: the earlier before the seam.
        earlier = (before.first + len(before.mouth) - frames > frames - after.first)[:, None]
        own = np.where(earlier, a, b)[:, 0]
        shut = ~np.isnan(own) & (own < 0)
        mouth[shut, 0] = np.minimum(mouth[shut, 0], own[shut])
        params = np.zeros((n, len(PARAMS)), np.float32)
        params[:, MOUTH] = mouth
        params[:, BLINK], _ = blink_track(
            plan.start, n, carry, fps=fps, interval_s=self.blink_interval_s, seed=seed, advance=False
        )
        params[:, HEAD] = head_track(plan.start, n, carry, fps=fps, amount=self.head_motion, seed=seed)
        # Bend the fresh motion so that both ends land exactly on the anchors, smoothly.
        params = params + (1 - w) * (before.params - params[0]) + w * (after.params - params[-1])
        return MotionChunk(
            plan=plan, params=params.astype(np.float32), first=plan.start, mouth=mouth.astype(np.float32)
        )


def _mouth_at(anchor: MotionAnchor, frames: np.ndarray) -> np.ndarray:
    """The anchor's chunk's mouth at the given frames; NaN where it made none. -> (len(frames), 2)."""
    idx = frames - anchor.first
    ok = (idx >= 0) & (idx < len(anchor.mouth))
    out = np.full((len(frames), 2), np.nan, np.float32)
    out[ok] = anchor.mouth[idx[ok]]
    return out


class PreviewRender(Stage[MotionSegment, Frames]):
    """The decode stage of the preview backend: motion -> RGB frames."""

    name = "decode"
    input_type = MotionSegment
    output_type = Frames

    def run(self, x: MotionSegment, *, static: PreviewStatic, carry: Any) -> tuple[Frames, None]:
        if static.dub is not None:
            return render_dub(static.dub, x.start, x.params), None
        frames = static.frames.take(len(x.params), static.rig.image)  # (T, H, W, 3)
        for row, frame in zip(x.params, frames):
            render_frame(static.rig, row, out=frame, background=True)
        return Frames(start=x.start, frames=frames), None


PIECE_FRAMES = 10


def build_preview(cfg: Config, mesh: object = None) -> Pipeline:  # one process: ``mesh`` is not used
    p = cfg.preview
    return Pipeline(
        init=PreviewInit(face_box=cfg.face.box, landmarks=cfg.face.landmarks, cache_mb=cfg.reference.cache_mb,
                         face_index=cfg.face.index, head_motion=p.head_motion,
                         transcript=read_transcript(p.transcript) if p.transcript is not None and p.phones else None),
        generate=(
            SpeechContext(phones=p.phones),
            PreviewAnimator(
                mouth_gain=p.mouth_gain,
                lip_shape=p.lip_shape,
                blink_interval_s=p.blink_interval_s,
                head_motion=p.head_motion,
            ),
        ),
        decode=PreviewRender(),
        sizes=ChunkSizes(
            cfg.chunk.chunk_frames,
            cfg.chunk.context_frames,
            cfg.chunk.transition_frames,
            first_frames=cfg.chunk.first_frames,
        ),
        fps=cfg.fps,
        audio_rate=SPEECH_RATE,
        audio_pad_s=max(PHONE_PAD_S, float(2 / Fraction(cfg.fps))),
        notes=landmark_notes(cfg.face.landmarks) or segmentation_notes(cfg.preview.head_motion),
        generate_ahead=True,  # the phones of the next chunk heard while this one is drawn and encoded
        # (each frame is drawn from its own row alone; ten frames at a time keep the encoder busy while the rest
        # of a segment is drawn, in blocks a quarter of a segment's)
        decode_piece_frames=PIECE_FRAMES,
    )


def landmark_notes(setting: str) -> tuple[str, ...]:
    """One line when the render will place the face with the template mesh for want of the installed model."""
    if setting != "auto" or find_model(setting) is not None:
        return ()
    return (
        "The face landmark model is not installed: the mouth and eyes are placed by a template on the face "
        f"detector's boxes, less exactly; install the model with: {GET_MODEL}",
    )


def segmentation_notes(head_motion: float) -> tuple[str, ...]:
    """One line when the head moves and the model that keeps the background still is not installed (an install made
    before it came)."""
    if head_motion == 0 or find_segmenter() is not None:
        return ()
    return (
        "The person segmentation model is not installed: the background near the head moves with it; install it "
        f"with: {GET_MODEL}",
    )
