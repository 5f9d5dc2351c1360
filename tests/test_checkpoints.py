"""Loading the DiT from local folders (Wan-native shards + audio module, diffusers) and merging LoRAs."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from avatar_render.errors import AvatarRenderError
from avatar_render.models.checkpoints import INDEX_NAME, load_dit
from avatar_render.models.dit import DiTConfig, build_dit, materialize_random
from avatar_render.models.dit_names import diffusers_to_native, native_to_diffusers
from avatar_render.models.lora import merge_lora

TINY = DiTConfig.tiny()


def is_audio(name: str) -> bool:
    return name.startswith("audio_proj.") or ".audio_cross_attn." in name or ".norm_x." in name


@pytest.fixture(scope="module")
def weights() -> dict[str, torch.Tensor]:
    model = materialize_random(build_dit(TINY), seed=7)
    return {k: v.clone().contiguous() for k, v in model.state_dict().items()}


def write_sharded(folder: Path, tensors: dict[str, torch.Tensor], shards: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[i::shards]}
        save_file(part, str(folder / file))
        weight_map.update({k: file for k in part})
    (folder / INDEX_NAME).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return folder


def write_native(tmp: Path, weights, *, base=None, audio=None) -> tuple[Path, Path]:
    base = {k: v for k, v in weights.items() if not is_audio(k)} if base is None else base
    audio = {k: v for k, v in weights.items() if is_audio(k)} if audio is None else audio
    folder = write_sharded(tmp / "Wan2.1-I2V-14B-480P", base)
    (tmp / "InfiniteTalk" / "single").mkdir(parents=True)
    audio_file = tmp / "InfiniteTalk" / "single" / "infinitetalk.safetensors"
    save_file(audio, str(audio_file))
    return folder, audio_file


def assert_same(model, weights):
    got = model.state_dict()
    assert set(got) == set(weights)
    for k, v in weights.items():
        assert torch.equal(got[k], v), k


def test_native_sharded_layout_round_trip(tmp_path, weights):
    folder, audio = write_native(tmp_path, weights)
    assert len(list(folder.glob("*.safetensors"))) == 2
    model = load_dit(TINY, folder, audio=audio, dtype=None)
    assert_same(model, weights)
    assert not any(p.is_meta or p.requires_grad for p in model.parameters())
    inputs = dict(
        x=torch.randn(1, 36, 2, 4, 4), t=torch.tensor([500.0]), context=torch.randn(1, 5, TINY.text_dim),
        clip_fea=torch.randn(1, 257, TINY.clip_dim), audio=torch.randn(1, 5, 5, TINY.audio_layers, TINY.audio_dim),
    )
    with torch.no_grad():
        assert model(**inputs).shape == (1, 16, 2, 4, 4)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc (Linux)")
def test_loaded_weights_do_not_pin_the_files_in_memory(tmp_path, weights):
    """Each tensor is copied out of the file's memory map, so no map outlives the load."""
    folder, audio = write_native(tmp_path, weights)
    model = load_dit(TINY, folder, audio=audio, dtype=None)
    maps = Path("/proc/self/maps").read_text()
    assert str(tmp_path) not in maps
    assert_same(model, weights)


def test_audio_module_overrides_base_and_dtype_cast(tmp_path, weights):
    name = "blocks.0.audio_cross_attn.q_linear.weight"
    base = {k: v for k, v in weights.items() if not is_audio(k)}
    base[name] = torch.zeros_like(weights[name])  # a stale copy in the base shards loses to the audio file
    folder, audio = write_native(tmp_path, weights, base=base)
    model = load_dit(TINY, folder, audio=audio, dtype=torch.bfloat16)
    got = dict(model.named_parameters())
    assert torch.equal(got[name], weights[name].to(torch.bfloat16))
    assert got["blocks.0.self_attn.q.weight"].dtype == torch.bfloat16
    assert got["blocks.0.modulation"].dtype == torch.float32
    assert torch.equal(got["blocks.0.modulation"], weights["blocks.0.modulation"])


def test_diffusers_layout_round_trip(tmp_path, weights):
    base = {native_to_diffusers(k): v for k, v in weights.items() if not is_audio(k)}
    assert all(diffusers_to_native(k) is not None for k in base)
    base["blocks.0.attn2.norm_added_q.weight"] = torch.ones(TINY.dim)  # written by old diffusers; unused
    root = tmp_path / "Wan2.1-I2V-14B-480P-Diffusers"
    write_sharded(root / "transformer", base, shards=3)
    audio = tmp_path / "infinitetalk.safetensors"
    save_file({k: v for k, v in weights.items() if is_audio(k)}, str(audio))
    model = load_dit(TINY, root, audio=audio, dtype=None)
    assert_same(model, weights)


def test_mapping_is_a_bijection_on_the_base_model():
    names = [k for k in build_dit(DiTConfig.infinitetalk_14b()).state_dict() if not is_audio(k)]
    mapped = [native_to_diffusers(k) for k in names]
    assert None not in mapped and len(set(mapped)) == len(names)
    assert [diffusers_to_native(k) for k in mapped] == names
    assert native_to_diffusers("blocks.3.norm3.weight") == "blocks.3.norm2.weight"
    assert native_to_diffusers("blocks.3.cross_attn.norm_k_img.weight") == "blocks.3.attn2.norm_added_k.weight"


def error_of(fn) -> str:
    with pytest.raises(AvatarRenderError) as info:
        fn()
    msg = str(info.value)
    assert "\n" not in msg and msg.endswith(".")
    return msg


def test_missing_files_are_named(tmp_path, weights):
    folder, audio = write_native(tmp_path, weights)
    assert "No DiT weights" in error_of(lambda: load_dit(TINY, tmp_path / "InfiniteTalk", audio=audio))
    assert "does not exist" in error_of(lambda: load_dit(TINY, tmp_path / "nowhere", audio=audio))
    msg = error_of(lambda: load_dit(TINY, folder, audio=tmp_path / "multitalk.safetensors"))
    assert "multitalk.safetensors" in msg
    (folder / "diffusion_pytorch_model-00002-of-00002.safetensors").unlink()
    msg = error_of(lambda: load_dit(TINY, folder, audio=audio))
    assert "diffusion_pytorch_model-00002-of-00002.safetensors" in msg and "missing" in msg


def test_missing_unexpected_and_misshaped_tensors_are_named(tmp_path, weights):
    base = {k: v for k, v in weights.items() if not is_audio(k)}
    del base["blocks.1.ffn.2.bias"]
    base["blocks.0.self_attn.extra.weight"] = torch.zeros(3)
    base["text_embedding.0.weight"] = torch.zeros(TINY.dim, TINY.text_dim + 1)
    folder, audio = write_native(tmp_path, weights, base=base)
    msg = error_of(lambda: load_dit(TINY, folder, audio=audio))
    assert "1 tensor(s) missing (blocks.1.ffn.2.bias)" in msg
    assert "1 unexpected tensor(s) (blocks.0.self_attn.extra.weight)" in msg
    assert f"text_embedding.0.weight [{TINY.dim}, {TINY.text_dim + 1}] instead of [{TINY.dim}, {TINY.text_dim}]" in msg


def test_forgotten_audio_module_is_explained(tmp_path, weights):
    folder, _ = write_native(tmp_path, weights)
    msg = error_of(lambda: load_dit(TINY, folder))
    n_audio = sum(map(is_audio, weights))
    assert "audio_cross_attn" in msg and "infinitetalk.safetensors" in msg and f"and {n_audio - 3} more" in msg


def test_corrupt_file_is_named(tmp_path, weights):
    folder, audio = write_native(tmp_path, weights)
    audio.write_bytes(b"not a safetensors file")
    assert str(audio) in error_of(lambda: load_dit(TINY, folder, audio=audio))


# ---- LoRA --------------------------------------------------------------------------------------


def lora_pair(out_f, in_shape, rank, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rank, *in_shape, generator=g), torch.randn(out_f, rank, *([1] * (len(in_shape) - 1)), generator=g)


def test_lora_merge_formats(tmp_path, weights):
    model = materialize_random(build_dit(TINY), seed=7)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    d, r = TINY.dim, 4
    down_q, up_q = lora_pair(d, (d,), r, 1)  # Wan-native names, kohya alpha
    down_k, up_k = lora_pair(d, (d,), r, 2)  # diffusers/PEFT names, no alpha
    down_f, up_f = lora_pair(TINY.ffn_dim, (d,), r, 3)  # kohya underscores
    down_p, up_p = lora_pair(d, (TINY.in_dim, 1, 2, 2), r, 4)  # the Conv3d patch embedding
    diff_b = torch.randn(d)
    tensors = {
        "diffusion_model.blocks.0.self_attn.q.lora_down.weight": down_q,
        "diffusion_model.blocks.0.self_attn.q.lora_up.weight": up_q,
        "diffusion_model.blocks.0.self_attn.q.alpha": torch.tensor(2.0),
        "transformer.blocks.1.attn2.to_k.lora_A.weight": down_k,
        "transformer.blocks.1.attn2.to_k.lora_B.weight": up_k,
        "lora_unet_blocks_1_ffn_0.lora_down.weight": down_f,
        "lora_unet_blocks_1_ffn_0.lora_up.weight": up_f,
        "diffusion_model.patch_embedding.lora_A.weight": down_p,
        "diffusion_model.patch_embedding.lora_B.weight": up_p,
        "diffusion_model.blocks.0.audio_cross_attn.proj.diff_b": diff_b,
    }
    path = tmp_path / "distill_lora.safetensors"
    save_file(tensors, str(path))
    scale = 0.5
    assert merge_lora(model, path, scale=scale) == 5
    after = model.state_dict()
    expect = {
        "blocks.0.self_attn.q.weight": before["blocks.0.self_attn.q.weight"] + scale * (up_q @ down_q) * 2.0 / r,
        "blocks.1.cross_attn.k.weight": before["blocks.1.cross_attn.k.weight"] + scale * (up_k @ down_k),
        "blocks.1.ffn.0.weight": before["blocks.1.ffn.0.weight"] + scale * (up_f @ down_f),
        "patch_embedding.weight": before["patch_embedding.weight"] + scale * (up_p.flatten(1) @ down_p.flatten(1)).view(d, TINY.in_dim, 1, 2, 2),
        "blocks.0.audio_cross_attn.proj.bias": before["blocks.0.audio_cross_attn.proj.bias"] + scale * diff_b,
    }
    for k, v in after.items():
        torch.testing.assert_close(v, expect.get(k, before[k]), msg=k)


def test_lora_at_load_time(tmp_path, weights):
    folder, audio = write_native(tmp_path, weights)
    down, up = lora_pair(TINY.dim, (TINY.dim,), 2, 5)
    path = tmp_path / "l.safetensors"
    save_file({"diffusion_model.blocks.1.self_attn.o.lora_down.weight": down, "diffusion_model.blocks.1.self_attn.o.lora_up.weight": up}, str(path))
    model = load_dit(TINY, folder, audio=audio, dtype=None, loras=((path, 1.0),))
    torch.testing.assert_close(model.blocks[1].self_attn.o.weight, weights["blocks.1.self_attn.o.weight"] + up @ down)


def test_lora_errors_name_the_key(tmp_path):
    model = materialize_random(build_dit(TINY), seed=7)
    down, up = lora_pair(TINY.dim, (TINY.dim,), 2, 6)
    cases = {
        "diffusion_model.blocks.9.self_attn.q.lora_down.weight": "does not have",
        "diffusion_model.blocks.0.self_attn.q.weird": "no known LoRA format",
    }
    for key, why in cases.items():
        path = tmp_path / "bad.safetensors"
        save_file({key: down}, str(path))
        msg = error_of(lambda: merge_lora(model, path))
        assert key in msg and why in msg
    save_file({"diffusion_model.blocks.0.ffn.2.lora_down.weight": down, "diffusion_model.blocks.0.ffn.2.lora_up.weight": up}, str(path))
    assert "blocks.0.ffn.2" in error_of(lambda: merge_lora(model, path))
    assert "does not exist" in error_of(lambda: merge_lora(model, tmp_path / "none.safetensors"))
