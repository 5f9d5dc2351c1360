"""Tests only: a hook on the preview's drawing, called before each segment is drawn.

The preview draws a segment in pieces (``Pipeline.decode_piece_frames``), one decode call each; a test
that stops, holds or kills a render "before its k-th segment" counts segments, not calls: the hook runs
before the call that draws a segment's first frames, with the segment's number (1, 2, ...).
"""

from __future__ import annotations

from typing import Callable

from avatar_render.preview import engine


def before_each_segment(hook: Callable[[int], None]) -> None:
    """Patch the preview engine (this process) so that ``hook(k)`` runs before the k-th segment is drawn."""
    run, piece = engine.PreviewRender.run, engine.MotionSegment.piece
    later: set[int] = set()  # first frames of the pieces that do not begin their segment
    count = [0]

    def piece_of(self, start: int, end: int):
        if start != self.start:
            later.add(start)
        return piece(self, start, end)

    def hooked(self, x, *, static, carry):
        if x.start in later:
            later.discard(x.start)
        else:
            count[0] += 1
            hook(count[0])
        return run(self, x, static=static, carry=carry)

    engine.MotionSegment.piece = piece_of
    engine.PreviewRender.run = hooked
