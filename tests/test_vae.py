"""The Wan2.1 VAE: streamed decode == full decode, bounded cache, encode, checkpoint layouts and errors."""

from __future__ import annotations

import json

import pytest
import torch

from avatar_render.errors import AvatarRenderError
from avatar_render.models.vae import (
    NATIVE_FILE,
    CausalCache,
    StreamingDecoder,
    StreamingEncoder,
    VaeConfig,
    WanVae,
    decoder_halo,
    decoder_reach,
    locate_vae,
    native_vae_table,
)
from tests.model_assets import write_vae


@pytest.fixture(scope="module")
def vae() -> WanVae:
    v = WanVae(VaeConfig.tiny(), seed=3)
    v.load()
    return v


def _latents(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 16, n, 4, 4, generator=torch.Generator().manual_seed(seed))


def _stream(vae: WanVae, z: torch.Tensor, split: list[int]) -> tuple[torch.Tensor, object]:
    dec = StreamingDecoder(vae)
    cache, out, a = dec.start(), [], 0
    for n in split:
        frames, cache = dec.decode(z[:, :, a : a + n], cache)
        out.append(frames)
        a += n
    return torch.cat(out, dim=2), cache


def test_full_decode_matches_diffusers(vae: WanVae) -> None:
    z = _latents(5)
    mean, std = vae._stats()
    reference = vae.model.decode(z * std + mean).sample  # diffusers' own decode of unnormalised latents
    ours = vae.decode(z)
    assert ours.shape == reference.shape == (1, 3, 17, 32, 32)
    assert (ours - reference).abs().max() < 1e-5


@pytest.mark.parametrize("split", [[3, 3, 3], [1, 8], [1] * 9, [2, 4, 3], [6, 0, 3]])
def test_streamed_decode_equals_full(vae: WanVae, split: list[int]) -> None:
    z = _latents(9, seed=1)
    full = vae.decode(z)
    streamed, cache = _stream(vae, z, split)
    assert streamed.shape == full.shape == (1, 3, 33, 32, 32)
    assert (streamed - full).abs().max() < 1e-5
    assert cache.steps == 9


def test_cache_is_not_mutated(vae: WanVae) -> None:
    """A carry can be decoded from twice (a retried chunk) with the same result."""
    z = _latents(6, seed=6)
    dec = StreamingDecoder(vae)
    _, cache = dec.decode(z[:, :, :3], dec.start())
    again = [dec.decode(z[:, :, 3:], cache)[0] for _ in range(2)]
    assert cache.steps == 3
    assert torch.equal(again[0], again[1])


def test_chunked_diffusers_decode_loses_frames(vae: WanVae) -> None:
    """The pitfall the streaming decoder exists for: diffusers restarts its cache on every call."""
    z = _latents(9, seed=1)
    mean, std = vae._stats()
    chunks = [vae.model.decode(z[:, :, a : a + 3] * std + mean).sample for a in (0, 3, 6)]
    assert sum(c.shape[2] for c in chunks) == 27
    assert _stream(vae, z, [3, 3, 3])[0].shape[2] == 33


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_frame_count(vae: WanVae, n: int) -> None:
    assert vae.decode(_latents(n)).shape[2] == 1 + 4 * (n - 1) == vae.config.num_frames(n)


def test_cache_is_bounded(vae: WanVae) -> None:
    z = _latents(30, seed=2)
    _, after_3 = _stream(vae, z[:, :, :3], [1, 1, 1])
    _, after_30 = _stream(vae, z, [1] * 30)
    assert after_3.nbytes() > 0
    assert after_30.nbytes() == after_3.nbytes()
    biggest = max(t.shape[2] for t in after_30.feats if isinstance(t, torch.Tensor))
    assert biggest <= 2  # frames held per layer


def test_encode_image_and_video(vae: WanVae) -> None:
    g = torch.Generator().manual_seed(4)
    video = torch.rand(1, 3, 9, 32, 32, generator=g) * 2 - 1
    assert vae.encode(video[:, :, :1]).shape == (1, 16, 1, 4, 4)
    latents = vae.encode(video)
    assert latents.shape == (1, 16, 3, 4, 4)
    mean, std = vae._stats()
    reference = (vae.model.encode(video).latent_dist.mode() - mean) / std
    assert (latents - reference).abs().max() < 1e-5
    enc = StreamingEncoder(vae)
    first, cache = enc.encode(video[:, :, :1], enc.start())
    rest, cache = enc.encode(video[:, :, 1:], cache)
    assert (torch.cat([first, rest], dim=2) - latents).abs().max() < 1e-5
    assert vae.decode(latents).shape == video.shape


def test_encode_refuses_partial_groups(vae: WanVae) -> None:
    enc = StreamingEncoder(vae)
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        enc.encode(torch.zeros(1, 3, 4, 32, 32), enc.start())


@pytest.mark.parametrize("config", [VaeConfig(), VaeConfig.tiny()], ids=["full", "tiny"])
def test_native_names_match_diffusers_converter(config: VaeConfig) -> None:
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    with torch.device("meta"):
        net = WanVae(config).build()
    table = native_vae_table(net, config)
    converted = convert_wan_vae_to_diffusers({native: native for native in table})
    assert converted == {name: native for native, name in table.items()}
    assert len(table) == len(net.state_dict())


@pytest.mark.parametrize("layout", ["wan", "diffusers"])
def test_load_layout(tmp_path, vae: WanVae, layout: str) -> None:
    source = write_vae(tmp_path, layout, seed=5)
    loaded = WanVae(VaeConfig.tiny(), path=tmp_path)
    assert loaded.layout == layout
    loaded.load()
    z = _latents(3)
    assert torch.equal(loaded.decode(z), source.decode(z))
    assert not torch.equal(loaded.decode(z), vae.decode(z))  # other weights than the fixture's


def test_wan_folder_with_dit_config_is_wan_layout(tmp_path) -> None:
    write_vae(tmp_path, "wan")
    (tmp_path / "config.json").write_text(json.dumps({"_class_name": "WanModel", "dim": 5120}))
    assert locate_vae(tmp_path) == ("wan", [tmp_path / NATIVE_FILE])


def test_missing_file_is_named(tmp_path) -> None:
    vae = WanVae(VaeConfig.tiny(), path=tmp_path)
    assert vae.missing_files() == [tmp_path / NATIVE_FILE]
    with pytest.raises(AvatarRenderError, match="Wan2.1_VAE.pth is missing"):
        vae.load()


def _rewrite(path, edit) -> None:
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def test_wrong_shape_unexpected_and_missing_keys(tmp_path) -> None:
    write_vae(tmp_path, "wan")
    path = tmp_path / NATIVE_FILE
    _rewrite(path, lambda s: s.__setitem__("decoder.head.2.bias", torch.zeros(5)))
    with pytest.raises(AvatarRenderError,
                       match=r"'decoder\.head\.2\.bias' of shape \(5\) where the Wan2.1 VAE needs \(3\)"):
        WanVae(VaeConfig.tiny(), path=tmp_path).load()
    _rewrite(path, lambda s: s.__setitem__("decoder.head.2.bias", torch.zeros(3)))
    _rewrite(path, lambda s: s.__setitem__("decoder.extra.weight", torch.zeros(1)))
    with pytest.raises(AvatarRenderError, match="unexpected tensor 'decoder.extra.weight'"):
        WanVae(VaeConfig.tiny(), path=tmp_path).load()
    _rewrite(path, lambda s: (s.pop("decoder.extra.weight"), s.pop("conv2.bias")))
    with pytest.raises(AvatarRenderError, match="lack 1 tensors the Wan2.1 VAE needs: 'post_quant_conv.bias'"):
        WanVae(VaeConfig.tiny(), path=tmp_path).load()
    # A full-size checkpoint layout given to a tiny model is a shape mismatch, not a crash.
    with pytest.raises(AvatarRenderError, match="does not match this model size"):
        WanVae(VaeConfig(base_dim=8), path=tmp_path).load()


def test_offload_and_prefetch_on_cpu(vae: WanVae) -> None:
    from avatar_render.pipeline.module import Placement

    v = WanVae(VaeConfig.tiny())
    assert v.weight_files() == []
    v.prefetch()
    assert v.placement is Placement.CPU and v.compute_device.type == "cpu"
    v.offload()
    assert v.placement in (Placement.CPU, Placement.PINNED)


def test_decoder_reach_of_the_wan_architecture() -> None:
    # conv_in + mid block: 5 causal convs at the latent rate, first up block 6 + its time conv;
    # then 7 at twice the rate, 6 + 6 + head at four times: 2 * (12 + 7 / 2 + 13 / 4) -> 38
    for config in (VaeConfig(), VaeConfig.tiny()):
        v = WanVae(config, device="meta")
        v.load()
        assert decoder_reach(v.model.decoder) == 38


@pytest.mark.parametrize("at", [5, 39, 46])
def test_cache_restored_from_the_last_latents_continues_exactly(vae: WanVae, at: int) -> None:
    """A resumed decode rebuilds the causal cache from the last ``window()`` latents alone."""
    dec = StreamingDecoder(vae)
    z = torch.randn(1, 16, 52, 2, 2, generator=torch.Generator().manual_seed(4))
    head, cache = dec.decode(z[:, :, :at], dec.start())
    want, _ = dec.decode(z[:, :, at:], cache)
    recent = z[0, :, max(0, at - dec.window()) : at]
    restored = dec.restore(recent, at)
    assert restored.steps == at
    got, _ = dec.decode(z[:, :, at:], restored)
    assert torch.equal(got, want)
    if at > dec.window():  # ten latents are far from enough: the comparison can fail
        short = CausalCache(feats=dec.decode(z[:, :, at - 10 : at], dec.start())[1].feats, steps=at)
        assert not torch.equal(dec.decode(z[:, :, at:], short)[0], want)


def test_decoder_halo_of_the_wan_architecture() -> None:
    # up blocks 6 convs at 1x + 1 after the upsample at 2x, 6 at 2x + 1 at 4x, 6 at 4x + 1 at 8x,
    # 6 at 8x, head at 8x: 6 + 1/2 + 3 + 1/4 + 3/2 + 1/8 + 3/4 + 1/8 = 12.25 -> 13
    for config in (VaeConfig(), VaeConfig.tiny()):
        v = WanVae(config, device="meta")
        v.load()
        assert decoder_halo(v.model.decoder) == 13


def _strips(vae: WanVae, z: torch.Tensor, parts: int) -> torch.Tensor:
    h = z.shape[-2]
    bounds = [round(h * i / parts) for i in range(parts + 1)]
    strips = []
    for lo, hi in zip(bounds, bounds[1:]):
        dec = StreamingDecoder(vae, rows=(lo, hi))
        cache, out = dec.start(), []
        for a, b in ((0, 1), (1, 4), (4, 6)):
            frames, cache = dec.decode(z[:, :, a:b], cache)
            out.append(frames)
        strips.append(torch.cat(out, dim=2))
    return torch.cat(strips, dim=3)


@pytest.mark.parametrize("parts", [2, 3, 5])
def test_strips_decoded_apart_make_the_whole_frame(vae: WanVae, parts: int, monkeypatch) -> None:
    """A decode split into strips of latent rows (each with its own causal cache, as each process of
    a split decode keeps) gives the whole decode, latent after latent: the same values up to float32
    rounding (convolutions over inputs of other sizes add in another order). Frames are in [-1, 1]."""
    # middle strips: 13-row halo both sides
    z = torch.randn(1, 16, 6, 40, 3, generator=torch.Generator().manual_seed(6))
    whole, _ = _stream(vae, z, [1, 3, 2])
    got = _strips(vae, z, parts)
    assert got.shape == whole.shape
    assert (got - whole).abs().max().item() < 1e-4
    monkeypatch.setattr("avatar_render.models.vae.decoder_halo", lambda decoder: 6)  # too narrow: the check fails
    assert (_strips(vae, z, parts) - whole).abs().max().item() > 1e-3
