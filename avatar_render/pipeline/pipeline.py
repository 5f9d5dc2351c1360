"""Pipeline: wires the stages of a backend, owns the rolling state, streams final frames in order."""

from __future__ import annotations

import math
import sys
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Callable, Generator, Iterator, Optional, Protocol, get_type_hints

import numpy as np

from avatar_render.errors import AvatarRenderError, ResumeError, StageError
from avatar_render.pipeline.chain import StageChain
from avatar_render.pipeline.module import Module
from avatar_render.pipeline.schedule import ChunkPlan, iter_schedule
from avatar_render.pipeline.stage import Stage, check_chain
from avatar_render.pipeline.state import Checkpoint, RollingState
from avatar_render.pipeline.types import ChunkInput, Frames, Generated, Published, RequestInput, Segment


class AudioSource(Protocol):
    """What the pipeline needs of the audio (``io.audio.AudioReader`` provides it)."""

    total_frames: int | None

    def probe(self, upto_frame: int) -> int: ...
    def model_audio(self, start_frame: int, end_frame: int, *, pad_s: float = 0.0) -> np.ndarray: ...
    def output_audio(self, start_frame: int, end_frame: int) -> np.ndarray: ...
    def release(self, before_frame: int) -> None: ...


Clock = Callable[[str], AbstractContextManager]

# The publishing slot's worker (``overlap_decode``) and the loader of the chunk loop's modules
# (``prepare``): one thread each, so jobs run in the order they were given.
_DECODE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode")
_GENERATE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="generate")  # (``generate_ahead``)
_LOAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="load")


@dataclass(frozen=True)
class ChunkSizes:
    chunk_frames: int
    context_frames: int
    transition_frames: int
    lead_frames: int = 0  # extra frames in N0, to align chunks to a backend's latent grid
    first_frames: int = 0  # frames of N0 after the lead ones; 0 = chunk_frames

    @property
    def first(self) -> int:
        return self.first_frames or self.chunk_frames


@dataclass(frozen=True)
class _Job:
    """A plan entry's final segments handed to the publishing slot; ``state`` is the rolling state
    right after the entry with them taken out of ``pending`` (its checkpoint, less the decode carry)."""

    number: int
    plan: ChunkPlan
    state: "RollingState"
    segments: tuple[Segment, ...]
    result: Optional[Future]  # -> (frames of each segment, the decode carry after them); None: decoded as they go out


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
    # Frames [0, lead_frames) known from the static conditioning alone (the diffusion backend's first
    # latent is the reference's): published before N0 is generated, so the first frame waits for no chunk.
    lead: Optional[Callable[[Any], Segment]] = None
    # Decode (and SR) a plan entry's frames in a thread of their own while the next entry is generated;
    # the items yielded are the same, each publication and checkpoint one entry later (from N1 on: N0's
    # frames, the first sampled ones, go out at once).
    overlap_decode: bool = False
    # Entered around each decode job in that thread, made in the loop's thread when the job is handed
    # over (a GPU backend puts the decode on a stream of its own there, ordered after the work before).
    decode_context: Callable[[], AbstractContextManager] = nullcontext
    # Generate a plan entry (its stages after the audio's reading) in a thread of their own while the entry
    # before it is decoded and published, when ``stream`` is asked to (``ahead``): what they make is small
    # (the preview's motion), the frames stay where they were. The items yielded are the same.
    generate_ahead: bool = False
    # Decode a segment this many frames at a time when ``stream`` is asked for ``pieces`` (0: whole), each
    # piece published as it is drawn: the encoder takes the first frames of a segment while the rest are
    # drawn. Only where decoding a piece on its own draws the same frames (``Segment.piece``).
    decode_piece_frames: int = 0

    def __post_init__(self) -> None:
        check_chain((self.init,), first_input=RequestInput, last_output=object)
        check_chain(self.generate, first_input=ChunkInput, last_output=Generated)
        # What the generation chain hands to decode is whatever its output's segment() returns.
        segment_type = (get_type_hints(self.generate[-1].output_type.segment).get("return", Segment) if self.generate
                        else Segment)
        check_chain((self.decode,), first_input=segment_type, last_output=Frames)
        z = self.sizes
        assert not (self.generate_ahead and (self.overlap_decode or self.lead)), "generate ahead alone, no lead"
        if z.transition_frames and z.lead_frames + z.first < z.transition_frames // 2 + 1:
            raise AvatarRenderError(
                f"Config key 'chunk.first_frames' ({z.first}) is too short for chunk.transition_frames "
                f"({z.transition_frames}): the first chunk must hold at least "
                f"{z.transition_frames // 2 + 1 - z.lead_frames} frames so that the I chunk over its seam has a frame "
                "to start from.")

    def audio_kept_from(self, plan: ChunkPlan) -> int:
        """The first frame whose audio the chunk loop may still read once ``plan`` is done: I chunks
        reach back before the next N chunk, and each window has ``audio_pad_s`` on either side."""
        C, T = self.sizes.chunk_frames, self.sizes.transition_frames
        return max(0, plan.start - C - T - 1 - math.ceil(self.audio_pad_s * self.fps))

    def puts_per_chunk(self) -> int:
        """Puts of pieces (``stream(pieces=True)``) that hold a chunk's frames or fewer: a writer's queue of one
        chunk counts this many (a 45-frame segment goes in five of 9, so four of them are 36 frames)."""
        piece = self.decode_piece_frames
        return math.ceil(self.sizes.chunk_frames / piece) if piece else 1

    def modules(self) -> tuple[Module, ...]:
        stages = (self.init, *self.generate, self.decode)
        return tuple(m for s in stages for m in s.modules())

    def prepare(self, request: RequestInput, *, clock: Clock = lambda name: nullcontext()) -> Any:
        """Load the modules, put each where it runs, and compute the static conditioning of one request.

        The init stage's modules are loaded and run first; the chunk loop's modules (the DiT) are
        read meanwhile in a thread of their own and put on their device only after it ran, so the
        encoders it frees (run once per request) and the DiT are never on the device together unless
        a module loads straight onto it (random weights do). ``clock`` times "load" (the wait for
        weights) and "init" (the init stage) apart.
        """
        first = self.init.modules()
        rest = _unique(m for m in self.modules() if not any(m is f for f in first))
        loading = _LOAD.submit(_load_all, rest, _current_cuda_device())
        try:
            with clock("load"):
                for module in first:
                    self._place(module)
            with clock("init"):
                static, _ = self.init.run(request, static=None, carry=None)
        finally:
            with clock("load"):
                loading.result()  # (also when init failed: no thread left reading)
        with clock("load"):
            for module in rest:
                module.prefetch()  # weights read into host memory go to their device (no-op for host-only modules)
        return static

    @staticmethod
    def _place(module: Module) -> None:
        module.load()
        module.prefetch()  # weights read into host memory go to their device (no-op for host-only modules)

    def stream(
        self, static: Any, audio: AudioSource, *, seed: int, clock: Clock = lambda name: nullcontext(),
        resume: Checkpoint | None = None, checkpoints: bool = False, ahead: bool = False, pieces: bool = False,
    ) -> Iterator[Published | Checkpoint]:
        """Run the chunk loop; yield every output frame exactly once, in order, as soon as it is final.
        ``clock(stage_name)`` times each stage call.

        With ``checkpoints``, a ``Checkpoint`` follows the publications of every plan entry; given one
        as ``resume`` (from the same static conditioning, audio and seed), the loop goes on from there
        and yields exactly what the uninterrupted loop would have yielded after it. The audio before
        that point is decoded again (fast-forward), not processed.

        ``ahead``: a pipeline that ``generate_ahead``s does so (the next entry's audio is then read before
        an entry's frames go out: not for audio that arrives as it plays, which would hold them back).

        ``pieces``: a pipeline that decodes in pieces (``decode_piece_frames``) publishes each piece as it is
        drawn (see ``Published``; segments decoded in the decode thread go out whole).
        """
        state, done = self._start(static, resume)
        piece = self.decode_piece_frames if pieces else 0
        if ahead and self.generate_ahead:
            yield from self._stream_ahead(state, done, static, audio, seed=seed, clock=clock, resume=resume,
                                          checkpoints=checkpoints, piece=piece)
            return
        number = -1
        job: Optional[_Job] = None  # the entry being decoded while the next one is generated (overlap_decode)
        for number, plan in enumerate(self._plans(audio)):
            if number < done:
                self._fast_forward(plan, audio, last=resume.last_plan if number == done - 1 else None)
                continue
            if number == 0 and self.lead is not None and plan.publish_end >= self.sizes.lead_frames:
                # The lead frames go out before N0 is generated (and never in a thread: nothing would overlap).
                state = replace(state, pending=state.pending + (self.lead(static),))
                lead = self._hand_over(-1, plan, state, static, clock=clock, overlap=False)
                state = yield from self._collect(lead, static, audio, clock=clock, checkpoints=False, piece=piece)
            state = self._generate(plan, state, static, audio, seed=seed, clock=clock)
            if job is not None:
                state = yield from self._collect(job, static, audio, clock=clock, checkpoints=checkpoints, piece=piece,
                                                 into=state)
            # (N0's frames are the first sampled ones: they go out at once, not after N1)
            overlap = self.overlap_decode and number > 0
            job = self._hand_over(number, plan, state, static, clock=clock, overlap=overlap)
            state = job.state
            if not overlap:
                state = yield from self._collect(job, static, audio, clock=clock, checkpoints=checkpoints, piece=piece)
                job = None
        if job is not None:
            state = yield from self._collect(job, static, audio, clock=clock, checkpoints=checkpoints, piece=piece)
        if number + 1 < done:
            raise ResumeError("The saved chunk plan is longer than this audio, so the render cannot be resumed.")
        assert not state.pending and not state.anchors, "every frame published, every anchor used"

    def _stream_ahead(self, state: RollingState, done: int, static: Any, audio: AudioSource, *, seed: int,
                      clock: Clock, resume: Checkpoint | None, checkpoints: bool,
                      piece: int) -> Generator[Published | Checkpoint, None, None]:
        """``stream`` with each plan entry's generation in the generation thread while the entry before it is
        decoded and published (from the second entry on: the first one's frames go out at once). The
        generation starts from the state the entry before left (its segments taken out); the decode carry
        joins it once that entry's frames are out."""
        plans = enumerate(self._plans(audio))
        number = -1

        def advance() -> Optional[ChunkPlan]:  # the next entry to generate (those before ``done`` fast-forwarded)
            nonlocal number
            for number, plan in plans:
                if number >= done:
                    return plan
                self._fast_forward(plan, audio, last=resume.last_plan if number == done - 1 else None)
            return None

        def start(plan: ChunkPlan, after: RollingState) -> Future:
            window = self._window(plan, audio, clock)  # (the reader is the loop's)
            return _GENERATE.submit(self._run_generation, plan, window, after, static, seed=seed, clock=clock)

        plan = advance()
        generating = None if plan is None else start(plan, state)
        try:
            while plan is not None:
                generated, generating = generating.result(), None
                job = self._hand_over(number, plan, replace(generated, decode_carry=state.decode_carry), static,
                                      clock=clock, overlap=False)
                first = state.next_frame == 0 or number == done
                if first:  # (the first frames wait for no other work)
                    state = yield from self._collect(job, static, audio, clock=clock, checkpoints=checkpoints,
                                                     piece=piece)
                plan = advance()
                if plan is not None:
                    generating = start(plan, job.state)
                if not first:
                    state = yield from self._collect(job, static, audio, clock=clock, checkpoints=checkpoints,
                                                     piece=piece)
        finally:
            if generating is not None:  # (the loop was left early: nothing runs on after it)
                wait([generating])
        if number + 1 < done:
            raise ResumeError("The saved chunk plan is longer than this audio, so the render cannot be resumed.")
        assert not state.pending and not state.anchors, "every frame published, every anchor used"

    def _start(self, static: Any, resume: Checkpoint | None) -> tuple[RollingState, int]:
        """The rolling state to begin with, and how many plan entries it has done."""
        if resume is None:
            return RollingState(carries=tuple(s.init_carry(static) for s in self.generate),
                                decode_carry=self.decode.init_carry(static)), 0
        state = resume.state
        if len(state.carries) != len(self.generate):
            raise ResumeError("The saved state does not fit this backend's stages, so the render cannot be resumed.")
        state = replace(state, carries=tuple(s.restored_carry(c, static) for s, c in zip(self.generate, state.carries)),
                        decode_carry=self.decode.restored_carry(state.decode_carry, static))
        return state, resume.plans_done

    def _plans(self, audio: AudioSource) -> Iterator[ChunkPlan]:
        return iter_schedule(chunk_frames=self.sizes.chunk_frames, transition_frames=self.sizes.transition_frames,
                             context_frames=self.sizes.context_frames, lead_frames=self.sizes.lead_frames,
                             first_frames=self.sizes.first, frames_upto=audio.probe)

    def _fast_forward(self, plan: ChunkPlan, audio: AudioSource, *, last: ChunkPlan | None) -> None:
        """A plan entry done before the resume point: only the audio moves on (``last``: the saved
        checkpoint's plan, given for the last such entry, which must be this one)."""
        if last is not None and plan != last:
            raise ResumeError(
                "The saved chunk plan does not match this audio and config, so the render cannot be resumed.")
        audio.release(self.audio_kept_from(plan))

    def _generate(self, plan: ChunkPlan, state: RollingState, static: Any, audio: AudioSource, *, seed: int,
                  clock: Clock) -> RollingState:
        """One plan entry through the generation stages: its anchors kept, its final part queued for decode."""
        return self._run_generation(plan, self._window(plan, audio, clock), state, static, seed=seed, clock=clock)

    def _window(self, plan: ChunkPlan, audio: AudioSource, clock: Clock) -> np.ndarray:
        """The model audio a plan entry's generation hears (read where the chunk loop runs: the reader is its own)."""
        with clock("audio"):
            return audio.model_audio(plan.start, plan.end, pad_s=self.audio_pad_s)

    def _run_generation(self, plan: ChunkPlan, window: np.ndarray, state: RollingState, static: Any, *, seed: int,
                        clock: Clock) -> RollingState:
        x: Any = ChunkInput(plan=plan, fps=self.fps, audio=window, audio_rate=self.audio_rate,
                            audio_pad_s=self.audio_pad_s,
                            anchors=tuple(state.anchors[f] for f in plan.anchors), seed=seed)
        carries = list(state.carries)
        for i, stage in enumerate(self.generate):
            with clock(stage.name):
                x, carries[i] = _run(stage, x, static=static, carry=carries[i], plan=plan)
        generated: Generated = x
        state = replace(state, carries=tuple(carries)).with_anchors({f: generated.anchor(f) for f in plan.keep},
                                                                    drop=plan.anchors)
        start = max(plan.publish_start, state.next_frame)  # (N0 after its lead frames went out)
        if plan.publish_end > start:
            state = replace(state, pending=state.pending + (generated.segment(start, plan.publish_end),))
        return state

    def _hand_over(self, number: int, plan: ChunkPlan, state: RollingState, static: Any, *, clock: Clock,
                   overlap: bool) -> _Job:
        """Take every pending segment that is next in frame order out of the state; with ``overlap``,
        start decoding them in the decode thread (else ``_collect`` decodes each just before it goes out,
        so each chunk record times its own decode)."""
        segments = []
        while True:
            state, segment = state.pop_ready()
            if segment is None:
                break
            segments.append(segment)
        result = None
        if overlap:
            result = _DECODE.submit(self._decode_all, tuple(segments), state.decode_carry, static, plan, clock,
                                    self.decode_context())
        return _Job(number=number, plan=plan, state=state, segments=tuple(segments), result=result)

    def _decode_all(self, segments: tuple[Segment, ...], carry: Any, static: Any, plan: ChunkPlan, clock: Clock,
                    context: AbstractContextManager) -> tuple[list[Frames], Any]:
        out = []
        with context:
            for segment in segments:
                frames, carry = _run_timed(self.decode, segment, static=static, carry=carry, plan=plan, clock=clock)
                out.append(frames)
        return out, carry

    def _collect(self, job: _Job, static: Any, audio: AudioSource, *, clock: Clock, checkpoints: bool,
                 into: Optional[RollingState] = None, piece: int = 0
                 ) -> Generator[Published | Checkpoint, None, RollingState]:
        """Yield a job's frames with their audio (and, with ``checkpoints``, the checkpoint of its plan
        entry); return the state after it: the job's own, or ``into`` (a later entry's) with its decode carry.
        ``piece``: segments decoded here go out ``piece`` frames at a time (0: whole)."""
        T = self.sizes.transition_frames
        decoded, decode_carry = job.result.result() if job.result is not None else (None, job.state.decode_carry)
        for i, segment in enumerate(job.segments):
            if decoded is None:
                decode_carry = yield from self._decode(job.plan, segment, piece, static, decode_carry, audio,
                                                       clock=clock)
            else:
                frames, decoded[i] = decoded[i], None
                yield self._published(job.plan, segment, frames, audio, clock=clock)
                del frames  # (the consumer holds them now: not kept alive while the next one is decoded)
            # I chunks reach back before what was published last: keep their audio.
            audio.release(max(0, segment.start - T - 1 - math.ceil(self.audio_pad_s * self.fps)))
        done = replace(job.state, decode_carry=decode_carry)
        if checkpoints:
            yield self._checkpoint(job.number + 1, job.plan, done)
        return done if into is None else replace(into, decode_carry=decode_carry)

    def _decode(self, plan: ChunkPlan, segment: Segment, piece: int, static: Any, carry: Any, audio: AudioSource,
                *, clock: Clock) -> Generator[Published, None, Any]:
        """Decode ``segment`` and publish it: whole, or (``piece`` > 0) in pieces of at most ``piece`` frames (of
        even lengths), each published as it is drawn; return the decode carry after it."""
        n = segment.end - segment.start
        count = max(1, math.ceil(n / piece)) if piece else 1
        bounds = [segment.start + n * k // count for k in range(count + 1)]
        for a, b in zip(bounds, bounds[1:]):
            part = segment if count == 1 else segment.piece(a, b)
            frames, carry = _run_timed(self.decode, part, static=static, carry=carry, plan=plan, clock=clock)
            yield self._published(plan, segment, frames, audio, clock=clock, more=b < segment.end)
            del frames  # (the consumer holds them now: not kept alive while the next piece is decoded)
        return carry

    def _published(self, plan: ChunkPlan, segment: Segment, frames: Frames, audio: AudioSource, *, clock: Clock,
                   more: bool = False) -> Published:
        """``frames``, all of ``segment`` or a piece of it, with the segment's audio (none before its last piece)."""
        if more:
            out_audio = audio.output_audio(segment.start, segment.start)  # (C, 0)
        else:
            with clock("audio"):
                out_audio = audio.output_audio(segment.start, segment.end)
        return Published(plan=plan, start=frames.start, frames=frames.frames, audio=out_audio,
                         segment_start=segment.start, more=more)

    def _checkpoint(self, plans_done: int, plan: ChunkPlan, state: RollingState) -> Checkpoint:
        saved = replace(state, carries=tuple(s.saved_carry(c) for s, c in zip(self.generate, state.carries)),
                        decode_carry=self.decode.saved_carry(state.decode_carry))
        return Checkpoint(plans_done=plans_done, last_plan=plan, state=saved)


def _unique(modules) -> tuple[Module, ...]:
    out: list[Module] = []
    for m in modules:
        if not any(m is o for o in out):
            out.append(m)
    return tuple(out)


def _current_cuda_device() -> Optional[int]:
    """This thread's CUDA device when the process uses one (a launch's process has its own), else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


def _load_all(modules: tuple[Module, ...], cuda_device: Optional[int]) -> None:
    if cuda_device is not None:  # the loading thread computes where the loop's thread does
        sys.modules["torch"].cuda.set_device(cuda_device)
    for module in modules:
        module.load()


def _run(stage: Stage, x: Any, *, static: Any, carry: Any, plan: ChunkPlan) -> tuple[Any, Any]:
    """``stage.run``, with a failure that names the stage and the chunk it was working on."""
    try:
        return stage.run(x, static=static, carry=carry)
    except AvatarRenderError as exc:
        exc.args = (f"{str(exc).rstrip('.')} (stage {stage.name}, chunk {plan.kind}{plan.index}).",)
        raise
    except Exception as exc:
        raise StageError(stage.name, f"{plan.kind}{plan.index}", exc) from exc


def _run_timed(stage: Stage, x: Any, *, static: Any, carry: Any, plan: ChunkPlan, clock: Clock) -> tuple[Any, Any]:
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
