"""Every error of the package, in one place, each name ending in ``Error``.

``AvatarRenderError`` and its kinds are what a user sees: one sentence saying what is wrong and how to
fix it, exit code 1. ``StageError`` is the program's fault, not the user's: it carries the failing
stage's and chunk's names. The other exception classes of the package are control-flow signals, not
errors (a stop asked for, an encode abandoned, an offer refused): each is defined beside the code that
raises and catches it, derives from ``Exception`` or ``BaseException`` only, and is named for what
happened (``StopNow``, ``RenderStopped``, ``Aborted``). ``tests/test_architecture.py`` checks the rule.
"""


class AvatarRenderError(Exception):
    """A problem the user can fix. ``str(error)`` is one sentence saying what and how."""


class InputError(AvatarRenderError):
    """Something wrong inside an input file, found while it is read (the fixed file is another input,
    so an interrupted render cannot go on with it)."""


class ResumeError(AvatarRenderError):
    """A saved checkpoint does not fit the render it is given to."""


class StageError(RuntimeError):
    """An unexpected error inside a stage, with the stage's name and the chunk's."""

    def __init__(self, stage: str, chunk: str, error: Exception) -> None:
        super().__init__(f"stage {stage} failed on chunk {chunk}: {type(error).__name__}: {error}")
        self.stage, self.chunk, self.error = stage, chunk, error
