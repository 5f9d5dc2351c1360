"""Checkpoints into modules built on the meta device: lazy tensor reading, strict assignment, offload.

A checkpoint is read tensor by tensor (safetensors through ``safe_open``, ``.pth``/``.bin`` memory-mapped),
renamed by a per-model ``convert`` function, checked against the model's own names and shapes, and
assigned in place of the meta tensors, so no second full copy of the weights is ever held in memory.
"""

from __future__ import annotations

import json
import threading
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Optional, Protocol

import torch
from torch import nn

from avatar_render.errors import AvatarRenderError
from avatar_render.pipeline.module import Module, Placement

# Random weights come from the global generator, seeded per module: one module at a time, so that they do not
# depend on which modules load side by side (the pipeline reads the chunk loop's modules beside the init stage).
_GLOBAL_RNG = threading.Lock()

# (name, tensor) pairs in the model's naming; [] = a known tensor the model does not use; None = unknown.
Converted = list[tuple[str, torch.Tensor]] | None
Convert = Callable[[str, torch.Tensor], Converted]


def read_tensors(path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every (name, tensor) of one checkpoint file, read lazily, on the CPU."""
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        try:
            handle = safe_open(str(path), framework="pt")
        except Exception as e:  # noqa: BLE001 - SafetensorError and OS errors alike mean "unreadable"
            raise AvatarRenderError(f"{path} is not a readable safetensors file ({e}).") from None
        with handle as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
        return
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) serialisation cannot be memory-mapped
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle, zip and format errors all mean "not a checkpoint"
        raise AvatarRenderError(f"{path} is not a readable PyTorch checkpoint ({type(e).__name__}).") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise AvatarRenderError(f"{path} does not hold a dictionary of tensors.")
    for name in list(state):
        tensor = state.pop(name)
        if isinstance(tensor, torch.Tensor):
            yield name, tensor


def safetensors_shards(folder: Path, single: str) -> list[Path]:
    """``folder/single`` or, when ``folder/single.index.json`` exists, the shards it lists."""
    index = folder / f"{single}.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError):
            raise AvatarRenderError(f"{index} is not a valid safetensors index.") from None
        return [folder / n for n in names]
    return [folder / single]


def read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise AvatarRenderError(f"Missing model file: {path}.") from None
    except (OSError, ValueError) as e:
        raise AvatarRenderError(f"{path} is not valid JSON ({e}).") from None
    if not isinstance(data, dict):
        raise AvatarRenderError(f"{path} does not hold a JSON object.")
    return data


def by_table(table: Mapping[str, str]) -> Convert:
    """Rename through ``table``; a name outside it is unexpected."""
    return lambda key, t: [(table[key], t)] if key in table else None


def _shape(t: torch.Size | Sequence[int]) -> str:
    return "(" + ", ".join(str(int(n)) for n in t) + ")"


def load_checkpoint(
    net: nn.Module,
    files: Sequence[Path],
    convert: Convert,
    *,
    what: str,
    dtype: torch.dtype | Callable[[str], torch.dtype],
    optional: Iterable[str] = (),
) -> None:
    """Fill ``net`` (built on the meta device) from ``files``; every tensor of the model must come from them.

    Floating tensors are cast to ``dtype``, or to ``dtype(name)`` when it is a function of the model's
    tensor name (a model that keeps some tensors in float32). Tied parameters are filled once for all their names.
    ``optional`` names may be absent from the files; they are zero-filled.
    """
    expected = dict(net.state_dict(keep_vars=True))
    aliases: dict[str, list[str]] = {}
    by_id: dict[int, list[str]] = {}
    for name, p in net.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    for names in by_id.values():
        for n in names:
            aliases[n] = names
    loaded: set[str] = set()
    for path in files:
        for key, tensor in read_tensors(path):
            out = convert(key, tensor)
            if out is None:
                raise AvatarRenderError(
                    f"{path.name} holds the unexpected tensor '{key}', "
                    f"so it is not a {what} checkpoint in a layout this model reads."
                )
            for name, t in out:
                target = expected.get(name)
                if target is None:
                    raise AvatarRenderError(
                        f"{path.name} holds the unexpected tensor '{key}' (as '{name}') for the {what}."
                    )
                if tuple(t.shape) != tuple(target.shape):
                    raise AvatarRenderError(
                        f"{path.name} has '{key}' of shape {_shape(t.shape)} where the {what} needs "
                        f"{_shape(target.shape)}, so the checkpoint does not match this model size."
                    )
                cast = dtype(name) if callable(dtype) else dtype
                _assign(net, aliases.get(name, [name]), t.to(cast) if t.is_floating_point() else t)
                loaded.update(aliases.get(name, [name]))
    for name in optional:
        if name in expected and name not in loaded:
            zeros = torch.zeros(expected[name].shape, dtype=dtype(name) if callable(dtype) else dtype)
            _assign(net, aliases.get(name, [name]), zeros)
            loaded.add(name)
    missing = [n for n in expected if n not in loaded]
    if missing:
        listed = ", ".join(f"'{n}'" for n in missing[:3])
        if len(missing) > 3:
            listed += f" and {len(missing) - 3} more"
        names = ", ".join(p.name for p in files)
        raise AvatarRenderError(f"{names} lack {len(missing)} tensors the {what} needs: {listed}.")


def is_sharded(t: torch.Tensor) -> bool:
    """A parameter split across processes (a DTensor: FSDP2 applied to its module)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def local_piece(param: torch.Tensor, full: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(this process's local tensor of the sharded parameter ``param``, the same piece of ``full``),
    or None when this process holds none of it. ``param`` is a DTensor sharded on one dimension
    (FSDP2 splits with ``torch.chunk``); ``full`` has the parameter's whole shape."""
    (placement,) = param.placements
    mesh = param.device_mesh
    pieces = full.chunk(mesh.size(), dim=placement.dim)
    i = mesh.get_local_rank()
    local = param.to_local()  # a view of the shard's storage
    if i >= len(pieces) or not local.numel():
        return None
    return local, pieces[i]


def _assign(net: nn.Module, names: list[str], tensor: torch.Tensor) -> None:
    param = None
    for name in names:
        owner_name, _, attr = name.rpartition(".")
        owner = net.get_submodule(owner_name)
        if attr in owner._parameters:
            param = param if param is not None else nn.Parameter(tensor, requires_grad=False)
            owner._parameters[attr] = param
        else:
            owner._buffers[attr] = tensor


class TorchModule(Module):
    """A Module whose weights are one ``torch.nn.Module`` (``self.net``).

    Subclasses say how to build the architecture (``build``, called on the meta device before
    loading) and how to read their files (``read_weights``). Without weight files the module gets
    random weights from ``seed`` (tiny tests, speed measurements of the full-size architecture).
    """

    what: str = "model"  # for messages: "the {what} needs ..."

    def __init__(
        self, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0,
        shard: Callable[[nn.Module], None] | None = None,
    ) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.dtype = dtype
        self.seed = seed
        self.shard = shard  # splits the loaded net across the processes of a launch (dist.parallelize)
        self.net: nn.Module | None = None

    @abstractmethod
    def build(self) -> nn.Module:
        """The architecture, with parameters on the current default device."""

    @abstractmethod
    def read_weights(self, net: nn.Module) -> None:
        """Fill ``net`` (meta tensors) from ``weight_files()``."""

    def check_files(self) -> None:
        missing = self.missing_files()
        if missing:
            raise AvatarRenderError(f"The {self.what} weights are incomplete: {missing[0]} is missing.")

    def _load(self) -> None:
        self.check_files()
        if self.weight_files():
            with torch.device("meta"):
                net = self.build()
            self.read_weights(net)
        else:  # random weights, made where they will run
            devices = [self.device] if self.device.type == "cuda" else []
            with _GLOBAL_RNG, torch.random.fork_rng(devices=devices):
                torch.manual_seed(self.seed)
                with torch.device(self.device):
                    net = self.build()
            # All of it on the device: a few models make tensors with constructors that ignore the
            # default device (wav2vec2's masked_spec_embed), and the base method because diffusers'
            # override warns about dtype policies.
            nn.Module.to(net, self.device, self.dtype)
        self.net = net.eval().requires_grad_(False)

    def load(self) -> None:
        """Read the weights into host memory (random weights: straight onto the compute device);
        with ``shard``, split them across the processes (each keeps its piece where it computes)."""
        if self.placement is Placement.UNLOADED:
            self._load()
            if self.shard is not None and not is_sharded(next(self.net.parameters())):  # (or done while reading)
                self.shard(self.net)
            if is_sharded(next(self.net.parameters())):
                self.placement = Placement.SHARDED
                return
            on_device = self.compute_device.type != "cpu"
            self.placement = Placement.DEVICE if on_device else Placement.CPU

    def offload(self) -> None:
        if self.net is None or self.placement is Placement.SHARDED:  # shards stay where FSDP keeps them
            return
        nn.Module.to(self.net, "cpu")
        if torch.cuda.is_available():
            for t in list(self.net.parameters()) + list(self.net.buffers()):
                t.data = t.data.pin_memory()
            self.placement = Placement.PINNED
        else:
            self.placement = Placement.CPU

    def release(self) -> None:
        self.net = None
        super().release()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()  # give the memory back to the other processes and libraries too

    def prefetch(self) -> None:
        if self.net is None:
            self.load()
        if self.placement is Placement.SHARDED:
            return
        nn.Module.to(self.net, self.device, non_blocking=True)
        self.placement = Placement.DEVICE if self.device.type != "cpu" else Placement.CPU

    @property
    def compute_device(self) -> torch.device:
        """Where the weights are now (inputs go there); for shards, where they are gathered to compute
        (FSDP's offload policy keeps them on the host in between)."""
        assert self.net is not None, f"{self.name} is not loaded"
        if self.placement is Placement.SHARDED:
            return self.device
        p = next(self.net.parameters())
        return p.device

    def parameter_count(self) -> int:
        assert self.net is not None
        return sum(p.numel() for p in self.net.parameters())


class BlockStream(Protocol):
    """Blocks kept off the device and brought to it ahead of their forwards (applied from outside)."""

    def prefetch(self) -> None: ...


StreamPlan = Callable[[Sequence[nn.Module], torch.device], BlockStream]  # (blocks, device) -> their stream


class StreamedBlocksModule(TorchModule):
    """A TorchModule whose transformer blocks may live in pinned host memory, each copied to the device
    a few blocks ahead of its forward (``stream`` applies the ``stream_plan`` its maker gave, once the
    weights are read); everything else stays on the device."""

    stream_plan: StreamPlan | None = None
    streamer: BlockStream | None = None

    def stream(self, blocks: nn.ModuleList, rest: nn.Module) -> None:
        """Stream ``blocks``; move the other children of ``rest`` to the device."""
        assert self.stream_plan is not None
        self.streamer = self.stream_plan(blocks, self.device)
        for name, child in rest.named_children():
            if name != "blocks":
                nn.Module.to(child, self.device)

    def load(self) -> None:
        super().load()
        if self.streamer is not None:
            self.placement = Placement.STREAMED

    def offload(self) -> None:
        # Streamed, the blocks live on the host already; the first ones stay on their way to the
        # device for the next forward (a block or two of GPU memory), so coming back costs nothing.
        if self.streamer is None:
            super().offload()

    def prefetch(self) -> None:
        if self.net is None:
            self.load()
        if self.streamer is not None:
            self.streamer.prefetch()
        else:
            super().prefetch()
