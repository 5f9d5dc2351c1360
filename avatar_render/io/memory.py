"""Freed frame buffers handed back to the operating system at once.

A chunk's frames (tens of MB) are freed once encoded. glibc keeps a freed block below its mmap
threshold (which rises to the size of the largest block freed, up to 32 MiB) in the heap, resident
and only partly reusable by the next chunk's differently sized segments, so the process's resident
size (and its peak) ended up depending on which sizes happened to be freed in which order rather
than on what was alive. ``release_freed`` gives those pages back (``malloc_trim``); elsewhere (no
glibc) it does nothing.
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
    """Give the heap's free pages back to the operating system (a few ms at most)."""
    if _TRIM is not None:
        _TRIM(0)
