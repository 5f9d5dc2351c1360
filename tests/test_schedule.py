import itertools

import pytest

from avatar_render.pipeline.schedule import iter_schedule, plan_for


def simulate_publication(plan):
    """Publish like the pipeline does: segments become final per entry, go out in frame order."""
    pending, published, next_frame = [], [], 0
    for entry in plan:
        if entry.publish_end > entry.publish_start:
            pending.append((entry.publish_start, entry.publish_end))
        progressed = True
        while progressed:
            progressed = False
            for seg in pending:
                if seg[0] == next_frame:
                    pending.remove(seg)
                    published.extend(range(*seg))
                    next_frame = seg[1]
                    progressed = True
    assert not pending
    return published


CASES = [
    (total, chunk, trans, ctx)
    for total, (chunk, trans, ctx) in itertools.product(
        [1, 2, 7, 32, 33, 34, 50, 65, 66, 67, 99, 100, 101, 149, 150, 151, 1000],
        [(33, 0, 5), (33, 8, 5), (33, 31, 5), (50, 0, 1), (50, 7, 1), (50, 12, 0), (4, 2, 1), (3, 1, 1), (1, 0, 0), (81, 16, 9)],
    )
]


def first_fits(first, lead, trans):
    """A first chunk that keeps the first seam's left anchor (the schedule's precondition)."""
    return first is None or (lead + first >= 1 and (trans == 0 or lead + first >= trans // 2 + 1))


@pytest.mark.parametrize("total,chunk,trans,ctx", CASES)
@pytest.mark.parametrize("lead", [0, 1, 3])
@pytest.mark.parametrize("first", [None, 4, 12])
def test_every_frame_published_once_in_order(total, chunk, trans, ctx, lead, first):
    if not first_fits(first, lead, trans):
        pytest.skip("first chunk too short for this transition")
    plan = plan_for(total, chunk_frames=chunk, transition_frames=trans, context_frames=ctx, lead_frames=lead, first_frames=first)
    assert simulate_publication(plan) == list(range(total))
    assert sum(e.last for e in plan) == 1 and plan[-1].last


@pytest.mark.parametrize("total,chunk,trans,ctx", CASES)
@pytest.mark.parametrize("lead", [0, 1])
@pytest.mark.parametrize("first", [None, 4, 12])
def test_n_and_i_structure(total, chunk, trans, ctx, lead, first):
    if not first_fits(first, lead, trans):
        pytest.skip("first chunk too short for this transition")
    plan = plan_for(total, chunk_frames=chunk, transition_frames=trans, context_frames=ctx, lead_frames=lead, first_frames=first)
    ns = [e for e in plan if e.kind == "N"]
    n0 = lead + (chunk if first is None else first)
    bounds = [0] + list(range(n0, total, chunk)) + [total]
    assert [(e.start, e.end) for e in ns] == list(zip(bounds, bounds[1:]))
    done = {}
    for pos, e in enumerate(plan):
        if e.kind == "N":
            done[e.index] = e
            if e.index:
                prev = done[e.index - 1]
                assert prev.start <= e.context[0] <= e.context[1] == prev.end
                assert e.context[1] - e.context[0] == min(ctx, prev.num_frames)
        else:
            left, right = done[e.index], done.get(e.index + 1)
            assert right is not None and plan[pos - 1] is right, "I(k) runs right after N(k+1)"
            a0, a1 = e.anchors
            assert left.start <= a0 < left.end and a0 in left.keep
            assert right.start <= a1 < right.end and a1 in right.keep
            assert (e.start, e.end) == (a0, a1 + 1)
            assert (e.publish_start, e.publish_end) == (a0 + 1, a1)
            # anchors are never regenerated: they are published by the N chunks that made them
            assert left.publish_start <= a0 < left.publish_end
            assert right.publish_start <= a1 < right.publish_end
    if trans == 0 or total <= n0:
        assert all(e.kind == "N" for e in plan)
    else:
        kinds = "".join(e.kind for e in plan)
        assert kinds.replace("I", "") == "N" * len(ns) and "II" not in kinds and not kinds.startswith("I")
    # every kept frame is used by exactly one I chunk
    kept = sorted(f for e in ns for f in e.keep)
    used = sorted(f for e in plan for f in e.anchors)
    assert kept == used


def test_short_audio_is_one_n_chunk():
    (only,) = plan_for(10, chunk_frames=33, transition_frames=8)
    assert (only.kind, only.start, only.end, only.publish_start, only.publish_end, only.last) == ("N", 0, 10, 0, 10, True)


def test_lead_frames_align_chunks_to_a_latent_grid():
    plan = plan_for(200, chunk_frames=72, transition_frames=8, context_frames=9, lead_frames=1)
    assert [(e.kind, e.start, e.end) for e in plan if e.kind == "N"] == [("N", 0, 73), ("N", 73, 145), ("N", 145, 200)]
    assert all((e.publish_start - 1) % 4 == 0 for e in plan if e.publish_start)  # 1 + 4k: latent starts


def test_short_first_chunk_keeps_the_latent_grid_after_it():
    plan = plan_for(200, chunk_frames=28, transition_frames=8, context_frames=5, lead_frames=1, first_frames=4)
    assert [(e.kind, e.start, e.end) for e in plan if e.kind == "N"][:3] == [("N", 0, 5), ("N", 5, 33), ("N", 33, 61)]
    assert all((e.start - 1) % 4 == 0 for e in plan if e.kind == "N" and e.start)  # every later chunk on a latent start
    first_seam = next(e for e in plan if e.kind == "I")
    assert first_seam.index == 0 and first_seam.anchors == (0, 9)  # the I chunk over the seam at frame 5
    assert plan[0].publish_end == 1 and plan[0].keep == (0,)


def test_one_frame_more_than_a_chunk():
    plan = plan_for(34, chunk_frames=33, transition_frames=8, context_frames=5)
    assert [(e.kind, e.start, e.end) for e in plan] == [("N", 0, 33), ("N", 33, 34), ("I", 28, 34)]
    assert plan[2].anchors == (28, 33)


def test_empty_input_has_no_chunks():
    assert plan_for(0, chunk_frames=10) == []


def test_lookahead_is_at_most_one_chunk():
    chunk, total = 25, 10_000
    asked = []

    def frames_upto(n):
        asked.append(n)
        return min(n, total)

    n_end = 0
    for e in iter_schedule(chunk_frames=chunk, transition_frames=6, context_frames=2, frames_upto=frames_upto):
        n_end = max(n_end, e.end)
        assert max(asked) <= n_end + chunk + 1
    assert max(asked) <= total + chunk + 1


def test_very_long_plan_is_lazy():
    gen = iter_schedule(chunk_frames=33, transition_frames=8, context_frames=5, frames_upto=lambda n: n)  # endless input
    first = list(itertools.islice(gen, 1000))  # N0 N1 I0 N2 I1 ... N500
    assert first[-1].kind == "N" and first[-1].index == 500
