"""The three encoders on tiny random weights: the published formulas, chunked audio features, layouts, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from avatar_render.errors import AvatarRenderError
from avatar_render.models.audio_encoder import TINY_WAV2VEC2, AudioEncoder
from avatar_render.models.image_encoder import CLIP_MEAN, CLIP_STD, ImageEncoder, ImageEncoderConfig
from avatar_render.models.image_encoder import NATIVE_FILE as CLIP_FILE
from avatar_render.models.text_encoder import NATIVE_FILE as T5_FILE
from avatar_render.models.text_encoder import NATIVE_TOKENIZER, TextEncoder, TextEncoderConfig, native_t5_table
from tests.media import speech_like
from tests.model_assets import write_clip, write_umt5, write_wav2vec2

FPS, RATE, HOP = 25, 16000, 640


# -- audio ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def audio_encoder() -> AudioEncoder:
    enc = AudioEncoder(config=TINY_WAV2VEC2, seed=1)
    enc.load()
    return enc


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return speech_like(150 / FPS, RATE, seed=3)[0]  # 150 frames, a whole number of them


def _family_features(enc: AudioEncoder, audio: np.ndarray) -> torch.Tensor:
    """The family's whole-file recipe, written independently: normalise, interpolate the convolutional
    features to int(duration * 25) frames (align_corners), all layers' outputs, +-2 windows clamped."""
    x = torch.from_numpy(audio)
    x = (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + 1e-7)
    frames = int(len(audio) / RATE * FPS)
    stretch = enc.net.feature_extractor.register_forward_hook(
        lambda _m, _i, out: F.interpolate(out, size=frames, mode="linear", align_corners=True)
    )
    try:
        with torch.no_grad():
            hidden = enc.net(x[None], output_hidden_states=True).hidden_states
    finally:
        stretch.remove()
    per_frame = torch.stack(hidden[1:], dim=2)[0]  # [frames, layers, C]
    idx = (torch.arange(frames)[:, None] + torch.arange(-2, 3)[None]).clamp(0, frames - 1)
    return per_frame[idx]


def _window(audio: np.ndarray, a: int, b: int, pad: int) -> np.ndarray:
    """Frames [a, b) plus ``pad`` samples on each side, zeros outside the file (as the pipeline cuts it)."""
    lo, hi = a * HOP - pad, b * HOP + pad
    out = np.zeros(hi - lo, np.float32)
    s0, s1 = max(lo, 0), min(hi, len(audio))
    out[s0 - lo : s1 - lo] = audio[s0:s1]
    return out


def _chunked(enc, audio, *, chunk, pad_s, stats=None) -> torch.Tensor:
    total = len(audio) // HOP
    parts = []
    for a in range(0, total, chunk):
        b = min(total, a + chunk)
        win = _window(audio, a, b, round(pad_s * RATE))
        parts.append(enc.encode(win, num_frames=b - a, pad_s=pad_s, first_frame=a, total_frames=total, stats=stats))
    return torch.cat(parts)


def test_whole_file_features_follow_the_family_recipe(audio_encoder: AudioEncoder, speech: np.ndarray) -> None:
    ours = audio_encoder.encode(speech, num_frames=150, pad_s=0.0, first_frame=0, total_frames=150)
    assert ours.shape == (150, 5, 2, 32)
    assert (ours - _family_features(audio_encoder, speech)).abs().max() < 1e-5


def test_chunk_features_approach_whole_file_features(audio_encoder: AudioEncoder, speech: np.ndarray) -> None:
    whole = audio_encoder.encode(speech, num_frames=150, pad_s=0.0, first_frame=0, total_frames=150)
    scale = whole.abs().mean()

    def rel(feats: torch.Tensor) -> float:
        assert feats.shape == whole.shape
        return float((feats - whole).abs().mean() / scale)

    # With the whole file's normalisation statistics, only the window's limited context differs.
    stats = audio_encoder.statistics(speech)
    assert rel(_chunked(audio_encoder, speech, chunk=33, pad_s=1.0, stats=stats)) < 0.01
    # With each window's own statistics the difference shrinks as the margins grow.
    short, long = (rel(_chunked(audio_encoder, speech, chunk=33, pad_s=p)) for p in (0.2, 2.0))
    assert long < 0.7 * short
    assert long < 0.15


def test_statistics_merge_over_spans(audio_encoder: AudioEncoder, speech: np.ndarray) -> None:
    """Statistics of a window reproduce its own normalisation; merged spans stand for the whole."""
    win = _window(speech, 40, 73, 16000)
    own = audio_encoder.encode(win, num_frames=33, pad_s=1.0)
    assert (audio_encoder.encode(win, num_frames=33, pad_s=1.0, stats=audio_encoder.statistics(win))
            - own).abs().max() < 1e-4
    whole = audio_encoder.statistics(speech)
    split = 64 * HOP
    merged = audio_encoder.statistics(speech[:split]).merge(audio_encoder.statistics(speech[split:]))
    assert merged.count == whole.count and merged.input_moments() == pytest.approx(whole.input_moments())
    a = audio_encoder.encode(win, num_frames=33, pad_s=1.0, stats=whole)
    b = audio_encoder.encode(win, num_frames=33, pad_s=1.0, stats=merged)
    assert (a - b).abs().mean() < 0.01 * a.abs().mean()  # one convolution step straddles the split
    assert (a - own).abs().mean() > 5 * (a - b).abs().mean()  # the statistics do matter


def test_gain_does_not_change_features(audio_encoder: AudioEncoder, speech: np.ndarray) -> None:
    """The family's loudness normalisation is a gain; the input normalisation cancels it."""
    win = _window(speech, 40, 73, 8000)
    a = audio_encoder.encode(win, num_frames=33, pad_s=0.5)
    b = audio_encoder.encode(win * 0.05, num_frames=33, pad_s=0.5)
    assert (a - b).abs().max() < 1e-3 * a.abs().max()


def test_window_edges_without_file_position(audio_encoder: AudioEncoder, speech: np.ndarray) -> None:
    """Without the file position the +-2 windows clamp to the audio window."""
    feats = audio_encoder.encode(_window(speech, 10, 20, 0), num_frames=10, pad_s=0.0)
    assert feats.shape == (10, 5, 2, 32)
    assert torch.equal(feats[0, 0], feats[0, 2]) and torch.equal(feats[-1, 4], feats[-1, 2])


@pytest.mark.parametrize("layout", ["safetensors", "pretraining"])
def test_audio_encoder_loads_local_folder(tmp_path, speech: np.ndarray, layout: str) -> None:
    source = write_wav2vec2(tmp_path / "w2v", layout, seed=7)
    loaded = AudioEncoder(path=tmp_path / "w2v")
    loaded.load()
    win = _window(speech, 0, 33, 8000)
    assert torch.equal(loaded.encode(win, num_frames=33, pad_s=0.5), source.encode(win, num_frames=33, pad_s=0.5))


def test_audio_encoder_errors(tmp_path) -> None:
    folder = tmp_path / "w2v"
    write_wav2vec2(folder, "pretraining")
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["wav2vec2.encoder.extra.weight"] = torch.zeros(2)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(AvatarRenderError, match="unexpected tensor 'wav2vec2.encoder.extra.weight'"):
        AudioEncoder(path=folder).load()
    state.pop("wav2vec2.encoder.extra.weight")
    state["wav2vec2.encoder.layer_norm.weight"] = torch.zeros(768)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(AvatarRenderError,
                       match=r"'wav2vec2.encoder.layer_norm.weight' of shape \(768\) .* needs \(32\)"):
        AudioEncoder(path=folder).load()
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(AvatarRenderError, match="model.safetensors is missing"):
        AudioEncoder(path=folder).load()


# -- text ----------------------------------------------------------------------------------------


def _t5_reference(sd: dict, ids: torch.Tensor, cfg: TextEncoderConfig) -> torch.Tensor:
    """Wan's umT5 encoder written from its formulas, on the Wan-native tensor names."""

    def norm(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    length, n, d = ids.shape[1], cfg.num_heads, cfg.d_kv
    rel = torch.arange(length)[None, :] - torch.arange(length)[:, None]  # key - query
    half = cfg.relative_attention_num_buckets // 2
    exact = half // 2
    far = exact + (torch.log(rel.abs().float() / exact) / math.log(128 / exact) * (half - exact)).long()
    bucket = (rel > 0).long() * half + torch.where(rel.abs() < exact, rel.abs(), far.clamp(max=half - 1))
    x = sd["token_embedding.weight"][ids]
    for i in range(cfg.num_layers):
        p = f"blocks.{i}."
        h = norm(x, sd[p + "norm1.weight"])
        q, k, v = ((h @ sd[f"{p}attn.{s}.weight"].T).view(1, length, n, d) for s in "qkv")
        bias = sd[p + "pos_embedding.embedding.weight"][bucket].permute(2, 0, 1)[None]
        att = (torch.einsum("binc,bjnc->bnij", q, k) + bias).softmax(-1)  # no 1/sqrt(d) in T5
        x = x + torch.einsum("bnij,bjnc->binc", att, v).reshape(1, length, n * d) @ sd[p + "attn.o.weight"].T
        h = norm(x, sd[p + "norm2.weight"])
        gate = F.gelu(h @ sd[p + "ffn.gate.0.weight"].T, approximate="tanh")
        x = x + ((h @ sd[p + "ffn.fc1.weight"].T) * gate) @ sd[p + "ffn.fc2.weight"].T
    return norm(x, sd["norm.weight"])


@pytest.mark.parametrize("layout", ["wan", "hf"])
def test_text_encoder_layouts(tmp_path, layout: str) -> None:
    source = write_umt5(tmp_path, layout, seed=2)
    loaded = TextEncoder(TextEncoderConfig.tiny(), path=tmp_path, dtype=torch.float32)
    assert loaded.layout == layout
    loaded.load()
    messy = " a person is  talking\n naturally &amp; smiles"
    ids = loaded.tokenize(messy)
    assert torch.equal(ids, loaded.tokenize("a person is talking naturally & smiles"))  # Wan's cleaning
    assert ids.shape == (1, 8) and ids[0, -1].item() == 1  # seven words and </s>
    out = loaded.encode(messy)
    assert out.shape == (1, 8, 16)
    assert torch.equal(out, source.encode_ids(ids))


def test_text_encoder_matches_wan_formula_and_padding(tmp_path) -> None:
    write_umt5(tmp_path, "wan", seed=4)
    enc = TextEncoder(TextEncoderConfig.tiny(), path=tmp_path, dtype=torch.float32)
    enc.load()
    ids = enc.tokenize("the woman speaks with clear lip movements")
    sd = torch.load(tmp_path / T5_FILE, weights_only=True)
    ours = enc.encode_ids(ids)
    assert (ours - _t5_reference(sd, ids, TextEncoderConfig.tiny())).abs().max() < 1e-5
    # Wan pads to text_len with the padding masked: the real tokens come out the same.
    padded = torch.cat([ids, torch.zeros(1, 9, dtype=ids.dtype)], dim=1)
    mask = (padded != 0).long()
    with torch.no_grad():
        masked = enc.net(input_ids=padded, attention_mask=mask).last_hidden_state
    assert (masked[:, : ids.shape[1]] - ours).abs().max() < 1e-5


def test_text_encoder_errors(tmp_path) -> None:
    write_umt5(tmp_path, "wan")
    bigger_vocab = TextEncoderConfig(vocab_size=100, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4)
    with pytest.raises(AvatarRenderError, match=r"'token_embedding.weight' of shape \(64, 16\) .* needs \(100, 16\)"):
        TextEncoder(bigger_vocab, path=tmp_path / T5_FILE).load()
    (tmp_path / NATIVE_TOKENIZER / "tokenizer.json").unlink()
    with pytest.raises(AvatarRenderError, match="tokenizer.json is missing"):
        TextEncoder(TextEncoderConfig.tiny(), path=tmp_path).load()


def test_random_text_encoder_without_tokenizer() -> None:
    """The tiny backend has no files at all: prompts still map to deterministic token ids."""
    enc = TextEncoder(TextEncoderConfig.tiny(), dtype=torch.float32)
    enc.load()
    ids = enc.tokenize("a  person")
    assert torch.equal(ids, enc.tokenize("a person")) and ids[0, -1].item() == 1
    assert int(ids.max()) < 64 and ids.shape == (1, 9)  # 8 bytes and </s>
    assert enc.encode("a person").shape == (1, 9, 16)
    assert not torch.equal(enc.encode("a person"), enc.encode("a woman"))


def test_full_size_architectures_on_meta() -> None:
    """The published sizes, built without memory: names and shapes the checkpoints must match."""
    with torch.device("meta"):
        t5 = TextEncoder().build()
        clip = ImageEncoder().build()
        w2v = AudioEncoder().build()
    t5_native = {n: tuple(t5.state_dict()[h].shape) for n, h in native_t5_table(t5).items()}
    assert t5_native["token_embedding.weight"] == (256384, 4096)
    assert t5_native["blocks.23.ffn.gate.0.weight"] == (10240, 4096)
    assert t5_native["blocks.0.pos_embedding.embedding.weight"] == (32, 64)
    assert len(t5_native) == 2 + 24 * 10  # embedding, final norm; per block 2 norms, q k v o, bias table, 3 ffn
    assert sum(p.numel() for p in t5.parameters()) == pytest.approx(5.68e9, rel=0.01)
    clip_shapes = {k: tuple(v.shape) for k, v in clip.state_dict().items()}
    assert clip_shapes["embeddings.position_embedding.weight"] == (257, 1280)
    assert "encoder.layers.30.mlp.fc2.weight" in clip_shapes and "encoder.layers.31.mlp.fc2.weight" not in clip_shapes
    assert w2v.config.num_hidden_layers == 12 and w2v.config.hidden_size == 768
    assert math.prod(w2v.config.conv_stride) == 320  # 50 convolutional features per second


# -- image ---------------------------------------------------------------------------------------


def _clip_reference(sd: dict, image: torch.Tensor, cfg: ImageEncoderConfig) -> torch.Tensor:
    """Wan's open-clip visual tower up to its penultimate block, written from its formulas, on native names."""
    x = F.interpolate(image, size=(cfg.image_size,) * 2, mode="bicubic", align_corners=False) * 0.5 + 0.5
    x = (x - torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(CLIP_STD).view(1, 3, 1, 1)
    d, n = cfg.hidden_size, cfg.num_heads
    x = F.conv2d(x, sd["visual.patch_embedding.weight"], stride=cfg.patch_size).flatten(2).transpose(1, 2)
    b, s = x.shape[0], x.shape[1] + 1
    x = torch.cat([sd["visual.cls_embedding"].expand(b, -1, -1), x], dim=1) + sd["visual.pos_embedding"]
    x = F.layer_norm(x, (d,), sd["visual.pre_norm.weight"], sd["visual.pre_norm.bias"], 1e-5)
    for i in range(cfg.num_layers - 1):
        p = f"visual.transformer.{i}."
        h = F.layer_norm(x, (d,), sd[p + "norm1.weight"], sd[p + "norm1.bias"], 1e-5)
        q, k, v = (h @ sd[p + "attn.to_qkv.weight"].T + sd[p + "attn.to_qkv.bias"]).view(b, s, 3, n, d // n).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + a.transpose(1, 2).reshape(b, s, d) @ sd[p + "attn.proj.weight"].T + sd[p + "attn.proj.bias"]
        h = F.layer_norm(x, (d,), sd[p + "norm2.weight"], sd[p + "norm2.bias"], 1e-5)
        x = (x + F.gelu(h @ sd[p + "mlp.0.weight"].T + sd[p + "mlp.0.bias"]) @ sd[p + "mlp.2.weight"].T
             + sd[p + "mlp.2.bias"])
    return x


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    return torch.rand(1, 3, 40, 36, generator=torch.Generator().manual_seed(9)) * 2 - 1


@pytest.mark.parametrize("layout", ["wan", "hf"])
def test_image_encoder_layouts(tmp_path, image: torch.Tensor, layout: str) -> None:
    source = write_clip(tmp_path, layout, seed=3)
    loaded = ImageEncoder(ImageEncoderConfig.tiny(), path=tmp_path, dtype=torch.float32)
    assert loaded.layout == layout
    loaded.load()
    out = loaded.encode(image)
    assert out.shape == (1, 5, 16)  # 1 + (28 / 14)^2 tokens
    assert torch.equal(out, source.encode(image))


def test_image_encoder_matches_wan_formula(tmp_path, image: torch.Tensor) -> None:
    write_clip(tmp_path, "wan", seed=5)
    enc = ImageEncoder(ImageEncoderConfig.tiny(), path=tmp_path, dtype=torch.float32)
    enc.load()
    sd = torch.load(tmp_path / CLIP_FILE, weights_only=True)
    assert (enc.encode(image) - _clip_reference(sd, image, ImageEncoderConfig.tiny())).abs().max() < 1e-5


def test_image_encoder_errors(tmp_path) -> None:
    write_clip(tmp_path, "wan")
    path = tmp_path / CLIP_FILE
    state = torch.load(path, weights_only=True)
    state["visual.transformer.0.extra.weight"] = torch.zeros(1)
    torch.save(state, path)
    with pytest.raises(AvatarRenderError, match="unexpected tensor 'visual.transformer.0.extra.weight'"):
        ImageEncoder(ImageEncoderConfig.tiny(), path=tmp_path).load()
    state.pop("visual.transformer.0.extra.weight")
    state["visual.pos_embedding"] = torch.zeros(1, 10, 16)
    torch.save(state, path)
    with pytest.raises(AvatarRenderError, match=r"'visual.pos_embedding' of shape \(10, 16\) .* needs \(5, 16\)"):
        ImageEncoder(ImageEncoderConfig.tiny(), path=tmp_path).load()
    path.unlink()
    with pytest.raises(AvatarRenderError, match=f"{CLIP_FILE} is missing"):
        ImageEncoder(ImageEncoderConfig.tiny(), path=tmp_path).load()


def test_features_follow_the_video_frame_rate_given(audio_encoder: AudioEncoder, speech: np.ndarray) -> None:
    """At 30 fps a chunk's features sit at 30 per second (what an encoder made for 30 fps gives),
    not at the encoder's default 25."""
    from avatar_render.models.audio_encoder import AudioFeatureConfig

    at30 = AudioEncoder(config=TINY_WAV2VEC2, seed=1, features=AudioFeatureConfig(fps=30.0))
    at30.load()
    window = speech[: RATE * 3]
    got = audio_encoder.encode(window, num_frames=60, pad_s=0.5, fps=30.0)
    assert torch.equal(got, at30.encode(window, num_frames=60, pad_s=0.5))
    assert not torch.allclose(got, audio_encoder.encode(window, num_frames=60, pad_s=0.5), atol=1e-3)


def test_the_context_stage_asks_for_features_at_the_chunk_frame_rate() -> None:
    from fractions import Fraction

    from avatar_render.infinitetalk.stages import AudioContext
    from avatar_render.pipeline.schedule import iter_schedule
    from avatar_render.pipeline.types import ChunkInput

    class Recording:  # stands in for the encoder: only what the stage asks of it matters here
        def encode(self, window, **kw):
            self.kw = kw
            return torch.zeros(kw["num_frames"], 5, 2, 4)

    enc = Recording()
    stage = AudioContext(audio=enc, context_latents=2, latent_hw=(4, 4))
    plan = next(iter(iter_schedule(chunk_frames=16, transition_frames=0, context_frames=5, lead_frames=1,
                                   frames_upto=lambda n: n)))
    x = ChunkInput(plan=plan, fps=Fraction(30000, 1001), audio=np.zeros(16000 * 8, np.float32), audio_rate=16000,
                   audio_pad_s=3.0, anchors=(), seed=0)
    stage.run(x, static=None, carry=None)
    assert enc.kw["fps"] == 30000 / 1001
