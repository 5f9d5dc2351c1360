"""Work started in a thread before it is asked for, taken once by its name (``preview.early`` starts it).
Imports nothing heavy: it runs before the package is imported."""

from __future__ import annotations

import threading
from typing import Any, Callable

FACE, PHONE_DECODER = "face", "phone decoder"  # what preview.early starts


class _Ahead:
    """Something made in a thread of its own; None when making it failed (whoever asks then makes it and
    says what is wrong, in its own words)."""

    def __init__(self, name: str, make: Callable[[], Any]) -> None:
        self._make, self._done, self._value = make, threading.Event(), None
        # (not a daemon: a command that ends before taking it waits for it; a daemon thread still inside
        # OpenCV or PocketSphinx when the interpreter ends aborts the process)
        threading.Thread(target=self._run, name=f"ahead-{name}", daemon=False).start()

    def _run(self) -> None:
        try:
            self._value = self._make()
        except Exception:  # noqa: BLE001 - see the class
            self._value = None
        finally:
            self._done.set()

    def value(self) -> Any:
        self._done.wait()
        return self._value


_lock = threading.Lock()
_started: dict[str, _Ahead] = {}


def begin(name: str, make: Callable[[], Any]) -> None:
    """Start ``make()`` in a thread; ``take(name)`` gets its value (one not taken is replaced)."""
    with _lock:
        _started[name] = _Ahead(name, make)


def take(name: str) -> Any:
    """What ``begin(name, ...)`` made, waiting for it while it is made; None when nothing was started under
    that name (or making it failed). Each is taken once."""
    with _lock:
        ahead = _started.pop(name, None)
    return None if ahead is None else ahead.value()
