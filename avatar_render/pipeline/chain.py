"""Stages run one after another in one slot of a pipeline (e.g. decode, then super-resolution, in the
publishing slot): each stage keeps its own carry (the chain's carry is the tuple of them) and is timed
under its own name by ``run_stage``."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Callable

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
        return self.run_timed(x, static=static, carry=carry, clock=None)

    def run_timed(self, x: Any, *, static: Any, carry: tuple,
                  clock: Callable[[str], AbstractContextManager] | None) -> tuple[Any, tuple]:
        carries = list(carry)
        for i, stage in enumerate(self.stages):
            if clock is None:
                x, carries[i] = stage.run(x, static=static, carry=carries[i])
            else:
                with clock(stage.name):
                    x, carries[i] = stage.run(x, static=static, carry=carries[i])
        return x, tuple(carries)


def run_stage(stage: Stage, x: Any, *, static: Any, carry: Any,
              clock: Callable[[str], AbstractContextManager]) -> tuple[Any, Any]:
    """``stage.run`` timed by ``clock``: each stage of a chain under its own name."""
    if isinstance(stage, StageChain):
        return stage.run_timed(x, static=static, carry=carry, clock=clock)
    with clock(stage.name):
        return stage.run(x, static=static, carry=carry)
