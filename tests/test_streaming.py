"""Per-block streaming of the DiT from host memory (``dist.offload.dit=offloaded`` in one process).

On the CPU the copies are plain tensors rather than pinned-memory uploads on a side stream, but the
hooks, the swapping of every block's tensors and the upload order are the ones a GPU run uses.
"""

import dataclasses
import json
from pathlib import Path

import torch

from avatar_render.api import RenderRequest, render
from avatar_render.config import load_config
from avatar_render.distributed.streaming import BlockStreamer
from avatar_render.infinitetalk.components import architectures
from avatar_render.models.dit import build_dit, materialize_random
from tests.media import speech_like, write_audio

ROOT = Path(__file__).resolve().parents[1]


def tiny_dit_and_inputs(layers: int = 2):
    cfg = dataclasses.replace(architectures("tiny").dit, num_layers=layers)
    net = materialize_random(build_dit(cfg), seed=5).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    n, h, w = 3, 4, 4
    x = torch.randn(1, cfg.in_dim, n, h, w, generator=g)
    t = torch.tensor([700.0])
    ctx = torch.randn(1, 12, cfg.text_dim, generator=g)
    clip = torch.randn(1, 257, cfg.clip_dim, generator=g)
    audio = torch.randn(1, 1 + 4 * (n - 1), cfg.audio_window, cfg.audio_layers, cfg.audio_dim, generator=g)
    return net, (x, t, ctx, clip, audio)


def test_streamed_blocks_give_the_resident_output_and_hold_only_the_next_blocks():
    net, inputs = tiny_dit_and_inputs()
    with torch.no_grad():
        expected = net(*inputs)
        before = [p.clone() for p in net.blocks.parameters()]
        streamer = BlockStreamer(net.blocks, torch.device("cpu"), ahead=1)
        seen = []
        hook = net.blocks[1].register_forward_pre_hook(
            lambda m, a: seen.append(all(p.data_ptr() not in {h.data_ptr() for h in streamer.host[1]}
                                         for p in m.parameters()))
        )
        got = net(*inputs)
        again = net(*inputs)
        hook.remove()
    assert torch.equal(got, expected) and torch.equal(again, expected)
    assert seen == [True, True]  # block 1 ran on its uploaded copy, not on the host tensors
    # Between forwards every block points at its host copy; block 0 is on its way for the next forward.
    for block, host in zip(net.blocks, streamer.host):
        assert [p.data_ptr() for p in block.parameters()] == [t.data_ptr() for t in host]
    assert set(streamer.pending) == {0}
    streamer.release()
    assert streamer.pending == {}
    streamer.remove()
    assert all(torch.equal(a, b) for a, b in zip(before, net.blocks.parameters()))
    with torch.no_grad():
        assert torch.equal(net(*inputs), expected)


def test_streaming_several_blocks_ahead_uploads_in_order_and_wraps_around():
    net, inputs = tiny_dit_and_inputs(layers=5)
    n = len(net.blocks)
    streamer = BlockStreamer(net.blocks, torch.device("cpu"), ahead=2)
    order = []
    upload = streamer.upload
    streamer.upload = lambda i: (order.append(i % n) if i % n not in streamer.pending else None, upload(i))
    with torch.no_grad():
        net(*inputs)
    assert order == [0, 1, 2, *range(3, n), 0, 1][: n + 2]
    assert set(streamer.pending) == {0, 1}


def test_offloaded_dit_renders_the_resident_frames(tmp_path, face_png):
    audio = write_audio(tmp_path / "s.wav", speech_like(1.0, 16000), 16000)
    hashes = {}
    for policy in ("resident", "offloaded"):
        cfg = load_config(ROOT / "configs" / "tiny.yaml",
                          ("model.steps=2", "video.crf=0", f"dist.offload.dit={policy}"))
        report = tmp_path / f"{policy}.json"
        render(RenderRequest(reference=face_png, audio=audio, output=tmp_path / f"{policy}.mp4", config=cfg,
                             report=report))
        hashes[policy] = [c["video_sha256"] for c in json.loads(report.read_text())["chunks"]]
    assert hashes["offloaded"] == hashes["resident"]
