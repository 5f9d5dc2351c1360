"""The first frame and the throughput levers on the tiny diffusion backend (CPU): what each must keep
(the same frames exactly, or within a tolerance where the arithmetic changes), and the work counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from avatar_render.config import load_config
from avatar_render.distributed.device_mesh import single
from avatar_render.errors import AvatarRenderError
from avatar_render.infinitetalk.components import architectures
from avatar_render.io.audio import AudioReader
from avatar_render.io.reference import load_reference
from avatar_render.job.setup import build_pipeline
from avatar_render.models.dit import build_dit, materialize_random
from avatar_render.models.dit_speed import GraphedCalls, fp8_filter
from avatar_render.pipeline.state import Checkpoint
from avatar_render.pipeline.types import Published, RequestInput
from avatar_render.telemetry import Telemetry
from tests.media import speech_like, write_audio

ROOT = Path(__file__).resolve().parents[1]
FRAMES = 45  # three chunks of the tiny config


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    return write_audio(tmp_path_factory.mktemp("speech") / "a.wav", speech_like(2.0, 16000, seed=2), 16000)


def render(face: Path, audio: Path, *overrides: str, telemetry: Telemetry | None = None) -> list:
    """The tiny backend's chunk loop over ``audio``: every item it yields, up to FRAMES frames."""
    cfg = load_config(ROOT / "configs" / "tiny.yaml", overrides)
    pipe = build_pipeline(cfg, single())
    static = pipe.prepare(RequestInput(reference=load_reference(face), reference_path=face, width=64, height=64,
                                       seed=0))
    items = []
    with AudioReader(audio, fps=cfg.fps, model_rate=pipe.audio_rate) as reader:
        for item in pipe.stream(static, reader, seed=0, checkpoints=True):
            if isinstance(item, Published) and telemetry is not None:
                items.append((item, telemetry.work().get("dit_tokens", 0)))
            else:
                items.append(item)
            if isinstance(item, Published) and item.end >= FRAMES:
                break
    return items


def frames(items: list) -> np.ndarray:
    return np.concatenate([p.frames for p in items if isinstance(p, Published)])


@pytest.mark.slow
def test_first_frame_goes_out_before_any_sampling_and_a_short_first_chunk_cuts_the_wait(face_png, speech):
    telemetry = Telemetry(keep_records=False)
    long = [x for x in render(face_png, speech, telemetry=telemetry) if isinstance(x, tuple)]
    telemetry = Telemetry(keep_records=False)
    short = [x for x in render(face_png, speech, "chunk.first_frames=4", telemetry=telemetry) if isinstance(x, tuple)]
    for pubs in (long, short):
        (first, tokens), (second, _) = pubs[0], pubs[1]
        assert (first.start, first.end, tokens) == (0, 1, 0)  # the reference latent's frame: no DiT token before it
        assert second.start == 1
    # the first sampled frames wait for N0: 5 latents of 4x4 tokens, 3 steps of 3 passes, or 2 latents when short
    assert long[1][1] == 5 * 16 * 9 and short[1][1] == 2 * 16 * 9
    assert (long[1][0].end, short[1][0].end) == (17, 5)
    # frame 0 is the same either way (the reference latent, decoded)
    assert np.array_equal(long[0][0].frames, short[0][0].frames)


@pytest.mark.slow
def test_cached_cross_attention_keys_and_values_give_the_same_frames(face_png, speech):
    cached = render(face_png, speech)
    assert np.array_equal(frames(cached), frames(render(face_png, speech, "model.cache_kv=false")))
    assert all(c.state.carries[1].kv is None for c in cached if isinstance(c, Checkpoint))  # never saved


@pytest.mark.slow
def test_decode_beside_the_next_chunks_sampling_gives_the_same_items(face_png, speech):
    plain = render(face_png, speech, "chunk.first_frames=4")
    overlapped = render(face_png, speech, "chunk.first_frames=4", "run.overlap_decode=true")
    assert [type(x) for x in plain] == [type(x) for x in overlapped]
    assert np.array_equal(frames(plain), frames(overlapped))
    for a, b in zip(plain, overlapped):
        if isinstance(a, Checkpoint):
            assert (a.plans_done, a.last_plan, a.state.next_frame) == (b.plans_done, b.last_plan, b.state.next_frame)
            assert torch.equal(a.state.decode_carry.recent, b.state.decode_carry.recent)


def test_math_attention_backend_matches_the_default_within_a_grey_level(face_png, speech):
    a, b = frames(render(face_png, speech)), frames(render(face_png, speech, "model.attention=math"))
    assert a.shape == b.shape and np.abs(a.astype(int) - b.astype(int)).max() <= 2


@pytest.mark.slow
def test_compiled_blocks_match_eager_within_a_grey_level(face_png, speech):
    """Regional torch.compile of each DiT block (inductor on the CPU: about half a minute to compile)."""
    a, b = frames(render(face_png, speech)), frames(render(face_png, speech, "model.compile=blocks"))
    assert a.shape == b.shape and np.abs(a.astype(int) - b.astype(int)).max() <= 2


@pytest.mark.parametrize("key", ["model.fp8=true", "model.cuda_graphs=true", "model.attention=cudnn"])
def test_gpu_only_levers_are_one_sentence_on_a_cpu(face_png, key):
    cfg = load_config(ROOT / "configs" / "tiny.yaml", (key,))
    with pytest.raises(AvatarRenderError, match=f"'{key.split('=')[0]}'"):
        build_pipeline(cfg, single())


def test_a_first_chunk_too_short_for_the_transition_is_one_sentence():
    cfg = load_config(ROOT / "configs" / "tiny.yaml",
                      ("chunk.first_frames=4", "chunk.chunk_frames=32", "chunk.transition_frames=16"))
    with pytest.raises(AvatarRenderError, match=r"'chunk.first_frames' \(4\) is too short .* at least \d+ frames"):
        build_pipeline(cfg, single())


def test_dit_pass_with_cached_keys_and_values_is_exact():
    c = architectures("tiny").dit
    net = materialize_random(build_dit(c), dtype=torch.float32).eval()
    x, t = torch.randn(1, 36, 3, 8, 8), torch.tensor([700.0])
    text, clip = torch.randn(1, 9, c.text_dim), torch.randn(1, 257, c.clip_dim)
    audio = torch.randn(1, 9, c.audio_window, c.audio_layers, c.audio_dim)
    with torch.no_grad():
        ref, kv = net(x, t, text, clip, audio, keep_kv=True)
        assert torch.equal(ref, net(x, t, text, clip, audio))
        assert torch.equal(ref, net(x, t, None, None, audio, cross_kv=kv))
    assert len(kv) == c.num_layers and kv[0][0].shape == (1, c.text_len, c.num_heads, c.head_dim)


class Recorded:
    """A stand-in for a CUDA graph: replay runs the captured function again on the captured tensors."""

    def __init__(self, run):
        self.run, self.replays = run, 0

    def replay(self):
        self.replays += 1
        self.output[...] = self.run()


def test_graphed_calls_copy_inputs_in_and_outputs_out_per_signature():
    captured = []

    def capture(run, warmup):
        g = Recorded(run)
        g.output = run()  # the graph's own output tensor, overwritten by each replay
        captured.append(g)
        return g, g.output

    graphed = GraphedCalls(lambda x, kv: x * 2 + (0 if kv is None else kv[0]), capture=capture)
    a, b = torch.ones(3), torch.full((3,), 5.0)
    first = graphed(a, None)
    second = graphed(b, None)  # same signature: the same graph, the new input copied in
    assert torch.equal(first, torch.full((3,), 2.0)) and torch.equal(second, torch.full((3,), 10.0))
    assert len(captured) == 1 and captured[0].replays == 2
    assert torch.equal(first, torch.full((3,), 2.0))  # what was returned is a copy, not the graph's output
    third = graphed(torch.ones(4), (torch.ones(4),))  # another signature: another graph
    assert torch.equal(third, torch.full((4,), 3.0)) and len(captured) == 2


def test_fp8_takes_the_linear_layers_float8_kernels_take():
    assert fp8_filter(torch.nn.Linear(32, 64), "q") and not fp8_filter(torch.nn.Linear(24, 64), "x")
    assert not fp8_filter(torch.nn.LayerNorm(32), "norm")
