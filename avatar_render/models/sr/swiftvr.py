"""SwiftVR's two weight-bearing modules, read from a local folder in the published layout:

    SwiftVR/
      reae.safetensors                  the autoencoder (``encoder.N.*``, ``decoder.N.*``)
      prompt_embedding.safetensors      ``prompt_emb``: the empty prompt's umT5 embedding [1, 512, 4096]
      transformer/config.json           diffusers ``WanTransformer3DModel`` (+ ``self_attn_window_hw``)
      transformer/diffusion_pytorch_model.safetensors   (or shards + .index.json)

Without a folder both get random weights (the tiny test backend, full-size speed checks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from avatar_render.errors import AvatarRenderError
from avatar_render.models.sr.reae import Reae, ReaeConfig
from avatar_render.models.sr.swiftvr_dit import SwiftDiTConfig, SwiftVRDiT, fp32_island
from avatar_render.models.weights import (
    StreamedBlocksModule,
    StreamPlan,
    TorchModule,
    by_table,
    load_checkpoint,
    read_json,
    read_tensors,
    safetensors_shards,
)

REAE_FILE = "reae.safetensors"
PROMPT_FILE = "prompt_embedding.safetensors"
PROMPT_KEY = "prompt_emb"
TRANSFORMER_DIR = "transformer"
TRANSFORMER_FILE = "diffusion_pytorch_model.safetensors"
_IGNORED = ("norm_added_q",)  # names diffusers' own loader ignores in Wan checkpoints


class ReaeModule(TorchModule):
    name = "sr_reae"
    what = "SwiftVR autoencoder (ReAE)"

    def __init__(self, config: ReaeConfig = ReaeConfig(), *, root: Optional[Path] = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> None:
        super().__init__(device=device, dtype=dtype, seed=seed)
        self.config, self.root = config, root

    def weight_files(self) -> list[Path]:
        return [] if self.root is None else [self.root / REAE_FILE]

    def build(self) -> nn.Module:
        return Reae(self.config)

    def read_weights(self, net: nn.Module) -> None:
        table = {k: k for k in net.state_dict()}
        load_checkpoint(net, self.weight_files(), by_table(table), what=self.what, dtype=self.dtype)

    @property
    def model(self) -> Reae:
        assert self.net is not None, "load the ReAE first"
        return self.net  # type: ignore[return-value]


class SwiftDiTModule(StreamedBlocksModule):
    """The one-step DiT and the prompt embedding it is conditioned on. ``stream`` keeps its blocks off
    the device, each brought there ahead of its forward (as the A2V DiT's ``dist.offload.dit=offloaded``);
    ``shard`` splits it across the processes of a launch (FSDP2). Both are applied from outside."""

    name = "sr_dit"
    what = "SwiftVR DiT"

    def __init__(self, config: SwiftDiTConfig = SwiftDiTConfig(), *, root: Optional[Path] = None,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 shard: Optional[Callable[[nn.Module], None]] = None, stream: Optional[StreamPlan] = None) -> None:
        super().__init__(device=device, dtype=dtype, seed=seed, shard=shard)
        self.config, self.root = config, root
        self.stream_plan = None if shard is not None else stream
        self.prompt: Optional[torch.Tensor] = None  # [L, text_dim]

    def transformer_files(self) -> list[Path]:
        assert self.root is not None
        folder = self.root / TRANSFORMER_DIR
        return [folder / "config.json", *safetensors_shards(folder, TRANSFORMER_FILE)]

    def weight_files(self) -> list[Path]:
        return [] if self.root is None else [*self.transformer_files(), self.root / PROMPT_FILE]

    def build(self) -> nn.Module:
        return SwiftVRDiT(self.config)

    def _load(self) -> None:
        if self.root is not None and not self.missing_files():
            self.config = SwiftDiTConfig.from_json(read_json(self.transformer_files()[0]))
        super()._load()
        if self.root is None:  # random weights: the float32 islands as a loaded model has them
            for name, p in self.net.named_parameters():
                if fp32_island(name):
                    p.data = p.data.float()
            g = torch.Generator().manual_seed(self.seed + 1)
            self.prompt = torch.randn(self.config.prompt_tokens, self.config.text_dim, generator=g).to(
                self.device, self.dtype)
        if self.stream_plan is not None:
            self.stream(self.net.blocks, self.net.transformer)

    def read_weights(self, net: nn.Module) -> None:
        names = set(net.state_dict())

        def convert(key: str, t: torch.Tensor):
            if any(part in key for part in _IGNORED):
                return []
            return [(f"transformer.{key}", t)] if f"transformer.{key}" in names else None

        load_checkpoint(net, self.transformer_files()[1:], convert, what=self.what,
                        dtype=lambda name: torch.float32 if fp32_island(name) else self.dtype)
        rope = net.transformer.rope  # its tables are no checkpoint tensors: made again off the meta device
        net.transformer.rope = type(rope)(rope.attention_head_dim, rope.patch_size, rope.max_seq_len)
        self.prompt = self._read_prompt(self.root / PROMPT_FILE)

    def _read_prompt(self, path: Path) -> torch.Tensor:
        tensors = dict(read_tensors(path))
        if PROMPT_KEY not in tensors:
            raise AvatarRenderError(
                f"{path.name} holds no '{PROMPT_KEY}' tensor, so it is not SwiftVR's prompt embedding.")
        emb = tensors[PROMPT_KEY]
        emb = emb[0] if emb.ndim == 3 and emb.shape[0] == 1 else emb
        if emb.ndim != 2 or emb.shape[1] != self.config.text_dim:
            raise AvatarRenderError(f"{path.name} has '{PROMPT_KEY}' of shape {tuple(tensors[PROMPT_KEY].shape)} where "
                                    f"the {self.what} needs (1, L, {self.config.text_dim}).")
        return emb.to(self.device, self.dtype)

    def prefetch(self) -> None:
        super().prefetch()
        if self.prompt is not None:
            self.prompt = self.prompt.to(self.compute_device)

    @property
    def compute_device(self) -> torch.device:
        return self.device if self.streamer is not None else super().compute_device

    @property
    def model(self) -> SwiftVRDiT:
        assert self.net is not None, "load the SwiftVR DiT first"
        return self.net  # type: ignore[return-value]


def config_for(size: str) -> tuple[ReaeConfig, SwiftDiTConfig]:
    """The architectures: the published ones, or tiny ones with the same structure."""
    if size == "tiny":
        return ReaeConfig.tiny(), SwiftDiTConfig.tiny()
    return ReaeConfig(), SwiftDiTConfig()
