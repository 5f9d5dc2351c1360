"""The DiT's tensor names: Wan-native <-> diffusers ``WanTransformer3DModel``, and which names belong to
the audio module. Used by the checkpoint reader and by the LoRA merge."""

from __future__ import annotations

import re

# Wan-native -> diffusers WanTransformer3DModel names (prefixes of tensor names). Native norm3 (the
# affine pre-cross-attention norm) is diffusers' norm2; the weightless norms have no tensors.
_TOP_NAMES = {
    "patch_embedding": "patch_embedding",
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "img_emb.proj.0": "condition_embedder.image_embedder.norm1",
    "img_emb.proj.1": "condition_embedder.image_embedder.ff.net.0.proj",
    "img_emb.proj.3": "condition_embedder.image_embedder.ff.net.2",
    "img_emb.proj.4": "condition_embedder.image_embedder.norm2",
    "head.head": "proj_out",
    "head.modulation": "scale_shift_table",
}
_BLOCK_NAMES = {
    **{f"self_attn.{a}": f"attn1.{b}"
       for a, b in [("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"), ("norm_q", "norm_q"),
                    ("norm_k", "norm_k")]},
    **{f"cross_attn.{a}": f"attn2.{b}"
       for a, b in [("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"), ("norm_q", "norm_q"),
                    ("norm_k", "norm_k"), ("k_img", "add_k_proj"), ("v_img", "add_v_proj"),
                    ("norm_k_img", "norm_added_k")]},
    "norm3": "norm2",
    "ffn.0": "ffn.net.0.proj",
    "ffn.2": "ffn.net.2",
    "modulation": "scale_shift_table",
}
DIFFUSERS_NAMES = {**_TOP_NAMES, **{f"blocks.*.{k}": f"blocks.*.{v}" for k, v in _BLOCK_NAMES.items()}}
DIFFUSERS_SKIPPED = re.compile(r"\.norm_added_q\.")
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


def _rename(key: str, table: dict[str, str]) -> str | None:
    for src, dst in table.items():
        if key == src or key.startswith(src + "."):
            return dst + key[len(src):]
    return None


def _convert(key: str, top: dict[str, str], block: dict[str, str]) -> str | None:
    m = _BLOCK.match(key)
    if m:
        inner = _rename(m.group(2), block)
        return None if inner is None else f"blocks.{m.group(1)}.{inner}"
    return _rename(key, top)


def native_to_diffusers(key: str) -> str | None:
    """Wan-native tensor name -> diffusers name; None for the audio tensors (no diffusers equivalent)."""
    return _convert(key, _TOP_NAMES, _BLOCK_NAMES)


def diffusers_to_native(key: str) -> str | None:
    """diffusers WanTransformer3DModel tensor name -> Wan-native name; None if it has none."""
    return _convert(key, {v: k for k, v in _TOP_NAMES.items()}, {v: k for k, v in _BLOCK_NAMES.items()})


def is_diffusers_name(key: str) -> bool:
    return (key.startswith(("condition_embedder.", "proj_out.")) or key == "scale_shift_table"
            or ".attn1." in key or ".attn2." in key)


def is_audio_name(key: str) -> bool:
    return key.startswith("audio_proj.") or ".audio_cross_attn." in key or ".norm_x." in key
