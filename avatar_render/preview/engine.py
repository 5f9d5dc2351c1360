"""The preview backend: the pipeline's stages implemented by a CPU animation of the reference."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np

from avatar_render.config import Config
from avatar_render.face.detect import FaceDetector, find_face
from avatar_render.face.fit import fit_to_frame
from avatar_render.face.layout import fallback_layout
from avatar_render.pipeline.pipeline import ChunkSizes, Pipeline
from avatar_render.pipeline.stage import Stage
from avatar_render.pipeline.types import (
    ChunkInput,
    Frames,
    Generated,
    RequestInput,
    Segment,
    StaticConditioning,
)
from avatar_render.preview.motion import (
    EYES,
    MOUTH,
    PARAMS,
    MotionCarry,
    blink_track,
    frame_energy_db,
    head_track,
    mouth_track,
)
from avatar_render.preview.render import FaceRig, render_frame

SPEECH_RATE = 16_000  # the rate the speech analysis runs at


@dataclass(frozen=True)
class PreviewStatic(StaticConditioning):
    rig: FaceRig


@dataclass(frozen=True)
class SpeechFeatures:
    chunk: ChunkInput
    energy_db: np.ndarray  # (T,) float32, one level per frame of the chunk


@dataclass(frozen=True)
class MotionSegment(Segment):
    params: np.ndarray  # (end - start, len(PARAMS)) float32


@dataclass(frozen=True)
class MotionChunk(Generated):
    params: np.ndarray  # (plan.num_frames, len(PARAMS)) float32

    def segment(self, start: int, end: int) -> MotionSegment:
        s = start - self.plan.start
        return MotionSegment(start=start, end=end, params=self.params[s : s + end - start].copy())

    def anchor(self, frame: int) -> np.ndarray:
        return self.params[frame - self.plan.start].copy()


class PreviewInit(Stage[RequestInput, PreviewStatic]):
    name = "init"
    input_type = RequestInput
    output_type = PreviewStatic

    def __init__(self, *, face_box: list[int] | None) -> None:
        self.face_box = face_box
        self.detector = FaceDetector()

    def modules(self):
        return () if self.face_box else (self.detector,)

    def run(self, x: RequestInput, *, static: Any, carry: Any) -> tuple[PreviewStatic, None]:
        layout = find_face(x.reference, self.detector, self.face_box)
        detected = layout is not None and layout.detected
        focus = None if layout is None else (layout.face.x, layout.face.y, layout.face.w, layout.face.h)
        image, fit = fit_to_frame(x.reference, x.width, x.height, focus=focus)
        layout = fallback_layout(x.width, x.height) if layout is None else layout.mapped(fit)
        return PreviewStatic(face_detected=detected, rig=FaceRig.build(image, layout)), None


class SpeechContext(Stage[ChunkInput, SpeechFeatures]):
    name = "context"
    input_type = ChunkInput
    output_type = SpeechFeatures

    def run(self, x: ChunkInput, *, static: Any, carry: Any) -> tuple[SpeechFeatures, None]:
        energy = frame_energy_db(x.audio, rate=x.audio_rate, fps=x.fps, num_frames=x.plan.num_frames, pad_s=x.audio_pad_s)
        return SpeechFeatures(chunk=x, energy_db=energy), None


class PreviewAnimator(Stage[SpeechFeatures, MotionChunk]):
    """The A2V stage of the preview backend: audio features -> per-frame motion, state carried across chunks."""

    name = "a2v"
    input_type = SpeechFeatures
    output_type = MotionChunk

    def __init__(self, *, mouth_gain: float, blink_interval_s: float, head_motion: float) -> None:
        self.mouth_gain = mouth_gain
        self.blink_interval_s = blink_interval_s
        self.head_motion = head_motion

    def init_carry(self, static: Any) -> MotionCarry:
        return MotionCarry()

    def run(self, x: SpeechFeatures, *, static: Any, carry: MotionCarry) -> tuple[MotionChunk, MotionCarry]:
        plan, fps, seed = x.chunk.plan, x.chunk.fps, x.chunk.seed
        params = np.zeros((plan.num_frames, len(PARAMS)), np.float32)
        if plan.kind == "I":
            return MotionChunk(plan=plan, params=self._between(x, params, carry)), carry
        params[:, MOUTH], new_carry = mouth_track(x.energy_db, carry, fps=fps, gain=self.mouth_gain)
        params[:, EYES], new_carry = blink_track(plan.start, plan.num_frames, new_carry, fps=fps, interval_s=self.blink_interval_s, seed=seed)
        params[:, EYES + 1 :] = head_track(plan.start, plan.num_frames, fps=fps, amount=self.head_motion, seed=seed, mouth=params[:, MOUTH])
        return MotionChunk(plan=plan, params=params), new_carry

    def _between(self, x: SpeechFeatures, params: np.ndarray, carry: MotionCarry) -> np.ndarray:
        """An I chunk: motion regenerated from the audio between two pinned anchor frames."""
        plan, fps = x.chunk.plan, x.chunk.fps
        first, last = x.chunk.anchors  # (len(PARAMS),) each
        start = MotionCarry(mouth=float(first[MOUTH]), peak_db=carry.peak_db)
        params[:, MOUTH], _ = mouth_track(x.energy_db, start, fps=fps, gain=self.mouth_gain)
        params[:, EYES] = np.linspace(first[EYES], last[EYES], plan.num_frames)
        params[:, EYES + 1 :] = head_track(plan.start, plan.num_frames, fps=fps, amount=self.head_motion, seed=x.chunk.seed, mouth=params[:, MOUTH])
        # Bend the fresh motion so that both ends land exactly on the anchors, smoothly.
        u = np.linspace(0.0, 1.0, plan.num_frames, dtype=np.float32)[:, None]
        w = u * u * (3 - 2 * u)
        return params + (1 - w) * (first - params[0]) + w * (last - params[-1])


class PreviewRender(Stage[MotionSegment, Frames]):
    """The decode stage of the preview backend: motion -> RGB frames."""

    name = "decode"
    input_type = MotionSegment
    output_type = Frames

    def run(self, x: MotionSegment, *, static: PreviewStatic, carry: Any) -> tuple[Frames, None]:
        frames = np.stack([render_frame(static.rig, row) for row in x.params])
        return Frames(start=x.start, frames=frames), None


def build_preview(cfg: Config) -> Pipeline:
    p = cfg.preview
    return Pipeline(
        init=PreviewInit(face_box=cfg.face.box),
        generate=(
            SpeechContext(),
            PreviewAnimator(mouth_gain=p.mouth_gain, blink_interval_s=p.blink_interval_s, head_motion=p.head_motion),
        ),
        decode=PreviewRender(),
        sizes=ChunkSizes(cfg.chunk.chunk_frames, cfg.chunk.context_frames, cfg.chunk.transition_frames),
        fps=cfg.fps,
        audio_rate=SPEECH_RATE,
        audio_pad_s=float(1 / Fraction(cfg.fps)),
    )
