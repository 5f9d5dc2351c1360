"""Tiny random model folders in the published layouts, written by the tests themselves.

Each ``write_*`` builds a tiny module with random weights, saves it in the requested layout under
``root`` and returns the module it saved, so a test can compare what it loads against the source.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from avatar_render.models.audio_encoder import TINY_WAV2VEC2, AudioEncoder
from avatar_render.models.image_encoder import NATIVE_FILE as CLIP_FILE
from avatar_render.models.image_encoder import ImageEncoder, ImageEncoderConfig
from avatar_render.models.text_encoder import NATIVE_FILE as T5_FILE
from avatar_render.models.text_encoder import NATIVE_TOKENIZER, TextEncoder, TextEncoderConfig, native_t5_table
from avatar_render.models.vae import NATIVE_FILE as VAE_FILE
from avatar_render.models.vae import VaeConfig, WanVae, native_vae_table

WORDS = "a person is talking naturally with clear lip movements the woman man smiles speaks".split()


def _state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}


def write_vae(root: Path, layout: str, *, seed: int = 0) -> WanVae:
    """layout "wan": root/Wan2.1_VAE.pth; "diffusers": root/vae/{config.json, diffusion_pytorch_model.safetensors}."""
    vae = WanVae(VaeConfig.tiny(), seed=seed)
    vae.load()
    root.mkdir(parents=True, exist_ok=True)
    if layout == "wan":
        state = _state(vae.net)
        torch.save({native: state[name] for native, name in native_vae_table(vae.net, vae.config).items()},
                   root / VAE_FILE)
    else:
        vae.model.save_pretrained(root / "vae")
    return vae


def write_wav2vec2(folder: Path, layout: str = "safetensors", *, seed: int = 0) -> AudioEncoder:
    """layout "safetensors": config.json + model.safetensors as saved today; "pretraining": an older
    pytorch_model.bin of a pre-training model (``wav2vec2.`` prefix, weight_g/weight_v, quantizer head)."""
    enc = AudioEncoder(config=TINY_WAV2VEC2, seed=seed)
    enc.load()
    folder.mkdir(parents=True, exist_ok=True)
    enc.net.config.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({"do_normalize": True, "sampling_rate": 16000,
                                                                 "feature_size": 1}))
    state = _state(enc.net)
    if layout == "safetensors":
        save_file(state, str(folder / "model.safetensors"))
        return enc
    old = {}
    for k, v in state.items():
        k = (k.replace("parametrizations.weight.original0", "weight_g")
             .replace("parametrizations.weight.original1", "weight_v"))
        old[f"wav2vec2.{k}"] = v
    h = enc.net.config.hidden_size
    old.update({"quantizer.codevectors": torch.randn(1, 8, 4), "project_q.weight": torch.randn(4, 4),
                "project_hid.weight": torch.randn(4, h)})
    torch.save(old, folder / "pytorch_model.bin")
    return enc


def write_tokenizer(folder: Path) -> Path:
    """A small Unigram (sentencepiece-style) tokenizer saved as tokenizer.json, as umT5's is."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(f"▁{w}", -1.0 - 0.1 * i) for i, w in enumerate(WORDS)]
    pieces += [(c, -5.0) for c in "abcdefghijklmnopqrstuvwxyz"]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "T5Tokenizer", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
              "extra_ids": 0}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def write_umt5(root: Path, layout: str, *, seed: int = 0) -> TextEncoder:
    """layout "wan": root/models_t5_umt5-xxl-enc-bf16.pth + root/google/umt5-xxl/;
    "hf" (diffusers): root/text_encoder/{config.json, model.safetensors} + root/tokenizer/."""
    enc = TextEncoder(TextEncoderConfig.tiny(), dtype=torch.float32, seed=seed)
    enc.load()
    root.mkdir(parents=True, exist_ok=True)
    state = _state(enc.net)
    if layout == "wan":
        torch.save({native: state[name] for native, name in native_t5_table(enc.net).items()}, root / T5_FILE)
        write_tokenizer(root / NATIVE_TOKENIZER)
    else:
        (root / "text_encoder").mkdir()
        enc.net.config.save_pretrained(root / "text_encoder")
        state.pop("encoder.embed_tokens.weight")  # tied to shared.weight; saved once, as transformers does
        save_file(state, str(root / "text_encoder" / "model.safetensors"))
        write_tokenizer(root / "tokenizer")
    return enc


def _native_clip_name(name: str) -> str:
    table = {
        "embeddings.patch_embedding.weight": "visual.patch_embedding.weight",
        "pre_layrnorm.weight": "visual.pre_norm.weight",
        "pre_layrnorm.bias": "visual.pre_norm.bias",
        "post_layernorm.weight": "visual.post_norm.weight",
        "post_layernorm.bias": "visual.post_norm.bias",
    }
    if name in table:
        return table[name]
    layer, part = name.removeprefix("encoder.layers.").split(".", 1)
    parts = {"layer_norm1": "norm1", "layer_norm2": "norm2", "self_attn.out_proj": "attn.proj", "mlp.fc1": "mlp.0",
             "mlp.fc2": "mlp.2"}
    module, leaf = part.rsplit(".", 1)
    return f"visual.transformer.{layer}.{parts[module]}.{leaf}"


def write_clip(root: Path, layout: str, *, seed: int = 0) -> ImageEncoder:
    """layout "wan": root/models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (visual + text towers);
    "hf" (diffusers): root/image_encoder/{config.json, model.safetensors} (CLIPVisionModelWithProjection)."""
    cfg = ImageEncoderConfig.tiny()
    enc = ImageEncoder(cfg, dtype=torch.float32, seed=seed)
    enc.load()
    root.mkdir(parents=True, exist_ok=True)
    state = _state(enc.net)
    d = cfg.hidden_size
    g = torch.Generator().manual_seed(seed + 1)
    last = {f"encoder.layers.{cfg.num_layers - 1}.{k.split('.', 3)[3]}": torch.randn(v.shape, generator=g)
            for k, v in state.items() if k.startswith("encoder.layers.0.")}  # fmt: skip
    if layout == "wan":
        out = {
            "visual.cls_embedding": state.pop("embeddings.class_embedding").reshape(1, 1, d),
            "visual.pos_embedding": state.pop("embeddings.position_embedding.weight")[None],
            "visual.head": torch.randn(d, 8, generator=g),
            "textual.token_embedding.weight": torch.randn(10, 8, generator=g),
            "log_scale": torch.tensor(2.0),
        }
        for i in range(cfg.num_layers):
            src = state if i < cfg.num_layers - 1 else last
            p = f"encoder.layers.{i}.self_attn."
            for leaf in ("weight", "bias"):
                out[f"visual.transformer.{i}.attn.to_qkv.{leaf}"] = torch.cat([src.pop(f"{p}{n}_proj.{leaf}")
                                                                               for n in "qkv"])
        for k, v in [*state.items(), *last.items()]:
            out[_native_clip_name(k)] = v
        torch.save(out, root / CLIP_FILE)
    else:
        folder = root / "image_encoder"
        folder.mkdir()
        hf_cfg = cfg.clip().to_dict() | {"num_hidden_layers": cfg.num_layers, "projection_dim": 8,
                                         "model_type": "clip_vision_model"}
        (folder / "config.json").write_text(json.dumps(hf_cfg))
        out = {f"vision_model.{k}": v for k, v in [*state.items(), *last.items()]}
        out["visual_projection.weight"] = torch.randn(8, d, generator=g)
        save_file(out, str(folder / "model.safetensors"))
    return enc
