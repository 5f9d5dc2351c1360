"""The CLIP ViT-H/14 image encoder of Wan I2V (transformers ``CLIPVisionModel``).

Wan's checkpoint holds the whole open-clip XLM-RoBERTa + ViT-H/14 model; only the visual tower is
used, and only up to its penultimate block: the features are that block's tokens, [B, 257, 1280]
(no final norm). The model is therefore built with one block fewer than the checkpoint holds, and
the last block, the projection head and the text tower are skipped when loading. Preprocessing as
Wan does it: bicubic resize of the [-1, 1] image to 224 x 224 (no aspect-ratio keeping), then the
CLIP mean/std.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import CLIPVisionConfig, CLIPVisionModel

from avatar_render.models.weights import Converted, TorchModule, load_checkpoint, read_json, safetensors_shards

NATIVE_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImageEncoderConfig:
    image_size: int = 224
    patch_size: int = 14
    hidden_size: int = 1280
    num_layers: int = 32  # blocks in the checkpoint; the features come out of block num_layers - 1
    num_heads: int = 16
    mlp_ratio: int = 4
    layer_norm_eps: float = 1e-5

    @classmethod
    def tiny(cls) -> ImageEncoderConfig:
        return cls(image_size=28, hidden_size=16, num_layers=3, num_heads=2)

    @classmethod
    def from_hf(cls, cfg: dict) -> ImageEncoderConfig:
        v = cfg.get("vision_config", cfg)  # a CLIPConfig nests it
        hidden = v.get("hidden_size", 768)
        return cls(
            image_size=v.get("image_size", 224),
            patch_size=v.get("patch_size", 32),
            hidden_size=hidden,
            num_layers=v.get("num_hidden_layers", 12),
            num_heads=v.get("num_attention_heads", 12),
            mlp_ratio=v.get("intermediate_size", 4 * hidden) // hidden,
            layer_norm_eps=v.get("layer_norm_eps", 1e-5),
        )

    @property
    def num_tokens(self) -> int:
        return (self.image_size // self.patch_size) ** 2 + 1

    def clip(self) -> CLIPVisionConfig:
        return CLIPVisionConfig(
            hidden_size=self.hidden_size,
            intermediate_size=self.hidden_size * self.mlp_ratio,
            num_hidden_layers=self.num_layers - 1,
            num_attention_heads=self.num_heads,
            image_size=self.image_size,
            patch_size=self.patch_size,
            hidden_act="gelu",
            layer_norm_eps=self.layer_norm_eps,
        )


def locate_image_encoder(path: Path) -> tuple[str, list[Path]]:
    """(layout, files) for the Wan .pth, a Wan model folder, a diffusers model folder (``image_encoder/``)
    or a Hugging Face CLIP vision folder."""
    path = Path(path)
    if path.suffix in (".pth", ".pt"):
        return "wan", [path]
    if (path / NATIVE_FILE).is_file():
        return "wan", [path / NATIVE_FILE]
    for folder in (path / "image_encoder", path):
        if ((folder / "config.json").is_file()
                and "clip" in str(read_json(folder / "config.json").get("model_type", ""))):
            return "hf", [folder / "config.json", *safetensors_shards(folder, "model.safetensors")]
    return "wan", [path / NATIVE_FILE]


_BLOCK = {"norm1": "layer_norm1", "norm2": "layer_norm2", "attn.proj": "self_attn.out_proj", "mlp.0": "mlp.fc1",
          "mlp.2": "mlp.fc2"}
_TOP = {
    "patch_embedding.weight": "embeddings.patch_embedding.weight",
    "pre_norm.weight": "pre_layrnorm.weight",
    "pre_norm.bias": "pre_layrnorm.bias",
    "post_norm.weight": "post_layernorm.weight",
    "post_norm.bias": "post_layernorm.bias",
}


def clip_from_native(key: str, t: torch.Tensor, num_layers: int) -> Converted:
    """A tensor of Wan's open-clip checkpoint in ``CLIPVisionModel`` naming ([] = unused, None = unknown)."""
    if key.startswith("textual.") or key in ("log_scale", "visual.head"):
        return []
    if not key.startswith("visual."):
        return None
    k = key.removeprefix("visual.")
    if k in _TOP:
        return [(_TOP[k], t)]
    if k == "cls_embedding":  # [1, 1, D] -> [D]
        return [("embeddings.class_embedding", t.reshape(-1))]
    if k == "pos_embedding":  # [1, N, D] -> [N, D]
        return [("embeddings.position_embedding.weight", t.reshape(-1, t.shape[-1]))]
    m = re.fullmatch(r"transformer\.(\d+)\.(.+)\.(weight|bias)", k)
    if m is None:
        return None
    block, part, leaf = int(m[1]), m[2], m[3]
    if block == num_layers - 1:
        return []
    prefix = f"encoder.layers.{block}."
    if part == "attn.to_qkv":  # fused [3D, ...] in q, k, v order
        q, k_, v = t.chunk(3, dim=0)
        return [(f"{prefix}self_attn.{n}_proj.{leaf}", x) for n, x in (("q", q), ("k", k_), ("v", v))]
    return [(f"{prefix}{_BLOCK[part]}.{leaf}", t)] if part in _BLOCK else None


def clip_from_hf(key: str, t: torch.Tensor, num_layers: int) -> Converted:
    """A tensor of a Hugging Face CLIP checkpoint in ``CLIPVisionModel`` naming ([] = unused, None = unknown)."""
    if key.startswith(("text_model.", "visual_projection.", "text_projection.")) or key == "logit_scale":
        return []
    k = key.removeprefix("vision_model.")
    if k.startswith(f"encoder.layers.{num_layers - 1}."):
        return []
    return [(k, t)]


class ImageEncoder(TorchModule):
    """CLIP vision tower. ``path``: see ``locate_image_encoder``; None = random weights."""

    name = "image_encoder"
    what = "CLIP image encoder"

    def __init__(
        self,
        config: ImageEncoderConfig = ImageEncoderConfig(),
        *,
        path: Path | str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float16,
        seed: int = 0,
    ) -> None:
        super().__init__(device=device, dtype=dtype, seed=seed)
        self.config = config
        self.path = Path(path) if path is not None else None
        self.layout, self._files = locate_image_encoder(self.path) if self.path is not None else (None, [])

    def weight_files(self) -> list[Path]:
        return list(self._files)

    def _load(self) -> None:
        if self.layout == "hf" and not self.missing_files():
            self.config = ImageEncoderConfig.from_hf(read_json(self._files[0]))
        super()._load()

    def build(self) -> nn.Module:
        cfg = self.config.clip()
        cfg._attn_implementation = "sdpa"
        return CLIPVisionModel(cfg)

    def read_weights(self, net: nn.Module) -> None:
        n = self.config.num_layers
        if self.layout == "hf":
            files, convert = self._files[1:], lambda k, t: clip_from_hf(k, t, n)
        else:
            files, convert = self._files, lambda k, t: clip_from_native(k, t, n)
        load_checkpoint(net, files, convert, what=self.what, dtype=self.dtype)
        emb = net.embeddings  # its position ids are a non-persistent buffer, still on the meta device
        emb.register_buffer("position_ids", torch.arange(emb.num_positions).expand((1, -1)), persistent=False)

    def preprocess(self, image: torch.Tensor) -> torch.Tensor:
        """image [B, 3, H, W] in [-1, 1] -> CLIP pixels [B, 3, S, S] float32."""
        size = (self.config.image_size,) * 2
        x = F.interpolate(image.float(), size=size, mode="bicubic", align_corners=False)
        x = x * 0.5 + 0.5
        mean = torch.tensor(CLIP_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    @torch.no_grad()
    def encode(self, image: torch.Tensor) -> torch.Tensor:
        """image [B, 3, H, W] in [-1, 1] -> penultimate-block tokens [B, 1 + (S/14)^2, hidden] float32
        ([B, 257, 1280])."""
        dev = self.compute_device
        pixels = self.preprocess(image.to(dev)).to(self.dtype)
        return self.net(pixel_values=pixels).last_hidden_state.float()
