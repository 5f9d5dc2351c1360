"""Stages run one after another in one slot of a pipeline (e.g. decode, then super-resolution, in the
publishing slot): each stage keeps its own carry (the chain's carry is the tuple of them); the
pipeline times each under its own name."""

from __future__ import annotations

from typing import Any

from avatar_render.pipeline.module import Module
from avatar_render.pipeline.stage import Stage, check_chain


class StageChain(Stage):
    def __init__(self, stages: tuple[Stage, ...]) -> None:
        assert stages, "a chain of no stages"
        check_chain(stages, first_input=stages[0].input_type, last_output=object)
        self.stages = tuple(stages)
        self.name = "+".join(s.name for s in stages)
        self.input_type = stages[0].input_type
        self.output_type = stages[-1].output_type

    def modules(self) -> tuple[Module, ...]:
        return tuple(m for s in self.stages for m in s.modules())

    def init_carry(self, static: Any) -> tuple:
        return tuple(s.init_carry(static) for s in self.stages)

    def saved_carry(self, carry: tuple) -> tuple:
        return tuple(s.saved_carry(c) for s, c in zip(self.stages, carry))

    def restored_carry(self, saved: tuple, static: Any) -> tuple:
        return tuple(s.restored_carry(c, static) for s, c in zip(self.stages, saved))

    def run(self, x: Any, *, static: Any, carry: tuple) -> tuple[Any, tuple]:
        carries = list(carry)
        for i, stage in enumerate(self.stages):
            x, carries[i] = stage.run(x, static=static, carry=carries[i])
        return x, tuple(carries)
