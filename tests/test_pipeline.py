"""The chunk loop with stand-in stages: order, anchors, audio, bounded state, type checks."""

import dataclasses
import gc
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pytest

from avatar_render.errors import AvatarRenderError, StageError
from avatar_render.pipeline.module import Module
from avatar_render.pipeline.pipeline import ChunkSizes, Pipeline
from avatar_render.pipeline.stage import Stage
from avatar_render.pipeline.state import Checkpoint
from avatar_render.pipeline.types import ChunkInput, Frames, Generated, RequestInput, Segment

LIVE = [0]  # RampChunk objects alive


def _dead():
    LIVE[0] -= 1


@dataclass(frozen=True)
class Static:
    value: int


@dataclass(frozen=True)
class Ramp(Segment):
    values: np.ndarray  # (T,) the frame index each frame shows

    def piece(self, start, end):
        return Ramp(start=start, end=end, values=self.values[start - self.start : end - self.start])


@dataclass(frozen=True)
class RampChunk(Generated):
    values: np.ndarray
    seen_anchors: tuple

    def __post_init__(self):
        LIVE[0] += 1
        weakref.finalize(self, _dead)

    def segment(self, start, end) -> Ramp:
        s = start - self.plan.start
        return Ramp(start=start, end=end, values=self.values[s : s + end - start])

    def anchor(self, frame):
        return ("anchor", frame, float(self.values[frame - self.plan.start]))


class Init(Stage):
    name, input_type, output_type = "init", RequestInput, Static

    def run(self, x, *, static, carry):
        return Static(7), None


class Gen(Stage):
    name, input_type, output_type = "a2v", ChunkInput, RampChunk

    def init_carry(self, static):
        return 0

    def run(self, x, *, static, carry):
        p = x.plan
        if p.kind == "I":
            assert x.anchors == (("anchor", p.start, float(p.start)), ("anchor", p.end - 1, float(p.end - 1)))
        assert len(x.audio) == round((p.num_frames / 25 + 2 * 0.04) * 16000)
        values = np.arange(p.start, p.end, dtype=np.float64) + (0.5 if p.kind == "I" else 0.0)
        return RampChunk(plan=p, values=values, seen_anchors=x.anchors), carry + (p.kind == "N")


class Decode(Stage):
    name, input_type, output_type = "decode", Ramp, Frames

    def init_carry(self, static):
        return -1

    def run(self, x, *, static, carry):
        assert x.start == carry + 1, "decode sees one unbroken sequence"
        frames = (np.zeros((len(x.values), 2, 2, 3), np.uint8)
                  + (np.asarray(x.values) % 251).astype(np.uint8)[:, None, None, None])
        return Frames(start=x.start, frames=frames), x.end - 1


class FakeAudio:
    """total frames of 1-channel audio at 100 samples per frame."""

    def __init__(self, total):
        self.total, self.total_frames, self.released = total, None, 0

    def probe(self, upto):
        if upto >= self.total:
            self.total_frames = self.total
        return min(upto, self.total)

    def model_audio(self, start, end, *, pad_s=0.0):
        return np.zeros(round(((end - start) / 25 + 2 * pad_s) * 16000), np.float32)

    def output_audio(self, start, end):
        return np.full((1, (end - start) * 100), start, np.float32)

    def release(self, before):
        assert before >= self.released
        self.released = before


def make(chunk=10, trans=4, ctx=2):
    return Pipeline(init=Init(), generate=(Gen(),), decode=Decode(), sizes=ChunkSizes(chunk, ctx, trans),
                    fps=Fraction(25), audio_rate=16000, audio_pad_s=0.04)


@pytest.mark.parametrize("total,chunk,trans",
                         [(1, 10, 4), (10, 10, 4), (11, 10, 4), (95, 10, 4), (95, 10, 0), (333, 16, 7)])
def test_stream_publishes_each_frame_once_in_order(total, chunk, trans):
    pipe = make(chunk, trans)
    pubs = list(pipe.stream(Static(1), FakeAudio(total), seed=0))
    values = np.concatenate([p.frames[:, 0, 0, 0] for p in pubs])
    starts = [p.start for p in pubs]
    assert starts == sorted(starts) and pubs[0].start == 0 and pubs[-1].end == total
    assert all(a.end == b.start for a, b in zip(pubs, pubs[1:]))
    assert len(values) == total
    # I chunks replace the seam frames (x.5 values), N chunks the rest
    audio = np.concatenate([p.audio for p in pubs], axis=1)
    assert audio.shape == (1, total * 100)


def test_retained_chunks_do_not_grow_with_length():
    pipe = make(chunk=8, trans=4)
    most = 0
    for i, _ in enumerate(pipe.stream(Static(1), FakeAudio(8 * 300), seed=0)):
        if i % 50 == 0:
            gc.collect()
        most = max(most, LIVE[0])
    assert most <= 2, f"{most} generated chunks alive at once"


def test_wiring_with_wrong_types_is_refused_at_build():
    with pytest.raises(TypeError, match="takes"):
        Pipeline(init=Init(), generate=(Gen(), Gen()), decode=Decode(), sizes=ChunkSizes(10, 2, 4),
                 fps=Fraction(25), audio_rate=16000, audio_pad_s=0.04)
    with pytest.raises(TypeError, match="ends in"):
        Pipeline(init=Init(), generate=(), decode=Decode(), sizes=ChunkSizes(10, 2, 4),
                 fps=Fraction(25), audio_rate=16000, audio_pad_s=0.04)


def test_prepare_loads_each_module_then_puts_it_on_its_device():
    """Init's modules first; the chunk loop's are read meanwhile and put on their device after init ran
    (encoders and DiT never resident together)."""
    calls = []

    class Weights(Module):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def weight_files(self):
            return []

        def _load(self):
            calls.append(f"load {self.name}")

        def prefetch(self):
            calls.append(f"prefetch {self.name}")

    text, dit, shared = Weights("text"), Weights("dit"), Weights("vae")

    class InitWithWeights(Init):
        def modules(self):
            return (text, shared)

        def run(self, x, *, static, carry):
            calls.append("init")
            return super().run(x, static=static, carry=carry)

    class GenWithWeights(Gen):
        def modules(self):
            return (dit, shared)

    pipe = Pipeline(init=InitWithWeights(), generate=(GenWithWeights(),), decode=Decode(), sizes=ChunkSizes(10, 2, 4),
                    fps=Fraction(25), audio_rate=16000, audio_pad_s=0.04)
    clocked = []

    @contextmanager
    def clock(name):
        clocked.append(name)
        yield

    assert pipe.prepare(None, clock=clock) == Static(7)
    ours = [c for c in calls if c != "load dit"]  # the DiT is read beside the init stage, in a thread of its own
    assert ours == ["load text", "prefetch text", "load vae", "prefetch vae", "init", "prefetch dit"]
    assert calls.index("load dit") < calls.index("prefetch dit")
    assert "init" in clocked and "load" in clocked


def make_lead(chunk=10, trans=4, ctx=2, *, first=0, lead=0, overlap=False):
    return Pipeline(init=Init(), generate=(Gen(),), decode=Decode(), sizes=ChunkSizes(chunk, ctx, trans, lead, first),
                    fps=Fraction(25), audio_rate=16000, audio_pad_s=0.04, overlap_decode=overlap,
                    lead=(lambda static: Ramp(start=0, end=lead, values=np.arange(lead, dtype=np.float64) + 0.25))
                    if lead else None)


@pytest.mark.parametrize("total", [1, 3, 9, 40, 95])
@pytest.mark.parametrize("first,lead", [(0, 0), (4, 0), (4, 1), (2, 1), (6, 3)])
def test_short_first_chunk_and_lead_frames_publish_every_frame_once(total, first, lead):
    pubs = [p for p in make_lead(first=first, lead=lead).stream(Static(1), FakeAudio(total), seed=0)]
    assert [p.start for p in pubs] == sorted(p.start for p in pubs) and pubs[-1].end == total
    assert all(a.end == b.start for a, b in zip(pubs, pubs[1:]))
    values = np.concatenate([p.frames[:, 0, 0, 0] for p in pubs])
    assert len(values) == total
    if lead:  # the lead frames come first, on their own, made from the static conditioning (x.25 values)
        assert (pubs[0].start, pubs[0].end) == (0, min(lead, total)) and pubs[0].plan.index == 0
    n0 = lead + (first or 10)
    n_plans = [p.plan for p in pubs if p.plan.kind == "N"]
    assert n_plans[0].end == min(n0, total)


def test_a_first_chunk_too_short_for_the_transition_is_one_sentence():
    with pytest.raises(AvatarRenderError, match="chunk.first_frames"):
        make_lead(trans=8, first=2)


@pytest.mark.parametrize("trans,first,lead", [(4, 0, 0), (0, 4, 1), (4, 4, 1)])
def test_overlapped_decode_yields_the_same_items(trans, first, lead):
    """Decode in its thread beside the next chunk's generation: the same publications and checkpoints."""
    def items(overlap):
        out = []
        for item in make_lead(trans=trans, first=first, lead=lead, overlap=overlap).stream(
                Static(1), FakeAudio(77), seed=0, checkpoints=True):
            if isinstance(item, Checkpoint):
                out.append(("ckpt", item.plans_done, item.last_plan, item.state.decode_carry, item.state.next_frame,
                            tuple((s.start, s.end) for s in item.state.pending), tuple(sorted(item.state.anchors))))
            else:
                out.append(("pub", item.plan, item.start, item.frames.tobytes(), item.audio.tobytes()))
        return out

    assert items(True) == items(False)


class ResumedAudio(FakeAudio):
    def release(self, before):  # a resumed loop's fast-forward may release further than it reads next (harmless)
        self.released = max(self.released, before)


def test_resume_from_every_checkpoint_with_a_lead_and_a_short_first_chunk():
    pipe = make_lead(trans=4, first=4, lead=1)
    full = list(pipe.stream(Static(1), FakeAudio(60), seed=0, checkpoints=True))
    pubs = [(p.start, p.frames.tobytes()) for p in full if not isinstance(p, Checkpoint)]
    for i, ck in enumerate(full):
        if not isinstance(ck, Checkpoint):
            continue
        after = [(p.start, p.frames.tobytes()) for p in full[i + 1:] if not isinstance(p, Checkpoint)]
        again = [(p.start, p.frames.tobytes()) for p in pipe.stream(Static(1), ResumedAudio(60), seed=0, resume=ck)]
        assert again == after
    assert [s for s, _ in pubs][:2] == [0, 1]


@pytest.mark.parametrize("error,kind",
                         [(ValueError("bad shape"), StageError),
                          (AvatarRenderError("Out of disk."), AvatarRenderError)])
def test_a_failing_stage_is_named_with_its_chunk(error, kind):
    class Failing(Decode):
        def run(self, x, *, static, carry):
            if x.start >= 20:
                raise error
            return super().run(x, static=static, carry=carry)

    pipe = Pipeline(init=Init(), generate=(Gen(),), decode=Failing(), sizes=ChunkSizes(10, 2, 4),
                    fps=Fraction(25), audio_rate=16000, audio_pad_s=0.04)
    with pytest.raises(kind) as raised:
        list(pipe.stream(Static(1), FakeAudio(95), seed=0))
    # I1 publishes frames 18-22
    assert "stage decode" in str(raised.value) and "chunk I1" in str(raised.value), str(raised.value)
    assert str(error).rstrip(".") in str(raised.value)


class ReadLog(ResumedAudio):
    """FakeAudio that logs which plan entries' windows were read (by their first frame)."""

    def __init__(self, total):
        super().__init__(total)
        self.reads = []

    def model_audio(self, start, end, *, pad_s=0.0):
        self.reads.append(start)
        return super().model_audio(start, end, pad_s=pad_s)


def make_ahead(trans=4, first=0, ahead=True):
    return Pipeline(init=Init(), generate=(Gen(),), decode=Decode(), sizes=ChunkSizes(10, 2, trans, 0, first),
                    fps=Fraction(25), audio_rate=16000, audio_pad_s=0.04, generate_ahead=ahead)


@pytest.mark.parametrize("trans,first,total", [(4, 0, 77), (0, 4, 77), (4, 4, 60), (4, 0, 3)])
def test_generation_ahead_yields_the_same_items_and_reads_the_next_chunk_before_one_goes_out(trans, first, total):
    """Each entry generated in its thread while the one before goes out: the same publications and
    checkpoints as the plain loop; the next entry's audio read (its generation started) before an entry's
    frames are published, except the first entry's, which go out at once; a resume from each checkpoint
    yields what followed it."""
    def items(ahead, audio, resume=None):
        out = []
        for item in make_ahead(trans, first).stream(Static(1), audio, seed=0, checkpoints=True, ahead=ahead,
                                                    resume=resume):
            if isinstance(item, Checkpoint):
                out.append(("ckpt", item.plans_done, item.last_plan, item.state.decode_carry, item.state.next_frame,
                            tuple((s.start, s.end) for s in item.state.pending), tuple(sorted(item.state.anchors)),
                            item.state.carries))
            else:
                out.append(("pub", item.plan, item.start, item.frames.tobytes(), item.audio.tobytes(),
                            len(audio.reads), audio.reads.index(item.plan.start)))
        return out

    plain, ahead = items(False, ReadLog(total)), items(True, ReadLog(total))
    assert [i[:5] for i in ahead] == [i[:5] for i in plain]
    pubs = [i for i in ahead if i[0] == "pub"]
    entries = sum(1 for i in plain if i[0] == "ckpt")  # (one window read per entry)
    first_entry = pubs[0][1]
    for _, plan, _, _, _, read, entry in pubs:
        if plan == first_entry:
            assert read == entry + 1  # nothing read beyond it
        elif entry + 1 < entries:
            assert read >= entry + 2, f"the entry after {plan} was not under way when its frames went out"
    checkpoints = [i for i, item in enumerate(make_ahead(trans, first).stream(
        Static(1), ReadLog(total), seed=0, checkpoints=True)) if isinstance(item, Checkpoint)]
    full = list(make_ahead(trans, first).stream(Static(1), ReadLog(total), seed=0, checkpoints=True))
    for i in checkpoints:
        after = [(p.start, p.frames.tobytes()) for p in full[i + 1:] if not isinstance(p, Checkpoint)]
        again = [(p.start, p.frames.tobytes()) for p in make_ahead(trans, first).stream(
            Static(1), ReadLog(total), seed=0, resume=full[i], ahead=True)]
        assert again == after


@pytest.mark.parametrize("ahead", [False, True])
@pytest.mark.parametrize("piece", [3, 4, 10])
def test_segments_decoded_in_pieces_publish_the_same_frames_and_audio(piece, ahead):
    """``pieces``: each segment goes out in pieces of at most ``decode_piece_frames`` frames, decoded in
    order (the decode carry unbroken), the segment's audio with its last piece: joined, the items of a
    stream without pieces, checkpoints in the same places."""
    def items(pieces):
        pipe = dataclasses.replace(make_ahead(4, 0), decode_piece_frames=piece)
        assert pipe.puts_per_chunk() == -(-10 // piece)
        out, parts, most = [], [], 0
        for item in pipe.stream(Static(1), FakeAudio(77), seed=0, checkpoints=True, ahead=ahead, pieces=pieces):
            if isinstance(item, Checkpoint):
                assert not parts, "a checkpoint between the pieces of a segment"
                out.append(("ckpt", item.plans_done, item.state.decode_carry))
                continue
            parts.append(item)
            if item.more:
                assert item.audio.shape == (1, 0) and len(item.frames) <= piece
                continue
            first = parts[0].whole_start
            assert [p.whole_start for p in parts] == [first] * len(parts)
            assert [p.start for p in parts] == [first] + [p.end for p in parts[:-1]]
            assert pieces or len(parts) == 1
            frames = np.concatenate([p.frames for p in parts])
            out.append(("pub", item.plan, first, len(frames), frames.tobytes(), item.audio.tobytes()))
            parts, most = [], max(most, len(parts))
        return out, most

    (whole, _), (split, most) = items(False), items(True)
    assert split == whole
    longest = max(i[3] for i in whole if i[0] == "pub")
    assert most == -(-longest // piece) and (most > 1 or piece >= longest)
