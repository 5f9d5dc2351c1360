"""The SR modules, configured from ``cfg.model`` and located in local folders in their published
layouts (or given random weights when no model folder is set at all)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from avatar_render.backends import sr_mode
from avatar_render.config import ModelConfig
from avatar_render.errors import AvatarRenderError
from avatar_render.infinitetalk.parallel import block_stream
from avatar_render.models.sr.swiftvr import ReaeModule, SwiftDiTModule, config_for
from avatar_render.models.sr.vae2x import Upscale2xVae, vae2x_config


@dataclass(frozen=True)
class SRComponents:
    vae2x: Optional[Upscale2xVae]  # sr=vae2x, or the fidelity path of sr=swiftvr with sr_fidelity=vae2x
    reae: Optional[ReaeModule]  # sr=swiftvr
    dit: Optional[SwiftDiTModule]  # sr=swiftvr


def needs_vae2x(m: ModelConfig) -> bool:
    """The 2x VAE decoder: the upscaler itself, or the one-step SR's fidelity path (sr_fidelity=vae2x)."""
    mode = sr_mode(m.sr)
    return mode.upscales and (not mode.one_step or m.sr_fidelity == "vae2x")


def _path(value: Optional[str], key: str, what: str, *, random: bool) -> Optional[Path]:
    if value is None:
        if random:
            return None
        raise AvatarRenderError(f"The {what} is read from a local folder: set {key} (model.root is set, so "
                                "random SR weights would only hide a missing download).")
    path = Path(value).expanduser()
    if not path.exists():
        raise AvatarRenderError(f"{key} '{path}' does not exist; point it at the downloaded {what}.")
    return path


def make_sr_components(m: ModelConfig, *, seed: int, device: torch.device,
                       shard_dit: Optional[Callable[[nn.Module], None]] = None, stream_dit: int = 0) -> SRComponents:
    """``shard_dit``: splits the SR DiT across the processes of a launch; ``stream_dit`` > 0: its blocks
    in pinned host memory, each copied to the device that many blocks ahead (dist.offload.sr=offloaded)."""
    random = m.root is None
    vae2x = None
    if needs_vae2x(m):
        path = _path(m.vae2x, "model.vae2x", "Wan2.1 VAE 2x decoder (Wan2.1-VAE-upscale2x)", random=random)
        vae2x = Upscale2xVae(vae2x_config(m.size), path=path, device=device, dtype=getattr(torch, m.vae_dtype),
                             seed=seed + 11)
    reae = dit = None
    if sr_mode(m.sr).one_step:
        root = _path(m.sr_root, "model.sr_root", "SwiftVR model folder", random=random)
        if root is not None and not root.is_dir():
            raise AvatarRenderError(
                f"model.sr_root '{root}' is not a folder; point it at the downloaded SwiftVR folder.")
        reae_cfg, dit_cfg = config_for(m.size)
        dtype = getattr(torch, m.dtype)
        reae = ReaeModule(reae_cfg, root=root, device=device, dtype=dtype, seed=seed + 12)
        dit = SwiftDiTModule(dit_cfg, root=root, device=device, dtype=dtype, seed=seed + 13, shard=shard_dit,
                             stream=block_stream(stream_dit))
    return SRComponents(vae2x=vae2x, reae=reae, dit=dit)


def sr_modules(c: SRComponents) -> tuple:
    return tuple(x for x in (c.vae2x, c.reae, c.dit) if x is not None)
