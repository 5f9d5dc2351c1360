"""The A2V DiT: published key layout, tiny forward, numerics against diffusers and a direct reference."""

import json
import math
from pathlib import Path

import pytest
import torch

from avatar_render.models.audio_proj import pack_audio_windows
from avatar_render.models.dit import DiTConfig, WanAudioDiT, build_dit, materialize_random
from avatar_render.models.dit_names import native_to_diffusers

FIXTURE = Path(__file__).parent / "fixtures" / "infinitetalk_dit_keys.json"
TINY = DiTConfig.tiny()


def tiny_inputs(cfg: DiTConfig, *, batch=2, frames=3, h=4, w=6, text=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        x=torch.randn(batch, cfg.in_dim, frames, h, w, generator=g),
        t=torch.tensor([999.0, 37.5][:batch]),
        context=torch.randn(batch, text, cfg.text_dim, generator=g),
        clip_fea=torch.randn(batch, cfg.clip_tokens, cfg.clip_dim, generator=g),
        audio=torch.randn(batch, cfg.video_frames(frames), cfg.audio_window, cfg.audio_layers, cfg.audio_dim, generator=g),
    )


@pytest.fixture(scope="module")
def tiny_model() -> WanAudioDiT:
    return materialize_random(build_dit(TINY), seed=1)


def test_full_size_meta_model_matches_published_layout():
    model = build_dit(DiTConfig.infinitetalk_14b())
    got = {k: list(v.shape) for k, v in model.state_dict().items()}
    want = json.loads(FIXTURE.read_text())
    assert len(want) == 1633
    assert sorted(set(want) - set(got)) == [] and sorted(set(got) - set(want)) == []
    assert {k: v for k, v in got.items() if want[k] != v} == {}
    assert all(p.is_meta for p in model.parameters())
    assert sum(math.prod(v) for v in got.values()) == sum(math.prod(v) for v in want.values())


def test_tiny_forward_shapes_and_sizes(tiny_model):
    assert 1_000 < sum(p.numel() for p in tiny_model.parameters()) < 300_000
    inputs = tiny_inputs(TINY)
    with torch.no_grad():
        out = tiny_model(**inputs)
    assert out.shape == (2, TINY.out_dim, 3, 4, 6) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    with torch.no_grad():  # a single latent frame (no later-frame audio) and a scalar timestep
        one = tiny_model(**{**tiny_inputs(TINY, frames=1), "t": torch.tensor(500.0)})
    assert one.shape == (2, TINY.out_dim, 1, 4, 6)


def test_bad_audio_shape_is_rejected(tiny_model):
    inputs = tiny_inputs(TINY)
    inputs["audio"] = inputs["audio"][:, :-1]
    with pytest.raises(ValueError, match="audio has shape"):
        tiny_model(**inputs)


def test_bf16_params_keep_float32_islands():
    model = materialize_random(build_dit(TINY), dtype=torch.bfloat16, seed=1)
    dtypes = {k: v.dtype for k, v in model.named_parameters()}
    assert dtypes["blocks.0.self_attn.q.weight"] == torch.bfloat16
    assert dtypes["audio_proj.proj1.weight"] == torch.bfloat16
    for name in ("blocks.0.modulation", "head.modulation", "blocks.1.norm3.weight", "blocks.0.self_attn.norm_q.weight",
                 "time_embedding.0.weight", "time_projection.1.weight", "head.head.weight"):
        assert dtypes[name] == torch.float32, name
    ref = materialize_random(build_dit(TINY), seed=1)
    inputs = tiny_inputs(TINY)
    with torch.no_grad():
        low, high = model(**inputs), ref(**inputs)
    assert low.dtype == torch.float32
    assert (low - high).abs().mean() < 0.05 * high.abs().mean()  # bf16 rounding only


def diffusers_twin(model: WanAudioDiT):
    from diffusers import WanTransformer3DModel

    c = model.config
    twin = WanTransformer3DModel(
        patch_size=c.patch_size, num_attention_heads=c.num_heads, attention_head_dim=c.head_dim, in_channels=c.in_dim,
        out_channels=c.out_dim, text_dim=c.text_dim, freq_dim=c.freq_dim, ffn_dim=c.ffn_dim, num_layers=c.num_layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=c.eps, image_dim=c.clip_dim, added_kv_proj_dim=c.dim,
    )
    state = {native_to_diffusers(k): v for k, v in model.state_dict().items() if native_to_diffusers(k)}
    missing, unexpected = twin.load_state_dict(state, strict=False)
    assert missing == [] and unexpected == []
    return twin.eval()


def test_non_audio_path_matches_diffusers():
    """diffusers has no audio branch: zero the audio output projection (its contribution is then exactly
    zero) and compare everything else. diffusers does not pad text: give it the zero-padded context."""
    model = materialize_random(build_dit(TINY), seed=2)
    twin = diffusers_twin(model)
    inputs = tiny_inputs(TINY, seed=3)
    padded = torch.nn.functional.pad(inputs["context"], (0, 0, 0, TINY.text_len - inputs["context"].shape[1]))
    with torch.no_grad():
        want = twin(inputs["x"], inputs["t"], padded, inputs["clip_fea"], return_dict=False)[0]
        with_audio = model(**inputs)
        for block in model.blocks:
            block.audio_cross_attn.proj.weight.zero_()
            block.audio_cross_attn.proj.bias.zero_()
        got = model(**inputs)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-5)
    assert (with_audio - want).abs().max() > 1e-2  # the audio branch does contribute when live


def reference_audio_tokens(proj, audio, vae_scale):
    """InfiniteTalk's audio projection written out frame by frame."""
    b, f_video, window, _, _ = audio.shape
    mid = window // 2
    rows = [proj.proj1(audio[:, 0].reshape(b, -1))]
    for start in range(1, f_video, vae_scale):
        group = [audio[:, start + i] for i in range(vae_scale)]  # each [B, W, Ly, Ca]
        packed = torch.cat([group[0][:, : mid + 1]] + [g[:, mid : mid + 1] for g in group[1:-1]] + [group[-1][:, mid:]], dim=1)
        rows.append(proj.proj1_vf(packed.reshape(b, -1)))
    h = torch.relu(torch.stack(rows, dim=1))
    h = proj.proj3(torch.relu(proj.proj2(h))).reshape(b, len(rows), proj.context_tokens, proj.output_dim)
    return torch.nn.functional.layer_norm(h, (proj.output_dim,), proj.norm.weight, proj.norm.bias, 1e-5)


def reference_audio_attention(attn, x, tokens, heads):
    """Per latent frame and head: softmax(q k^T / sqrt(d)) v over that frame's audio tokens, then proj."""
    b, f = tokens.shape[:2]
    per_frame = x.shape[1] // f
    d = x.shape[2] // heads
    k_all, v_all = attn.kv_linear(tokens).chunk(2, dim=-1)  # [B, F, N, C] each
    out = torch.zeros_like(x)
    for i in range(f):
        q = attn.q_linear(x[:, i * per_frame : (i + 1) * per_frame])
        for hd in range(heads):
            sl = slice(hd * d, (hd + 1) * d)
            w = torch.softmax(q[..., sl] @ k_all[:, i, :, sl].transpose(1, 2) / math.sqrt(d), dim=-1)
            out[:, i * per_frame : (i + 1) * per_frame, sl] = w @ v_all[:, i, :, sl]
    return attn.proj(out)


def test_audio_branch_matches_direct_reference(tiny_model):
    inputs = tiny_inputs(TINY, frames=3)
    block = tiny_model.blocks[1]
    with torch.no_grad():
        tokens = tiny_model.audio_proj(inputs["audio"])
        torch.testing.assert_close(tokens, reference_audio_tokens(tiny_model.audio_proj, inputs["audio"], TINY.vae_scale))
        assert tokens.shape == (2, 3, TINY.audio_context_tokens, TINY.audio_output_dim)
        x = torch.randn(2, 3 * 2 * 3, TINY.dim)  # 3 latent frames of 2x3 tokens
        got = block.audio_cross_attn(x, tokens)
        torch.testing.assert_close(got, reference_audio_attention(block.audio_cross_attn, x, tokens, TINY.num_heads))


def test_audio_window_packing_follows_frame_groups():
    audio = torch.arange(9 * 5, dtype=torch.float32).reshape(1, 9, 5, 1, 1)  # value = 5 * frame + offset
    first, rest = pack_audio_windows(audio, vae_scale=4)
    assert first.flatten().tolist() == [0, 1, 2, 3, 4]
    assert rest.shape == (1, 2, 8, 1, 1)
    # latent 1 = frames 1..4: frame 1 offsets 0..2, frame 2 centre, frame 3 centre, frame 4 offsets 2..4
    assert rest[0, 0].flatten().tolist() == [5, 6, 7, 12, 17, 22, 23, 24]


def test_sequence_parallel_plan_names_real_modules():
    model = materialize_random(build_dit(TINY), seed=4)
    plan = WanAudioDiT.sp_plan
    model.get_submodule(plan.split_input_of)
    model.get_submodule(plan.gather_input_of)
    for name, _ in plan.split_outputs_of:
        model.get_submodule(name)
    calls = []
    inputs = tiny_inputs(TINY)
    with torch.no_grad():
        want = model(**inputs)
        for block in model.blocks:  # what a Ulysses wrapper does: replace each ``op`` from outside
            for entry in plan.attention:
                attn = getattr(block, entry.module)
                attn.op = lambda q, k, v, inner=attn.op, name=entry.module: calls.append(name) or inner(q, k, v)
        got = model(**inputs)
    torch.testing.assert_close(got, want)
    assert calls.count("self_attn") == TINY.num_layers and calls.count("audio_cross_attn") == TINY.num_layers
    assert calls.count("cross_attn") == 2 * TINY.num_layers  # text and image
