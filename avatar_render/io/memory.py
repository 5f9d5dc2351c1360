"""Freed frame buffers handed back to the operating system at once.

A chunk's frames (tens of MB) are freed once encoded. glibc serves a block below its mmap threshold
from its heap (the threshold rises to the size of the largest mmapped block freed, up to 32 MiB) and
keeps it there, resident, once freed, where the next chunk's differently sized segments only partly
reuse it: the process's resident size, and its peak, then depended on which segment sizes were
freed in which order (the final drain's 45-frame segment came on top of a freed 40-frame one)
rather than on the frames alive. ``release_freed`` gives those pages back (``malloc_trim``); without
glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Callable, Optional


def _malloc_trim() -> Optional[Callable[[int], int]]:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_freed() -> None:
    """Give the free pages of every malloc arena back to the operating system."""
    if _TRIM is not None:
        _TRIM(0)
