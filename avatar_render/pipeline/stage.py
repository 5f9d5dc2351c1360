"""Stage: a typed unit of execution. Inputs and outputs are frozen dataclasses; no per-request data
lives on the stage: what must survive a chunk is passed in and out as the stage's ``carry``."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

from avatar_render.pipeline.module import Module

In = TypeVar("In")
Out = TypeVar("Out")


class Stage(ABC, Generic[In, Out]):
    name: ClassVar[str]
    input_type: ClassVar[type]
    output_type: ClassVar[type]

    def modules(self) -> tuple[Module, ...]:
        """The modules this stage runs; the pipeline loads them before the first chunk."""
        return ()

    def init_carry(self, static: Any) -> Any:
        """This stage's part of the rolling state at the start of a request (None = stateless)."""
        return None

    def saved_carry(self, carry: Any) -> Any:
        """What a checkpoint keeps of ``carry`` (all of it unless a stage can rebuild the rest)."""
        return carry

    def restored_carry(self, saved: Any, static: Any) -> Any:
        """The carry again, from what ``saved_carry`` kept (when a render resumes)."""
        return saved

    @abstractmethod
    def run(self, x: In, *, static: Any, carry: Any) -> tuple[Out, Any]:
        """One call: ``x`` -> (output, new carry)."""


def check_chain(stages: tuple[Stage, ...], *, first_input: type, last_output: type) -> None:
    """Fail when stages are wired with mismatched types (at build time, before any request)."""
    expected = first_input
    for stage in stages:
        for t in (stage.input_type, stage.output_type):
            if not (dataclasses.is_dataclass(t) and t.__dataclass_params__.frozen):
                raise TypeError(f"stage {stage.name}: {t.__name__} must be a frozen dataclass")
        if not issubclass(expected, stage.input_type):
            raise TypeError(f"stage {stage.name} takes {stage.input_type.__name__} but is given {expected.__name__}")
        expected = stage.output_type
    if not issubclass(expected, last_output):
        raise TypeError(f"the chain ends in {expected.__name__}, expected {last_output.__name__}")
