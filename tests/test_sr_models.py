"""The SR models: published key layouts (full size, built on the meta device), streaming equal to a
one-shot run where the model is causal, and loading the published folder layouts (tiny, random).

The fixtures' names and shapes were dumped from each model's own published code, its module tree
built on the meta device: spacepxl/ComfyUI-VAE-Utils ``src/wan/vae.py`` (``WanVAE(out_channels=12)``,
dim 96, Wan2.1 settings) and H-oliday/SwiftVR ``swiftvr/models/reae.py`` (``ReAE()``) and
``swiftvr/models/transformer.py`` (``WanTransformer3DModel`` at the Wan2.2-TI2V-5B shape).
"""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from avatar_render.errors import AvatarRenderError
from avatar_render.models.sr.reae import Reae, ReaeConfig, ReaeState, decode, encode
from avatar_render.models.sr.swiftvr import ReaeModule, SwiftDiTModule, config_for
from avatar_render.models.sr.swiftvr_dit import SwiftDiTConfig, SwiftVRDiT, rope_angles
from avatar_render.models.sr.swiftvr_stream import SwiftVRStream, decoder_reach, encoder_reach
from avatar_render.models.sr.vae2x import NATIVE_FILE, Upscale2xVae, pixel_shuffle_video, vae2x_config
from avatar_render.models.sr.windows import axis_starts, window_plan
from avatar_render.models.vae import StreamingDecoder, native_vae_table
from avatar_render.pipeline.state import flatten, unflatten
from tests.model_assets import write_vae
from tests.sr_assets import write_swiftvr, write_vae2x

FIXTURES = Path(__file__).parent / "fixtures"


def shapes(net: torch.nn.Module) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in net.state_dict().items()}


# -- published layouts -----------------------------------------------------------------------------


def test_vae2x_full_size_meta_model_matches_the_published_layout():
    want = json.loads((FIXTURES / "wan21_vae_upscale2x_keys.json").read_text())
    with torch.device("meta"):
        net = Upscale2xVae(vae2x_config("14b")).build()
    got = {native: list(net.state_dict()[name].shape) for native, name in native_vae_table(net, vae2x_config("14b")).items()}
    assert len(want) == 194 and got == want
    assert want["decoder.head.2.weight"] == [12, 96, 3, 3, 3]  # the 2x head: 4 x 3 channels
    assert all(p.is_meta for p in net.parameters())


def test_reae_full_size_meta_model_matches_the_published_layout():
    want = json.loads((FIXTURES / "swiftvr_reae_keys.json").read_text())
    with torch.device("meta"):
        net = Reae(ReaeConfig())
    assert len(want) == 128 and shapes(net) == want


def test_swiftvr_dit_full_size_meta_model_matches_the_published_layout():
    want = json.loads((FIXTURES / "swiftvr_transformer_keys.json").read_text())
    with torch.device("meta"):
        net = SwiftVRDiT(SwiftDiTConfig())
    got = {k.removeprefix("transformer."): v for k, v in shapes(net).items()}
    assert len(want) == 825 and got == want
    assert 4.9e9 < sum(math.prod(v) for v in want.values()) < 5.1e9  # the 5B DiT


# -- the 2x decoder ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vae2x() -> Upscale2xVae:
    vae = Upscale2xVae(vae2x_config("tiny"), seed=3)
    vae.load()
    return vae


def test_pixel_shuffle_puts_each_pixels_twelve_values_into_a_2x2_block():
    x = torch.randn(1, 12, 3, 4, 5)
    y = pixel_shuffle_video(x)
    assert y.shape == (1, 3, 3, 8, 10)
    for t in range(3):
        assert torch.equal(y[:, :, t], F.pixel_shuffle(x[:, :, t], 2))
    assert torch.equal(y[0, 1, 2, 2 * 1 + 1, 2 * 3 + 0], x[0, 1 * 4 + 1 * 2 + 0, 2, 1, 3])  # channel c * 4 + dy * 2 + dx


@pytest.mark.parametrize("split", [[1, 4], [2, 2, 1], [5]])
def test_vae2x_streamed_decode_equals_the_full_decode_at_twice_the_size(vae2x, split):
    z = torch.randn(1, 16, 5, 4, 6, generator=torch.Generator().manual_seed(0))
    full = vae2x.decode(z)
    assert full.shape == (1, 3, 17, 64, 96)
    dec, cache, parts, a = StreamingDecoder(vae2x), StreamingDecoder(vae2x).start(), [], 0
    for n in split:
        out, cache = dec.decode(z[:, :, a : a + n], cache)
        parts.append(pixel_shuffle_video(out))
        a += n
    assert torch.equal(torch.cat(parts, dim=2), full)


@pytest.mark.parametrize("layout", ["wan", "diffusers"])
def test_vae2x_loads_both_published_layouts_from_the_download_folder(tmp_path, vae2x, layout):
    source = write_vae2x(tmp_path / "Wan2.1-VAE-upscale2x", layout)
    loaded = Upscale2xVae(vae2x_config("tiny"), path=tmp_path / "Wan2.1-VAE-upscale2x")
    assert loaded.missing_files() == []
    loaded.load()
    z = torch.randn(1, 16, 2, 3, 3)
    assert torch.equal(loaded.decode(z), source.decode(z))


def test_a_plain_wan_vae_is_refused_as_the_2x_decoder(tmp_path):
    write_vae(tmp_path / "plain", "wan")
    plain = tmp_path / "plain" / "Wan2.1_VAE.pth"
    with pytest.raises(AvatarRenderError, match=r"decoder.head.2.weight' of shape \(3, 4, 3, 3, 3\) where .* needs \(12, 4, 3, 3, 3\)"):
        Upscale2xVae(vae2x_config("tiny"), path=plain).load()
    write_vae(tmp_path / "plain", "diffusers")
    with pytest.raises(AvatarRenderError, match="emits 3 channels, not the 12"):
        Upscale2xVae(vae2x_config("tiny"), path=tmp_path / "plain" / "vae").load()


def test_a_missing_2x_decoder_names_the_published_file(tmp_path):
    vae = Upscale2xVae(vae2x_config("tiny"), path=tmp_path)
    assert vae.missing_files() == [tmp_path / NATIVE_FILE]
    with pytest.raises(AvatarRenderError, match="Wan2.1_VAE_upscale2x_imageonly_real_v1.safetensors is missing"):
        vae.load()


# -- ReAE -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reae() -> ReaeModule:
    module = ReaeModule(ReaeConfig.tiny(), dtype=torch.float32, seed=1)
    module.load()
    return module


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to float32 rounding: a convolution over 4 frames and over 24 sums in other orders."""
    return a.shape == b.shape and bool((a - b).abs().max() <= 1e-6)


@pytest.mark.parametrize("split", [[4, 20], [8, 8, 8], [12, 4, 8], [6, 18], [3, 1, 20]])
def test_reae_streams_piece_by_piece_as_at_once(reae, split):
    net = reae.model
    x = torch.rand(24, 3, 32, 48, generator=torch.Generator().manual_seed(2))
    z, _ = encode(net, x, ReaeState.start(net.encoder))
    assert z.shape == (6, 8, 2, 3)
    parts, state, a = [], ReaeState.start(net.encoder), 0
    for n in split:  # pieces need not be whole groups: an unfinished group waits in the state
        out, state = encode(net, x[a : a + n], state)
        parts += [] if out is None else [out]
        a += n
    assert same(torch.cat(parts), z)
    y, _ = decode(net, z, ReaeState.start(net.decoder))
    assert y.shape == (24, 3, 32, 48) and 0 <= y.min() and y.max() <= 1
    pieces, state = [], ReaeState.start(net.decoder)
    for a, b in ((0, 1), (1, 4), (4, 6)):
        out, state = decode(net, z[a:b], state)
        pieces.append(out)
    assert same(torch.cat(pieces), y)


# -- the windowed DiT -------------------------------------------------------------------------------


@pytest.mark.parametrize("size,win", [(9, 4), (10, 4), (16, 16), (5, 8), (33, 16), (40, 16)])
def test_windows_cover_every_token_and_each_token_reads_a_window_that_holds_it(size, win):
    for shifted in (False, True):
        starts = axis_starts(size, win, shifted=shifted)
        covered = set()
        for s in starts:
            assert 0 <= s <= max(size - win, 0)
            covered.update(range(s, min(s + win, size)))
        assert covered == set(range(size))
    plan = window_plan((2, size, 3), (win, 2), True)
    token_of_slot = plan.gather  # the token each window slot holds
    assert torch.equal(token_of_slot[plan.owner], torch.arange(2 * size * 3))


def test_shifted_windows_start_half_a_window_off():
    assert axis_starts(48, 16, shifted=False) == (0, 16, 32)
    assert axis_starts(48, 16, shifted=True) == (0, 8, 24, 32)
    assert axis_starts(10, 16, shifted=True) == (0,)


@pytest.fixture(scope="module")
def dit() -> SwiftDiTModule:
    module = SwiftDiTModule(SwiftDiTConfig.tiny(), dtype=torch.float32, seed=2)
    module.load()
    return module


def test_rope_at_offset_zero_is_diffusers_rope_and_offsets_shift_time_only(dit):
    rope = dit.model.transformer.rope
    dims = (rope.t_dim, rope.h_dim, rope.w_dim)
    cos, sin = rope_angles(dims, (3, 2, 4), 0)
    ref_cos, ref_sin = rope(torch.zeros(1, 8, 3, 4, 8))
    assert torch.allclose(cos, ref_cos.float(), atol=1e-6) and torch.allclose(sin, ref_sin.float(), atol=1e-6)
    later, _ = rope_angles(dims, (3, 2, 4), 5)
    whole, _ = rope_angles(dims, (8, 2, 4), 0)
    assert torch.allclose(later, whole[:, 5 * 8 :], atol=1e-6)
    far, _ = rope_angles(dims, (1, 2, 4), 5000)  # beyond diffusers' 1024-position table
    assert torch.isfinite(far).all()


def test_one_window_over_the_whole_grid_is_the_plain_diffusers_model(dit):
    from diffusers import WanTransformer3DModel

    plain = WanTransformer3DModel(**dit.config.model).eval()
    plain.load_state_dict({k.removeprefix("transformer."): v for k, v in dit.net.state_dict().items()})
    g = torch.Generator().manual_seed(4)
    lq = torch.randn(1, 8, 3, 4, 6, generator=g)
    prompt = dit.prompt[None]
    wide = SwiftVRDiT(SwiftDiTConfig(model=dit.config.model, window=(8, 8), prompt_tokens=8)).eval()
    wide.load_state_dict(dit.net.state_dict())
    with torch.no_grad():
        ours = wide(lq, prompt, 0)
        ref = plain(lq, torch.tensor([1000.0]), prompt, return_dict=False)[0]
        windowed = dit.model(lq, prompt, 0)  # 2 x 2-token windows over a 2 x 3 grid: not the same
    assert torch.allclose(ours, ref.float(), atol=2e-5)
    assert not torch.allclose(windowed, ref.float(), atol=1e-3)


# -- SwiftVR over a stream --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stream(reae, dit) -> SwiftVRStream:
    dit.prefetch()
    return SwiftVRStream(reae, dit, lowres=(24, 16), out=(48, 32), overlap=1, piece=1)


def frames(n: int, seed: int = 0) -> torch.Tensor:
    return (torch.rand(n, 16, 24, 3, generator=torch.Generator().manual_seed(seed)) * 255).to(torch.uint8)


def run(stream, video, bounds, state=None):
    state = stream.start() if state is None else state
    outs = []
    for a, b in bounds:
        out, state = stream.step(video[a:b], state)
        assert out.shape == (b - a, 3, 32, 48)
        outs.append(out)
    return torch.cat(outs), state


def test_each_piece_is_answered_with_exactly_its_frames_and_a_checkpoint_resumes_exactly(stream):
    video = frames(70)
    bounds = [(0, 17), (17, 33), (33, 49), (49, 65), (65, 70)]
    whole, _ = run(stream, video, bounds)
    again, _ = run(stream, video, bounds)
    assert torch.equal(whole, again)
    for cut in (1, 3):  # after the stream passed the encoder's and the decoder's windows
        head, state = run(stream, video, bounds[:cut])
        saved = unflatten(flatten(stream.saved(state)))
        assert saved.encoder is None and saved.recent_frames.shape[0] <= encoder_reach(stream.reae.model)
        tail, _ = run(stream, video, bounds[cut:], state=stream.restored(saved))
        assert torch.equal(torch.cat([head, tail]), whole)


def test_whole_groups_are_committed_and_the_state_stays_the_same_size(stream):
    video = frames(200, seed=1)
    state, sizes = stream.start(), []
    for a in range(0, 200, 20):
        _, state = stream.step(video[a : a + 20], state)
        flat = flatten(state)
        sizes.append(sum(v.nbytes for v in flat.arrays.values()))
    assert state.latents == 50 and state.frames == 200 and state.held.shape[0] == 0
    assert state.recent_latents.shape[0] == decoder_reach(stream.reae.model)
    assert len(set(sizes[3:])) == 1  # constant once the windows are full


# -- the SwiftVR folder -----------------------------------------------------------------------------


def test_swiftvr_folder_in_the_published_layout_loads_and_restores_the_same(tmp_path, reae, dit):
    source_reae, source_dit = write_swiftvr(tmp_path / "SwiftVR")
    reae_cfg, dit_cfg = config_for("tiny")
    loaded_reae = ReaeModule(reae_cfg, root=tmp_path / "SwiftVR", dtype=torch.float32)
    loaded_dit = SwiftDiTModule(dit_cfg, root=tmp_path / "SwiftVR", dtype=torch.float32)
    assert loaded_reae.missing_files() == [] and loaded_dit.missing_files() == []
    assert [p.name for p in loaded_dit.weight_files()] == ["config.json", "diffusion_pytorch_model.safetensors", "prompt_embedding.safetensors"]
    loaded_reae.load()
    loaded_dit.load()
    assert loaded_dit.config.window == dit_cfg.window and torch.equal(loaded_dit.prompt, source_dit.prompt)
    a = SwiftVRStream(source_reae, source_dit, lowres=(24, 16), out=(48, 32))
    b = SwiftVRStream(loaded_reae, loaded_dit, lowres=(24, 16), out=(48, 32))
    video = frames(9, seed=3)
    # (equal up to rounding: tensors read from a file may sit at other alignments, and take other kernels)
    assert (a.step(video, a.start())[0] - b.step(video, b.start())[0]).abs().max() < 1e-5


def test_swiftvr_folder_errors_name_the_file(tmp_path):
    root = tmp_path / "SwiftVR"
    write_swiftvr(root)
    reae_cfg, dit_cfg = config_for("tiny")
    (root / "prompt_embedding.safetensors").unlink()
    with pytest.raises(AvatarRenderError, match="prompt_embedding.safetensors is missing"):
        SwiftDiTModule(dit_cfg, root=root, dtype=torch.float32).load()
    weights = root / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(str(weights))
    state["blocks.0.attn1.extra.weight"] = torch.zeros(1)
    save_file(state, str(weights))
    save_file({"prompt_emb": torch.zeros(1, 8, 16)}, str(root / "prompt_embedding.safetensors"))
    with pytest.raises(AvatarRenderError, match="unexpected tensor 'blocks.0.attn1.extra.weight'"):
        SwiftDiTModule(dit_cfg, root=root, dtype=torch.float32).load()
    state = load_file(str(root / "reae.safetensors"))
    del state["decoder.22.bias"]
    save_file(state, str(root / "reae.safetensors"))
    with pytest.raises(AvatarRenderError, match="lack 1 tensors the SwiftVR autoencoder .ReAE. needs: 'decoder.22.bias'"):
        ReaeModule(reae_cfg, root=root, dtype=torch.float32).load()
