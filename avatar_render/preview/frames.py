"""Frame buffers for the preview's decode, reused once nothing holds them, their background drawn once.

Outside the head's rectangle a preview frame is the reference, in every frame: a buffer that keeps it
there from one segment to the next needs only the head redrawn, and a buffer reused is not faulted in
again page by page (a segment's frames were fresh memory each time: about a fifth of the decode's time
at 720p went to filling and faulting them).

A segment's frames are a view of a pooled block through a ctypes buffer; the block goes back to the pool
when the last array that views it is gone (the writer, the journal's hashing and the chunk loop let
go of a segment as they do of any array), never while anything can still read it. The pool keeps no
more than what was alive at once: a block too small for the segment asked for is released, not kept, and
a short segment does not take a long block (the render's segments of two lengths, 40 or 45 frames and
the 10 of an I chunk, take turns: the blocks are those two).
"""

from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np


class FramePool:
    """Blocks of frames (capacity, H, W, 3) uint8 holding ``background`` wherever the caller does not draw."""

    def __init__(self) -> None:
        self._background: np.ndarray | None = None  # (H, W, 3) uint8 the free blocks hold
        self._free: list[np.ndarray] = []  # blocks nothing views (given back on the thread that let go of them)
        self._lock = threading.Lock()

    def take(self, num_frames: int, background: np.ndarray) -> np.ndarray:
        """(num_frames, H, W, 3) uint8 frames, each ``background`` except inside the region the caller
        redraws in every frame (the caller's promise), where it holds whatever was drawn there last."""
        with self._lock:
            if self._background is not background:  # another reference (or the first call)
                self._background, self._free = background, []
            fits = [b for b in self._free if len(b) >= num_frames]
            # (a block more than twice as long is kept for a longer segment: segments of two lengths take turns)
            block = min((b for b in fits if len(b) < 2 * num_frames), key=len, default=None)
            # The blocks kept are those that can serve a segment as long as this one; the others are let go.
            self._free = [b for b in fits if b is not block]
        if block is None:
            block = np.empty((num_frames, *background.shape), np.uint8)
            block[:] = background
        lease = (ctypes.c_ubyte * block.nbytes).from_buffer(block)  # (holds ``block``)
        weakref.finalize(lease, self._give_back, block, background)
        frames = np.frombuffer(lease, np.uint8, count=num_frames * background.size)
        return frames.reshape(num_frames, *background.shape)

    def _give_back(self, block: np.ndarray, background: np.ndarray) -> None:
        with self._lock:
            if self._background is background:
                self._free.append(block)
