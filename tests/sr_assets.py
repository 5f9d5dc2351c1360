"""Tiny SR model folders in the published layouts, written by the tests themselves (random weights)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from avatar_render.models.sr.swiftvr import (
    PROMPT_FILE,
    PROMPT_KEY,
    REAE_FILE,
    TRANSFORMER_DIR,
    ReaeModule,
    SwiftDiTModule,
    config_for,
)
from avatar_render.models.sr.vae2x import DIFFUSERS_DIR, NATIVE_FILE, Upscale2xVae, vae2x_config
from avatar_render.models.vae import native_vae_table


def _state(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}


def write_vae2x(root: Path, layout: str, *, seed: int = 4) -> Upscale2xVae:
    """layout "wan": root/Wan2.1_VAE_upscale2x_imageonly_real_v1.safetensors (Wan-native names);
    "diffusers": root/diffusers/Wan2.1_VAE_upscale2x_imageonly_real_v1/ (config.json + safetensors)."""
    vae = Upscale2xVae(vae2x_config("tiny"), seed=seed)
    vae.load()
    root.mkdir(parents=True, exist_ok=True)
    if layout == "wan":
        state = _state(vae.net)
        save_file({native: state[name] for native, name in native_vae_table(vae.net, vae.config).items()}, str(root / NATIVE_FILE))
    else:
        vae.model.save_pretrained(root / DIFFUSERS_DIR)
    return vae


def write_swiftvr(root: Path, *, seed: int = 5) -> tuple[ReaeModule, SwiftDiTModule]:
    """The SwiftVR download layout at the tiny size: reae.safetensors, prompt_embedding.safetensors,
    transformer/{config.json, diffusion_pytorch_model.safetensors}."""
    reae_cfg, dit_cfg = config_for("tiny")
    reae = ReaeModule(reae_cfg, dtype=torch.float32, seed=seed)
    dit = SwiftDiTModule(dit_cfg, dtype=torch.float32, seed=seed + 1)
    reae.load()
    dit.load()
    root.mkdir(parents=True, exist_ok=True)
    save_file(_state(reae.net), str(root / REAE_FILE))
    save_file({PROMPT_KEY: dit.prompt[None].contiguous()}, str(root / PROMPT_FILE))
    (root / TRANSFORMER_DIR).mkdir(exist_ok=True)
    state = {k.removeprefix("transformer."): v for k, v in _state(dit.net).items()}
    save_file(state, str(root / TRANSFORMER_DIR / "diffusion_pytorch_model.safetensors"))
    config = {"_class_name": "WanTransformer3DModel", **{k: list(v) if isinstance(v, tuple) else v for k, v in dit_cfg.model.items()},
              "enable_swa": True, "self_attn_window_hw": list(dit_cfg.window)}
    (root / TRANSFORMER_DIR / "config.json").write_text(json.dumps(config))
    return reae, dit
