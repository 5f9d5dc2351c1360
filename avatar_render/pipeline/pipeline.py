"""Pipeline: wires the stages of a backend, owns the rolling state, streams final frames in order."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Callable, Iterator, Protocol, get_type_hints

import numpy as np

from avatar_render.pipeline.module import Module
from avatar_render.pipeline.schedule import iter_schedule
from avatar_render.pipeline.stage import Stage, check_chain
from avatar_render.pipeline.state import RollingState
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

    def __post_init__(self) -> None:
        check_chain((self.init,), first_input=RequestInput, last_output=object)
        check_chain(self.generate, first_input=ChunkInput, last_output=Generated)
        # What the generation chain hands to decode is whatever its output's segment() returns.
        segment_type = get_type_hints(self.generate[-1].output_type.segment).get("return", Segment) if self.generate else Segment
        check_chain((self.decode,), first_input=segment_type, last_output=Frames)

    def modules(self) -> tuple[Module, ...]:
        stages = (self.init, *self.generate, self.decode)
        return tuple(m for s in stages for m in s.modules())

    def prepare(self, request: RequestInput) -> Any:
        """Load the modules and compute the static conditioning of one request."""
        for module in self.modules():
            module.load()
        static, _ = self.init.run(request, static=None, carry=None)
        return static

    def stream(
        self, static: Any, audio: AudioSource, *, seed: int,
        clock: Callable[[str], AbstractContextManager] = lambda name: nullcontext(),
    ) -> Iterator[Published]:
        """Run the chunk loop; yield every output frame exactly once, in order, as soon as it is final.
        ``clock(stage_name)`` times each stage call."""
        state = RollingState(
            carries=tuple(s.init_carry(static) for s in self.generate),
            decode_carry=self.decode.init_carry(static),
        )
        plans = iter_schedule(
            chunk_frames=self.sizes.chunk_frames,
            transition_frames=self.sizes.transition_frames,
            context_frames=self.sizes.context_frames,
            lead_frames=self.sizes.lead_frames,
            frames_upto=audio.probe,
        )
        for plan in plans:
            with clock("audio"):
                window = audio.model_audio(plan.start, plan.end, pad_s=self.audio_pad_s)
            x: Any = ChunkInput(
                plan=plan,
                fps=self.fps,
                audio=window,
                audio_rate=self.audio_rate,
                audio_pad_s=self.audio_pad_s,
                anchors=tuple(state.anchors[f] for f in plan.anchors),
                seed=seed,
            )
            carries = list(state.carries)
            for i, stage in enumerate(self.generate):
                with clock(stage.name):
                    x, carries[i] = stage.run(x, static=static, carry=carries[i])
            generated: Generated = x
            state = replace(state, carries=tuple(carries)).with_anchors(
                {f: generated.anchor(f) for f in plan.keep}, drop=plan.anchors
            )
            if plan.publish_end > plan.publish_start:
                segment = generated.segment(plan.publish_start, plan.publish_end)
                state = replace(state, pending=state.pending + (segment,))
            del x, generated, window
            while True:
                state, segment = state.pop_ready()
                if segment is None:
                    break
                with clock(self.decode.name):
                    frames, decode_carry = self.decode.run(segment, static=static, carry=state.decode_carry)
                state = replace(state, decode_carry=decode_carry)
                with clock("audio"):
                    out_audio = audio.output_audio(segment.start, segment.end)
                yield Published(plan=plan, start=frames.start, frames=frames.frames, audio=out_audio)
                # I chunks reach back before what was published last: keep their audio.
                audio.release(max(0, segment.start - self.sizes.transition_frames - 1))
        assert not state.pending and not state.anchors, "every frame published, every anchor used"
