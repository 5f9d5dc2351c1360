"""The preview decode's frame buffers: reused only once nothing views them, the background kept, the
frames drawn into them the same as frames drawn afresh."""

from __future__ import annotations

import gc

import numpy as np

from avatar_render.preview.engine import MotionSegment, PreviewRender
from avatar_render.preview.frames import FramePool
from avatar_render.preview.render import render_frame
from tests.test_preview import rig_for, row


def test_a_block_comes_back_only_when_no_array_views_it():
    background = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    pool = FramePool()
    first = pool.take(3, background)
    assert first.shape == (3, 4, 6, 3) and all(np.array_equal(f, background) for f in first)
    first[:, 1:3, 2:4] = 7  # the caller's region
    one = first[2]  # a view that outlives the segment's array
    del first
    gc.collect()
    second = pool.take(3, background)
    assert not np.shares_memory(second, one)  # still viewed: not handed out again
    del one, second
    gc.collect()
    third = pool.take(2, background)  # a shorter segment takes a free block, as it was left
    assert third[0, 1, 2, 0] == 7 and np.array_equal(third[0, 0], background[0])
    del third
    gc.collect()
    assert pool.take(5, background)[4, 0, 0, 0] == background[0, 0, 0]  # none fits: a new block, filled


def test_frames_drawn_into_reused_buffers_are_the_frames_drawn_afresh():
    static = rig_for(160, 128)
    stage = PreviewRender()
    rng = np.random.default_rng(0)
    rows = [row(), row(open_=0.6, width=0.3, blink=0.5, dx=0.02, roll=2.0), row(open_=-1.0, dy=-0.01, zoom=0.02)]
    rows += [row(*rng.uniform(-1, 1, 2), rng.uniform(0, 1), *rng.uniform(-0.02, 0.02, 2), rng.uniform(-3, 3),
                 rng.uniform(-0.02, 0.02)) for _ in range(9)]
    params = np.stack(rows)  # (12, 7)
    blocks = set()
    for start, end in ((0, 5), (5, 12), (0, 7), (7, 9), (9, 12), (0, 12)):  # blocks handed out again, drawn over
        frames, _ = stage.run(MotionSegment(start=start, end=end, params=params[start:end]), static=static, carry=None)
        blocks.add(frames.frames.__array_interface__["data"][0])
        assert all(np.array_equal(frames.frames[i], render_frame(static.rig, p))
                   for i, p in enumerate(params[start:end]))
        del frames
        gc.collect()
    assert len(blocks) < 6  # (some were reused)


def test_frames_of_two_rigs_drawn_in_turn_are_the_frames_of_each_alone():
    """The head maps' buffers kept by the drawing thread follow the rig drawn: two sizes in turn draw what each
    draws alone."""
    rigs = [rig_for(160, 128).rig, rig_for(256, 256).rig]  # (heads of two sizes)
    rows = [row(open_=0.6, width=0.3, blink=0.5, dx=0.02, roll=2.0), row(open_=-1.0, dy=-0.01, zoom=0.02)]
    alone = [[render_frame(rig, p) for p in rows] for rig in rigs]
    for i, p in enumerate(rows):
        for rig, frames in zip(rigs, alone):
            assert np.array_equal(render_frame(rig, p), frames[i])
