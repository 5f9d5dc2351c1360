"""Merge a LoRA safetensors file into the loaded DiT weights (e.g. a few-step distillation LoRA).

Key formats understood (``<m>`` is a module name; prefixes ``diffusion_model.``,
``model.diffusion_model.``, ``transformer.``, ``base_model.model.`` and ``lora_unet_`` are stripped):

* ``<m>.lora_down.weight`` + ``<m>.lora_up.weight`` [+ ``<m>.alpha``]  (Wan-native / kohya style)
* ``<m>.lora_A[.default].weight`` + ``<m>.lora_B[.default].weight`` [+ ``<m>.alpha``]  (PEFT / diffusers)
* ``<m>.diff`` (full weight delta) and ``<m>.diff_b`` (bias delta)

``<m>`` may be a Wan-native name (``blocks.0.self_attn.q``), a diffusers name
(``blocks.0.attn1.to_q``), or either with dots written as underscores (kohya).
Merge: ``W += scale * (alpha / rank) * up @ down`` (alpha defaults to rank), computed in float32.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from avatar_render.errors import AvatarRenderError
from avatar_render.models.dit_names import native_to_diffusers
from avatar_render.models.weights import is_sharded, local_piece

_PREFIX = re.compile(r"^(model\.diffusion_model\.|diffusion_model\.|transformer\.|base_model\.model\.|lora_unet_)")
_KEY = re.compile(
    r"^(?P<m>.+?)\.(?P<kind>lora_down\.weight|lora_up\.weight|lora_[AB](\.default)?\.weight|alpha|diff|diff_b)$")
_KIND = {"lora_down.weight": "down", "lora_A.weight": "down", "lora_A.default.weight": "down",
         "lora_up.weight": "up", "lora_B.weight": "up", "lora_B.default.weight": "up",
         "alpha": "alpha", "diff": "diff", "diff_b": "diff_b"}


def _module_lookup(model: nn.Module) -> dict[str, str]:
    """Any accepted spelling of a weight-bearing module -> its native name."""
    lookup: dict[str, str] = {}
    for name, _ in model.named_parameters():
        mod, _, leaf = name.rpartition(".")
        if leaf != "weight":
            continue
        spellings = [mod]
        diff_name = native_to_diffusers(name)
        if diff_name is not None:
            spellings.append(diff_name.rpartition(".")[0])
        for s in spellings:
            lookup[s] = mod
            lookup[s.replace(".", "_")] = mod
    return lookup


def _group_keys(path: Path, keys: list[str], lookup: dict[str, str]) -> dict[str, dict[str, str]]:
    groups: dict[str, dict[str, str]] = {}
    bad_format, unknown = [], []
    for key in keys:
        m = _KEY.match(_PREFIX.sub("", key))
        if m is None:
            bad_format.append(key)
            continue
        target = lookup.get(m.group("m"))
        if target is None:
            unknown.append(key)
            continue
        groups.setdefault(target, {})[_KIND[m.group("kind")]] = key
    if bad_format:
        raise AvatarRenderError(f"The LoRA file {path} has {len(bad_format)} tensor(s) in no known LoRA format: "
                                f"{', '.join(bad_format[:3])}.")
    if unknown:
        raise AvatarRenderError(
            f"The LoRA file {path} targets {len(unknown)} tensor(s) the model does not have: {', '.join(unknown[:3])}.")
    for target, g in groups.items():
        if ("down" in g) != ("up" in g):
            raise AvatarRenderError(
                f"The LoRA file {path} has only half of the pair for {target} (needs both down/A and up/B).")
    return groups


def _add(param: nn.Parameter, delta: torch.Tensor) -> None:
    if is_sharded(param):  # split across processes: add this process's piece of the update
        if (pair := local_piece(param, delta)) is not None:
            local, piece = pair
            local.copy_((local.float() + piece.to(local.device, torch.float32)).to(local.dtype))
        return
    param.copy_((param.float() + delta.to(param.device, torch.float32)).to(param.dtype))


@torch.no_grad()
def merge_lora(model: nn.Module, path: Path, *, scale: float = 1.0) -> int:
    """Add the LoRA at ``path`` into the (materialised) ``model`` in place; returns tensors changed."""
    path = Path(path)
    if not path.is_file():
        raise AvatarRenderError(f"The LoRA file {path} does not exist.")
    params = dict(model.named_parameters())
    try:
        f = safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        raise AvatarRenderError(
            f"Cannot read the LoRA file {path}: it is not a valid safetensors file ({e}).") from None
    with f:
        groups = _group_keys(path, list(f.keys()), _module_lookup(model))
        changed = 0
        for target, g in groups.items():
            weight = params[f"{target}.weight"]
            if "down" in g:
                down = f.get_tensor(g["down"]).float().flatten(1)
                up = f.get_tensor(g["up"]).float().flatten(1)
                rank = down.shape[0]
                if up.shape != (weight.shape[0], rank) or down.shape[1] != math.prod(weight.shape[1:]):
                    raise AvatarRenderError(
                        f"The LoRA file {path} does not fit {target}: up {list(up.shape)} @ down {list(down.shape)} "
                        f"cannot update a weight of shape {list(weight.shape)}."
                    )
                alpha = f.get_tensor(g["alpha"]).item() if "alpha" in g else rank
                _add(weight, (up.to(weight.device) @ down.to(weight.device)).view(weight.shape) *
                     (scale * alpha / rank))
                changed += 1
            for kind, leaf in (("diff", "weight"), ("diff_b", "bias")):
                if kind not in g:
                    continue
                p = params.get(f"{target}.{leaf}")
                delta = f.get_tensor(g[kind])
                if p is None or delta.shape != p.shape:
                    raise AvatarRenderError(f"The LoRA file {path} has {g[kind]} of shape {list(delta.shape)}, which "
                                            f"does not fit {target}.{leaf}.")
                _add(p, delta.float() * scale)
                changed += 1
    return changed
