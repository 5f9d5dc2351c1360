"""umT5-XXL encoder (transformers ``UMT5EncoderModel``): the Wan family's prompt embeddings.

Wan tokenizes to at most 512 tokens (with the closing ``</s>``), runs the encoder with padding
masked, and keeps the real tokens only: ``[1, L, 4096]``; the DiT pads to 512 with zeros itself.
Padding is masked and positions are relative, so encoding the L real tokens alone gives the same
values. Computed once per request; ``offload()`` afterwards frees the device.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

from avatar_render.errors import AvatarRenderError
from avatar_render.models.weights import TorchModule, by_table, load_checkpoint, read_json, safetensors_shards

NATIVE_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
NATIVE_TOKENIZER = Path("google") / "umt5-xxl"
TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class TextEncoderConfig:
    vocab_size: int = 256384
    d_model: int = 4096
    d_kv: int = 64
    d_ff: int = 10240
    num_layers: int = 24
    num_heads: int = 64
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    text_len: int = 512  # longest prompt in tokens

    @classmethod
    def tiny(cls) -> TextEncoderConfig:
        return cls(vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=2, num_heads=4)

    def umt5(self) -> UMT5Config:
        fields = {k: v for k, v in self.__dict__.items() if k != "text_len"}
        return UMT5Config(
            **fields, feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, dropout_rate=0.0, use_cache=False
        )


def locate_text_encoder(path: Path) -> tuple[str, list[Path], Path]:
    """(layout, weight files, tokenizer folder) for a Wan model folder, a diffusers model folder,
    a Hugging Face umT5 folder, or the Wan .pth itself (its tokenizer in ``google/umt5-xxl`` beside it)."""
    path = Path(path)
    if path.suffix in (".pth", ".pt"):
        return "wan", [path], path.parent / NATIVE_TOKENIZER
    if (path / NATIVE_FILE).is_file():
        return "wan", [path / NATIVE_FILE], path / NATIVE_TOKENIZER
    if (path / "text_encoder" / "config.json").is_file():
        folder = path / "text_encoder"
        return "hf", [folder / "config.json", *safetensors_shards(folder, "model.safetensors")], path / "tokenizer"
    if (path / "config.json").is_file() and read_json(path / "config.json").get("model_type") in ("umt5", "t5"):
        return "hf", [path / "config.json", *safetensors_shards(path, "model.safetensors")], path
    return "wan", [path / NATIVE_FILE], path / NATIVE_TOKENIZER


_NATIVE_RULES = [
    (r"(shared|encoder\.embed_tokens)\.weight", lambda m: "token_embedding.weight"),
    (r"encoder\.final_layer_norm\.weight", lambda m: "norm.weight"),
    (r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.([qkvo])\.weight",
     lambda m: f"blocks.{m[1]}.attn.{m[2]}.weight"),
    (
        r"encoder\.block\.(\d+)\.layer\.0\.SelfAttention\.relative_attention_bias\.weight",
        lambda m: f"blocks.{m[1]}.pos_embedding.embedding.weight",
    ),
    (r"encoder\.block\.(\d+)\.layer\.0\.layer_norm\.weight", lambda m: f"blocks.{m[1]}.norm1.weight"),
    (r"encoder\.block\.(\d+)\.layer\.1\.layer_norm\.weight", lambda m: f"blocks.{m[1]}.norm2.weight"),
    (r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_0\.weight", lambda m: f"blocks.{m[1]}.ffn.gate.0.weight"),
    (r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wi_1\.weight", lambda m: f"blocks.{m[1]}.ffn.fc1.weight"),
    (r"encoder\.block\.(\d+)\.layer\.1\.DenseReluDense\.wo\.weight", lambda m: f"blocks.{m[1]}.ffn.fc2.weight"),
]


def native_t5_key(key: str) -> str:
    """The Wan-native name of a ``UMT5EncoderModel`` tensor name."""
    for pattern, fn in _NATIVE_RULES:
        m = re.fullmatch(pattern, key)
        if m:
            return fn(m)
    raise KeyError(key)


def native_t5_table(net: nn.Module) -> dict[str, str]:
    """Wan-native name -> transformers name (the tied input embedding under its first name)."""
    table: dict[str, str] = {}
    for k in net.state_dict():
        table.setdefault(native_t5_key(k), k)
    return table


def clean_prompt(text: str) -> str:
    """Wan's 'whitespace' cleaning: unescape HTML twice, collapse whitespace (plus ftfy when installed)."""
    try:
        import ftfy

        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


class TextEncoder(TorchModule):
    """The umT5 encoder and its tokenizer. ``path``: see ``locate_text_encoder``; None = random weights
    (then ``tokenizer_path`` is needed to encode text)."""

    name = "text_encoder"
    what = "umT5 text encoder"

    def __init__(
        self,
        config: TextEncoderConfig = TextEncoderConfig(),
        *,
        path: Path | str | None = None,
        tokenizer_path: Path | str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        seed: int = 0,
        shard: Callable[[nn.Module], None] | None = None,
    ) -> None:
        super().__init__(device=device, dtype=dtype, seed=seed, shard=shard)
        self.config = config
        self._umt5 = config.umt5()
        self.path = Path(path) if path is not None else None
        self.layout, self._files, tok = locate_text_encoder(self.path) if self.path is not None else (None, [], None)
        self.tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else tok
        self.tokenizer = None

    def weight_files(self) -> list[Path]:
        tok = [self.tokenizer_path / TOKENIZER_FILE] if self.tokenizer_path is not None else []
        return [*self._files, *tok]

    def _load(self) -> None:
        if self.layout == "hf" and not self.missing_files():
            self._umt5 = UMT5Config.from_dict(read_json(self._files[0]))
        super()._load()
        if self.tokenizer_path is not None:
            try:
                self.tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer_path), local_files_only=True)
            except Exception as e:  # noqa: BLE001 - any failure means an unusable tokenizer folder
                why = f"{type(e).__name__}: {e}"
                raise AvatarRenderError(f"The tokenizer in {self.tokenizer_path} cannot be loaded ({why}).") from None

    def _load_files(self) -> list[Path]:
        return [p for p in self._files if p.suffix != ".json"]

    def build(self) -> nn.Module:
        cfg = self._umt5
        cfg._attn_implementation = "eager"  # T5's relative position bias
        return UMT5EncoderModel(cfg)

    def read_weights(self, net: nn.Module) -> None:
        table = {name: name for name in net.state_dict()} if self.layout == "hf" else native_t5_table(net)
        load_checkpoint(net, self._load_files(), by_table(table), what=self.what, dtype=self.dtype)

    def tokenize(self, text: str) -> torch.Tensor:
        """ids [1, L] (with the closing </s>, at most text_len).

        Random weights without a tokenizer folder (tiny tests) get the UTF-8 bytes folded into the
        vocabulary instead: deterministic, and meaningless, as the weights are.
        """
        if self.tokenizer is None and self.path is None:
            raw = [3 + b % (self.config.vocab_size - 3) for b in clean_prompt(text).encode()]
            return torch.tensor([raw[: self.config.text_len - 1] + [1]])
        if self.tokenizer is None:
            raise AvatarRenderError("The text encoder has no tokenizer: give the folder that holds tokenizer.json.")
        out = self.tokenizer([clean_prompt(text)], truncation=True, max_length=self.config.text_len,
                             return_tensors="pt")
        return out["input_ids"]

    @torch.no_grad()
    def encode_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [1, L] -> embeddings [1, L, d_model] float32."""
        out = self.net(input_ids=ids.to(self.compute_device))
        return out.last_hidden_state.float()

    def encode(self, text: str) -> torch.Tensor:
        """One prompt -> [1, L, d_model] float32, L = its real token count."""
        return self.encode_ids(self.tokenize(text))
