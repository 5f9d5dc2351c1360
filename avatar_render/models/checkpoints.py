"""Load the A2V DiT from local safetensors: Wan-native or diffusers layout + the audio-module file.

Supported files (``base`` is a folder or a single file):

* Wan-native sharded: ``diffusion_pytorch_model.safetensors.index.json`` +
  ``diffusion_pytorch_model-0000N-of-0000M.safetensors`` (Wan2.1-I2V-14B-480P/-720P: 7 shards), or
  one ``diffusion_pytorch_model.safetensors``, or any single ``.safetensors`` file with native
  names (an optional ``model.diffusion_model.`` / ``diffusion_model.`` prefix is stripped).
* diffusers: the same file names with ``WanTransformer3DModel`` tensor names, in ``base`` or in
  ``base/transformer`` (a diffusers pipeline folder); renamed to native names (``dit_names``).
  ``attn2.norm_added_q`` (written by old diffusers versions, unused by the model) is skipped.
* the audio module, merged on top (its tensors replace same-named base tensors):
  ``infinitetalk.safetensors`` (InfiniteTalk ``single/`` or ``multi/``) or ``multitalk.safetensors``,
  native names. Optional when the base index already lists the audio tensors (MultiTalk-style
  index, or a fully merged checkpoint).

Every tensor is read once, cast, and assigned into the meta-built model: no second copy in memory.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from avatar_render.errors import AvatarRenderError
from avatar_render.models.dit import DiTConfig, WanAudioDiT, build_dit, param_dtype
from avatar_render.models.dit_names import (
    DIFFUSERS_SKIPPED,
    diffusers_to_native,
    is_audio_name,
    is_diffusers_name,
)
from avatar_render.models.lora import merge_lora
from avatar_render.models.weights import is_sharded, local_piece

INDEX_NAME = "diffusion_pytorch_model.safetensors.index.json"
SINGLE_NAME = "diffusion_pytorch_model.safetensors"
AUDIO_MODULE_NAMES = ("infinitetalk.safetensors", "single/infinitetalk.safetensors", "multitalk.safetensors")

def _listing(names, limit: int = 3) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass(frozen=True)
class TensorSource:
    file: Path
    stored_name: str
    shape: tuple[int, ...]


def resolve_base_files(base: Path) -> list[Path]:
    """The safetensors files of the base transformer at ``base`` (folder or file), in load order."""
    base = Path(base)
    if base.is_file():
        return [base]
    if not base.is_dir():
        raise AvatarRenderError(f"The DiT checkpoint {base} does not exist.")
    for folder in (base, base / "transformer"):
        index = folder / INDEX_NAME
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError):
                raise AvatarRenderError(
                    f"The checkpoint index {index} is not a valid safetensors index file.") from None
            files = [folder / name for name in sorted(set(weight_map.values()))]
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise AvatarRenderError(
                    f"The checkpoint index {index} lists {len(missing)} missing file(s): {_listing(missing)}.")
            return files
        if (folder / SINGLE_NAME).is_file():
            return [folder / SINGLE_NAME]
    raise AvatarRenderError(f"No DiT weights in {base}: expected {INDEX_NAME} with its shards, or {SINGLE_NAME}.")


def find_audio_module(root: Path) -> Path | None:
    """The InfiniteTalk/MultiTalk audio-module file under ``root``, if one of the published names is there."""
    for name in AUDIO_MODULE_NAMES:
        if (Path(root) / name).is_file():
            return Path(root) / name
    return None


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise AvatarRenderError(
            f"Cannot read the weights file {path}: it is not a valid safetensors file ({e}).") from None


def plan_sources(base: Path, audio: Path | None = None) -> dict[str, TensorSource]:
    """Native tensor name -> where to read it; audio-module tensors override base tensors."""
    sources: dict[str, TensorSource] = {}
    for file in resolve_base_files(base):
        header = _header(file)
        diffusers = any(is_diffusers_name(k) for k in header)
        for stored, shape in header.items():
            name = re.sub(r"^(model\.)?diffusion_model\.", "", stored)
            if diffusers:
                if DIFFUSERS_SKIPPED.search(name):
                    continue
                name = diffusers_to_native(name) or name  # unknown names surface as unexpected
            sources[name] = TensorSource(file, stored, shape)
    if audio is not None:
        audio = Path(audio)
        if not audio.is_file():
            raise AvatarRenderError(f"The audio-module weights file {audio} does not exist.")
        for stored, shape in _header(audio).items():
            sources[stored] = TensorSource(audio, stored, shape)
    return sources


def expected_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}


def check_sources(sources: dict[str, TensorSource], expected: dict[str, tuple[int, ...]], where: str) -> None:
    """Strict key and shape check; one AvatarRenderError sentence naming what is wrong."""
    missing = [k for k in expected if k not in sources]
    unexpected = [k for k in sources if k not in expected]
    wrong = [
        f"{k} {list(s.shape)} instead of {list(expected[k])}"
        for k, s in sources.items() if k in expected and s.shape != expected[k]
    ]
    problems = []
    if missing:
        hint = ("; they belong to the audio module, e.g. infinitetalk.safetensors"
                if all(map(is_audio_name, missing)) else "")
        problems.append(f"{len(missing)} tensor(s) missing ({_listing(missing)}{hint})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected tensor(s) ({_listing(unexpected)})")
    if wrong:
        problems.append(f"{len(wrong)} tensor(s) with the wrong shape ({_listing(wrong)})")
    if problems:
        raise AvatarRenderError(f"The DiT checkpoint {where} does not fit the model: {'; '.join(problems)}.")


@torch.no_grad()
def load_into(
    model: WanAudioDiT,
    sources: dict[str, TensorSource],
    *,
    dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    keep_fp32: bool = True,
    workers: int | None = None,
) -> None:
    """Stream the tensors into ``model`` (meta or materialised), casting each one, the files read side
    by side (``workers`` threads: safetensors' memory map and the copies release the GIL, so reading and
    casting overlap across files). Each tensor is read from the file's memory map straight to ``device``
    (no host copy of its own on the way to a GPU). Parameters already sharded across processes
    (DTensors) receive this process's piece alone: a slice of the map, so only its pages are read."""
    device = torch.device(device)
    # (a 2-core host reads one at a time)
    workers = max(1, min(8, (os.cpu_count() or 1) // 2)) if workers is None else workers
    modules = dict(model.named_modules())
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for name, src in sources.items():
        by_file.setdefault(src.file, []).append((name, src.stored_name))

    def read(file: Path, names: list[tuple[str, str]]) -> None:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name, stored in names:
                mod_name, _, leaf = name.rpartition(".")
                existing = modules[mod_name]._parameters[leaf]
                if is_sharded(existing):  # sharded before reading: keep this process's piece alone
                    rows = _rows_of(existing)
                    if rows is not None:  # split on the first dim: read those rows only
                        local = existing.to_local()
                        if local.numel():
                            local.copy_(f.get_slice(stored)[rows[0] : rows[1]])
                    elif (pair := local_piece(existing, f.get_tensor(stored))) is not None:
                        pair[0].copy_(pair[1])
                    continue
                t = f.get_tensor(stored)  # a view of the file's memory map
                target = t.dtype if dtype is None else param_dtype(name, dtype, keep_fp32=keep_fp32)
                p = t.to(device=device, dtype=target, copy=True)  # owned: the map is released with the file
                modules[mod_name]._parameters[leaf] = nn.Parameter(p, requires_grad=False)
                del t, p

    if len(by_file) == 1 or workers <= 1:
        for file, names in by_file.items():
            read(file, names)
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(by_file)), thread_name_prefix="weights") as pool:
        for done in [pool.submit(read, file, names) for file, names in by_file.items()]:
            done.result()


def _rows_of(param: torch.Tensor) -> tuple[int, int] | None:
    """The rows [a, b) of a parameter sharded on its first dim that this process holds (FSDP2 splits
    like ``torch.chunk``), or None when it is split on another dim."""
    (placement,) = param.placements
    if getattr(placement, "dim", None) != 0:
        return None
    n, size, i = param.shape[0], param.device_mesh.size(), param.device_mesh.get_local_rank()
    step = -(-n // size)
    return min(i * step, n), min((i + 1) * step, n)


def read_dit_weights(
    model: WanAudioDiT,
    base: Path,
    *,
    audio: Path | None = None,
    dtype: torch.dtype | None = torch.bfloat16,
    device: str | torch.device = "cpu",
    loras: tuple[tuple[Path, float], ...] = (),
    keep_fp32: bool = True,
) -> None:
    """Fill ``model`` (built on meta) from ``base`` + ``audio``: check every name and shape before
    reading anything, stream the tensors in, then merge the LoRAs ((path, scale) pairs).

    dtype None keeps the stored dtypes; otherwise tensors are cast to ``dtype`` except the float32
    islands (``dit.FP32_PARAMS``) when ``keep_fp32``.
    """
    sources = plan_sources(base, audio)
    check_sources(sources, expected_shapes(model), str(base) if audio is None else f"{base} + {audio}")
    load_into(model, sources, dtype=dtype, device=device, keep_fp32=keep_fp32)
    for path, scale in loras:
        merge_lora(model, path, scale=scale)


def load_dit(config: DiTConfig, base: Path, **options) -> WanAudioDiT:
    """Build on meta, ``read_dit_weights(model, base, **options)``, return it in eval mode."""
    model = build_dit(config)
    read_dit_weights(model, base, **options)
    return model.eval().requires_grad_(False)
