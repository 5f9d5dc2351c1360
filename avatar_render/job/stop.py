"""Clean stops: the first SIGINT or SIGTERM lets the render finish its chunk, a second stops it at once."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Callable, Optional

from avatar_render.files.names import shown

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopNow(BaseException):
    """Raised in the main thread by a second stop signal (a BaseException, like KeyboardInterrupt,
    so that no ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class RenderStopped(Exception):
    """The render stopped on request before its end; the partial output and its journal are kept."""

    def __init__(self, *, output: Optional[Path], partial: Optional[Path], frames: int, seconds: float,
                 at_once: bool) -> None:
        self.output, self.partial, self.frames, self.seconds, self.at_once = output, partial, frames, seconds, at_once
        super().__init__(self.message)

    @property
    def message(self) -> str:
        how = "at once" if self.at_once else "at a keyframe"
        if self.partial is None:  # a live render without a file
            return f"Stopped {how}; the live stream was ended (a render without -o cannot be resumed)."
        if not self.frames:
            return f"Stopped {how}, before the first chunk was written; nothing to resume."
        if self.at_once:  # the file may hold chunks past the journal's last record
            return (f"Stopped at once: {shown(self.partial)} plays up to its last complete chunk; run the same command "
                    f"with --resume to continue from frame {self.frames} ({self.seconds:.1f} s).")
        return (f"Stopped at a keyframe: {shown(self.partial)} holds the first {self.frames} frames "
                f"({self.seconds:.1f} s); run the same command with --resume to continue.")


def stopping_notice(signum: int, *, session: bool = False) -> str:
    """What a render says on its first stop signal: how it stops, and how to stop it at once."""
    how = "ending the session: the file is finished with the audio that came" if session else \
        "stopping at the next keyframe"
    if signum == signal.SIGTERM:
        return f"SIGTERM received: {how}; a second SIGTERM (or Ctrl-C) stops at once."
    return f"{how}; press Ctrl-C again to stop at once."


class StopSignals:
    """A context manager for the main thread: while active, the first SIGINT/SIGTERM only records a
    stop request (``stop()`` turns true, and the first ``stop()`` to see it calls ``on_first(signum)``), a
    second raises StopNow. Elsewhere than in the main thread it installs nothing; nor for a signal the process
    ignores.

    The handler itself does nothing more than record: it runs between two steps of whatever the main thread was
    doing, an import among them, and anything that imports or prints from there (a console may import as it
    prints) can break the interpreter's bookkeeping of that import."""

    def __init__(self, on_first: Optional[Callable[[int], None]] = None, *, signum: Optional[int] = None) -> None:
        self.signum: Optional[int] = signum  # (given: a signal that came before, taken as the first)
        self._on_first = on_first
        self._told = False
        self._telling = threading.Lock()  # (never taken in the handler)
        self._previous: dict[int, object] = {}

    def __call__(self) -> bool:
        signum = self.signum
        if signum is not None and self._on_first is not None and not self._told:
            with self._telling:
                tell, self._told = not self._told, True
            if tell:
                self._on_first(signum)
        return signum is not None

    @property
    def told(self) -> bool:
        """Whether ``on_first`` was called (a stop request the render looked at)."""
        return self._told

    @property
    def exit_code(self) -> int:
        """The shell's code for death by the signal received (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + (self.signum or signal.SIGINT)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        if self.signum is not None:
            raise StopNow(signum)
        self.signum = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                # A signal the process was started with ignored (a script's background job: its SIGINT) stays
                # ignored, as it is from the process's first moment, not only until the render begins.
                if signal.getsignal(s) is not signal.SIG_IGN:
                    self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()
