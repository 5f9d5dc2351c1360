"""Pipeline: wires the stages of a backend, owns the rolling state, streams final frames in order."""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Callable, Generator, Iterator, Protocol, get_type_hints

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.pipeline.chain import StageChain
from avatar_render.pipeline.module import Module
from avatar_render.pipeline.schedule import ChunkPlan, iter_schedule
from avatar_render.pipeline.stage import Stage, check_chain
from avatar_render.pipeline.state import CannotResume, Checkpoint, RollingState
from avatar_render.pipeline.types import ChunkInput, Frames, Generated, Published, RequestInput, Segment


class AudioSource(Protocol):
    """What the pipeline needs of the audio (``io.audio.AudioReader`` provides it)."""

    total_frames: int | None

    def probe(self, upto_frame: int) -> int: ...
    def model_audio(self, start_frame: int, end_frame: int, *, pad_s: float = 0.0) -> np.ndarray: ...
    def output_audio(self, start_frame: int, end_frame: int) -> np.ndarray: ...
    def release(self, before_frame: int) -> None: ...


@dataclass(frozen=True)
class ChunkSizes:
    chunk_frames: int
    context_frames: int
    transition_frames: int
    lead_frames: int = 0  # extra frames in N0, to align chunks to a backend's latent grid


@dataclass(frozen=True)
class Pipeline:
    init: Stage  # RequestInput -> static conditioning (once per request)
    generate: tuple[Stage, ...]  # ChunkInput -> ... -> Generated (per plan entry)
    decode: Stage  # Segment -> Frames (per published segment, in frame order)
    sizes: ChunkSizes
    fps: Fraction
    audio_rate: int  # sample rate of the model audio
    audio_pad_s: float  # audio the context stage needs on each side of a chunk
    notes: tuple[str, ...] = ()  # what the user should know about how this pipeline was set up (warnings)

    def __post_init__(self) -> None:
        check_chain((self.init,), first_input=RequestInput, last_output=object)
        check_chain(self.generate, first_input=ChunkInput, last_output=Generated)
        # What the generation chain hands to decode is whatever its output's segment() returns.
        segment_type = get_type_hints(self.generate[-1].output_type.segment).get("return", Segment) if self.generate else Segment
        check_chain((self.decode,), first_input=segment_type, last_output=Frames)

    def audio_kept_from(self, plan: ChunkPlan) -> int:
        """The first frame whose audio the chunk loop may still read once ``plan`` is done: I chunks
        reach back before the next N chunk, and each window has ``audio_pad_s`` on either side."""
        C, T = self.sizes.chunk_frames, self.sizes.transition_frames
        return max(0, plan.start - C - T - 1 - math.ceil(self.audio_pad_s * self.fps))

    def modules(self) -> tuple[Module, ...]:
        stages = (self.init, *self.generate, self.decode)
        return tuple(m for s in stages for m in s.modules())

    def prepare(self, request: RequestInput) -> Any:
        """Load the modules, put each where it runs, and compute the static conditioning of one request.

        The init stage's modules come first and the others only after it ran: the encoders it frees
        (run once per request) and the chunk loop's modules (the DiT) are never on the device together.
        """
        first = self.init.modules()
        for module in first:
            self._place(module)
        static, _ = self.init.run(request, static=None, carry=None)
        for module in self.modules():
            if not any(module is m for m in first):
                self._place(module)
        return static

    @staticmethod
    def _place(module: Module) -> None:
        module.load()
        module.prefetch()  # weights read into host memory go to their device (no-op for host-only modules)

    def stream(
        self, static: Any, audio: AudioSource, *, seed: int,
        clock: Callable[[str], AbstractContextManager] = lambda name: nullcontext(),
        resume: Checkpoint | None = None, checkpoints: bool = False,
    ) -> Iterator[Published | Checkpoint]:
        """Run the chunk loop; yield every output frame exactly once, in order, as soon as it is final.
        ``clock(stage_name)`` times each stage call.

        With ``checkpoints``, a ``Checkpoint`` follows the publications of every plan entry; given one
        as ``resume`` (from the same static conditioning, audio and seed), the loop goes on from there
        and yields exactly what the uninterrupted loop would have yielded after it. The audio before
        that point is decoded again (fast-forward), not processed.
        """
        state, done = self._start(static, resume)
        number = -1
        for number, plan in enumerate(self._plans(audio)):
            if number < done:
                self._fast_forward(plan, audio, last=resume.last_plan if number == done - 1 else None)
                continue
            state = self._generate(plan, state, static, audio, seed=seed, clock=clock)
            state = yield from self._publish(plan, state, static, audio, clock=clock)
            if checkpoints:
                yield self._checkpoint(number + 1, plan, state)
        if number + 1 < done:
            raise CannotResume("The saved chunk plan is longer than this audio, so the render cannot be resumed.")
        assert not state.pending and not state.anchors, "every frame published, every anchor used"

    def _start(self, static: Any, resume: Checkpoint | None) -> tuple[RollingState, int]:
        """The rolling state to begin with, and how many plan entries it has done."""
        if resume is None:
            return RollingState(carries=tuple(s.init_carry(static) for s in self.generate),
                                decode_carry=self.decode.init_carry(static)), 0
        state = resume.state
        if len(state.carries) != len(self.generate):
            raise CannotResume("The saved state does not fit this backend's stages, so the render cannot be resumed.")
        state = replace(state, carries=tuple(s.restored_carry(c, static) for s, c in zip(self.generate, state.carries)),
                        decode_carry=self.decode.restored_carry(state.decode_carry, static))
        return state, resume.plans_done

    def _plans(self, audio: AudioSource) -> Iterator[ChunkPlan]:
        return iter_schedule(chunk_frames=self.sizes.chunk_frames, transition_frames=self.sizes.transition_frames,
                             context_frames=self.sizes.context_frames, lead_frames=self.sizes.lead_frames,
                             frames_upto=audio.probe)

    def _fast_forward(self, plan: ChunkPlan, audio: AudioSource, *, last: ChunkPlan | None) -> None:
        """A plan entry done before the resume point: only the audio moves on (``last``: the saved
        checkpoint's plan, given for the last such entry, which must be this one)."""
        if last is not None and plan != last:
            raise CannotResume("The saved chunk plan does not match this audio and config, so the render cannot be resumed.")
        audio.release(self.audio_kept_from(plan))

    def _generate(self, plan: ChunkPlan, state: RollingState, static: Any, audio: AudioSource, *, seed: int,
                  clock: Callable[[str], AbstractContextManager]) -> RollingState:
        """One plan entry through the generation stages: its anchors kept, its final part queued for decode."""
        with clock("audio"):
            window = audio.model_audio(plan.start, plan.end, pad_s=self.audio_pad_s)
        x: Any = ChunkInput(plan=plan, fps=self.fps, audio=window, audio_rate=self.audio_rate, audio_pad_s=self.audio_pad_s,
                            anchors=tuple(state.anchors[f] for f in plan.anchors), seed=seed)
        carries = list(state.carries)
        for i, stage in enumerate(self.generate):
            with clock(stage.name):
                x, carries[i] = _run(stage, x, static=static, carry=carries[i], plan=plan)
        generated: Generated = x
        state = replace(state, carries=tuple(carries)).with_anchors({f: generated.anchor(f) for f in plan.keep}, drop=plan.anchors)
        if plan.publish_end > plan.publish_start:
            state = replace(state, pending=state.pending + (generated.segment(plan.publish_start, plan.publish_end),))
        return state

    def _publish(self, plan: ChunkPlan, state: RollingState, static: Any, audio: AudioSource, *,
                 clock: Callable[[str], AbstractContextManager]) -> Generator[Published, None, RollingState]:
        """Decode and yield every pending segment that is next in frame order; return the state after."""
        T = self.sizes.transition_frames
        while True:
            state, segment = state.pop_ready()
            if segment is None:
                return state
            frames, decode_carry = _run_timed(self.decode, segment, static=static, carry=state.decode_carry, plan=plan,
                                              clock=clock)
            state = replace(state, decode_carry=decode_carry)
            with clock("audio"):
                out_audio = audio.output_audio(segment.start, segment.end)
            yield Published(plan=plan, start=frames.start, frames=frames.frames, audio=out_audio)
            # I chunks reach back before what was published last: keep their audio.
            audio.release(max(0, segment.start - T - 1 - math.ceil(self.audio_pad_s * self.fps)))

    def _checkpoint(self, plans_done: int, plan: ChunkPlan, state: RollingState) -> Checkpoint:
        saved = replace(state, carries=tuple(s.saved_carry(c) for s, c in zip(self.generate, state.carries)),
                        decode_carry=self.decode.saved_carry(state.decode_carry))
        return Checkpoint(plans_done=plans_done, last_plan=plan, state=saved)


def _run(stage: Stage, x: Any, *, static: Any, carry: Any, plan: ChunkPlan) -> tuple[Any, Any]:
    """``stage.run``, with a failure that names the stage and the chunk it was working on."""
    try:
        return stage.run(x, static=static, carry=carry)
    except AvatarRenderError as exc:
        exc.args = (f"{str(exc).rstrip('.')} (stage {stage.name}, chunk {plan.kind}{plan.index}).",)
        raise
    except Exception as exc:
        raise StageFailed(stage.name, f"{plan.kind}{plan.index}", exc) from exc


def _run_timed(stage: Stage, x: Any, *, static: Any, carry: Any, plan: ChunkPlan,
               clock: Callable[[str], AbstractContextManager]) -> tuple[Any, Any]:
    """``_run`` timed by ``clock``; a chain of stages in one slot (decode, then SR) stage by stage, each
    under its own name and with its own carry."""
    if not isinstance(stage, StageChain):
        with clock(stage.name):
            return _run(stage, x, static=static, carry=carry, plan=plan)
    carries = list(carry)
    for i, part in enumerate(stage.stages):
        with clock(part.name):
            x, carries[i] = _run(part, x, static=static, carry=carries[i], plan=plan)
    return x, tuple(carries)


class StageFailed(RuntimeError):
    """An unexpected error inside a stage, with the stage's name and the chunk's."""

    def __init__(self, stage: str, chunk: str, error: Exception) -> None:
        super().__init__(f"stage {stage} failed on chunk {chunk}: {type(error).__name__}: {error}")
        self.stage, self.chunk, self.error = stage, chunk, error
