"""The rolling state of one request: all that survives from one chunk to the next, and its saved form.

``flatten`` turns a state (or any tree of frozen dataclasses, tuples, lists, dicts, numbers,
strings, None, numpy arrays and torch tensors) into named arrays plus a JSON skeleton; ``unflatten``
rebuilds an equal tree. Every backend's carries go through it unchanged, so a backend is resumable
as soon as its carries are such trees of module-level dataclasses.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

import numpy as np

from avatar_render.pipeline.schedule import ChunkPlan
from avatar_render.pipeline.types import Segment


@dataclass(frozen=True)
class RollingState:
    carries: tuple[Any, ...]  # one per generation stage
    decode_carry: Any  # e.g. a causal decoder cache
    anchors: dict[int, Any] = field(default_factory=dict)  # frame -> state, for I chunks still to run
    pending: tuple[Segment, ...] = ()  # final segments waiting for earlier frames
    next_frame: int = 0  # first frame not yet published

    def with_anchors(self, add: dict[int, Any], drop: tuple[int, ...] = ()) -> "RollingState":
        anchors = {f: a for f, a in self.anchors.items() if f not in drop}
        anchors.update(add)
        return replace(self, anchors=anchors)

    def pop_ready(self) -> tuple["RollingState", Segment | None]:
        """The pending segment that starts at next_frame, if any."""
        for i, seg in enumerate(self.pending):
            if seg.start == self.next_frame:
                rest = self.pending[:i] + self.pending[i + 1 :]
                return replace(self, pending=rest, next_frame=seg.end), seg
        return self, None


@dataclass(frozen=True)
class Checkpoint:
    """Where the chunk loop stands after a plan entry: enough to go on from there."""

    plans_done: int  # schedule entries completed
    last_plan: ChunkPlan  # the last of them (checked again on resume)
    state: RollingState


@dataclass(frozen=True)
class Flat:
    arrays: dict[str, np.ndarray]  # own copies, safe to write from another thread
    skeleton: Any  # JSON-serialisable


def flatten(tree: Any) -> Flat:
    arrays: dict[str, np.ndarray] = {}
    return Flat(arrays=arrays, skeleton=_encode(tree, arrays, "state"))


def unflatten(flat: Flat) -> Any:
    return _decode(flat.skeleton, flat.arrays)


def _encode(x: Any, arrays: dict[str, np.ndarray], where: str) -> Any:
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int) and type(x) is int:
        return x
    if isinstance(x, float) and type(x) is float:
        return x if math.isfinite(x) else {"float": repr(x)}
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        key = f"t{len(arrays)}"
        arrays[key] = np.array(x, copy=True, order="C")
        return {"array": key, "scalar": isinstance(x, np.generic)}
    if type(x).__module__.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter"):
        return _encode_torch(x, arrays)
    if isinstance(x, Fraction):
        return {"fraction": [x.numerator, x.denominator]}
    if isinstance(x, (tuple, list)) and type(x) in (tuple, list):
        items = [_encode(v, arrays, f"{where}[{i}]") for i, v in enumerate(x)]
        return {type(x).__name__: items}
    if isinstance(x, dict) and type(x) is dict:
        return {"dict": [[_encode(k, arrays, where), _encode(v, arrays, f"{where}[{k!r}]")] for k, v in x.items()]}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        cls = type(x)
        if "<locals>" in cls.__qualname__:
            raise TypeError(f"{where}: {cls.__qualname__} is defined inside a function; define it at module level so "
                            "it can be saved")
        fields = {f.name: _encode(getattr(x, f.name), arrays, f"{where}.{f.name}") for f in dataclasses.fields(x)}
        return {"dataclass": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    raise TypeError(f"{where}: cannot save a {type(x).__qualname__}; rolling state must be dataclasses, containers, "
                    "numbers and arrays")


def _decode(node: Any, arrays: dict[str, np.ndarray]) -> Any:
    if not isinstance(node, dict):
        return node
    kind = next(iter(node))  # the first key names the node (json keeps key order)
    value = node[kind]
    if kind == "float":
        return float(value)
    if kind == "array":
        a = arrays[value]
        return a[()] if node["scalar"] else a
    if kind == "torch":
        return _decode_torch(node, arrays)
    if kind == "fraction":
        return Fraction(*value)
    if kind == "tuple":
        return tuple(_decode(v, arrays) for v in value)
    if kind == "list":
        return [_decode(v, arrays) for v in value]
    if kind == "dict":
        return {_decode(k, arrays): _decode(v, arrays) for k, v in value}
    if kind == "dataclass":
        cls = _dataclass_named(value)
        values = {name: _decode(v, arrays) for name, v in node["fields"].items()}
        init = {f.name for f in dataclasses.fields(cls) if f.init}
        obj = cls(**{k: v for k, v in values.items() if k in init})
        for k, v in values.items():
            if k not in init:
                object.__setattr__(obj, k, v)
        return obj
    raise ValueError(f"unknown node {kind!r} in a saved state")


def _dataclass_named(name: str) -> type:
    """The class saved as ``module:QualName``; only from modules already imported (nothing is imported here)."""
    module_name, _, qualname = name.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise ValueError(f"the saved state names {name}, which is not a loaded dataclass")
    return obj


def _encode_torch(t: Any, arrays: dict[str, np.ndarray]) -> dict:
    import torch

    key = f"t{len(arrays)}"
    cpu = t.detach().to("cpu").contiguous()
    owned = cpu.data_ptr() != t.data_ptr()  # a device tensor's host copy is new already: no second copy
    if cpu.dtype == torch.bfloat16:  # numpy has no bfloat16: keep the bits
        a = cpu.view(torch.int16).numpy().view(np.uint16)
    else:
        a = cpu.numpy()
    arrays[key] = a if owned else a.copy()
    return {"torch": key, "dtype": str(cpu.dtype).removeprefix("torch."), "device": str(t.device),
            "requires_grad": bool(t.requires_grad)}


def _decode_torch(node: dict, arrays: dict[str, np.ndarray]) -> Any:
    import torch

    a = arrays[node["torch"]]
    if node["dtype"] == "bfloat16":
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(a))
    device = torch.device(node["device"])
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"the saved state holds tensors on {device}, and this machine has no CUDA device")
    return t.to(device).requires_grad_(node["requires_grad"])
