"""Per-GPU throughput levers of the A2V DiT, each switchable by config (``model.compile``, ``.attention``,
``.fp8``, ``.cuda_graphs``, ``.cache_kv``) and applied from outside the model:

* ``compile="blocks"``: regional ``torch.compile``: each block is compiled on its own; the blocks are
  one class with parameters as inputs, so a single compilation serves all of them.
* ``attention``: the SDPA backend every attention of a pass runs on (``auto`` lets PyTorch choose).
* ``fp8``: float8 matmuls (torchao's dynamic activation + weight float8, per-row scales) in the
  blocks' linear layers whose sizes the float8 kernels take (multiples of 16); the float32 islands
  (norms, modulation, embeddings, head) stay as they are.
* ``cuda_graphs``: each distinct pass signature (chunk shape, guidance pass) captured once as a CUDA
  graph and replayed; inputs are copied into the graph's own tensors.
* ``cache_kv``: the text/image cross-attention keys and values, which depend on the request's static
  conditioning only, computed by the first pass of a request and reused by the others (exact).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from avatar_render.errors import AvatarRenderError


@dataclass(frozen=True)
class DiTSpeed:
    compile: str = "none"  # none | blocks
    attention: str = "auto"  # auto | flash | efficient | cudnn | math
    fp8: bool = False
    cuda_graphs: bool = False
    cache_kv: bool = True


_BACKENDS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION", "math": "MATH"}


def attention_context(name: str) -> Callable[[], AbstractContextManager]:
    """A context factory that runs SDPA on backend ``name`` only (``auto``: PyTorch's own choice)."""
    if name == "auto":
        return nullcontext
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, _BACKENDS[name])
    return lambda: sdpa_kernel([backend])


def check_speed(speed: DiTSpeed, device: torch.device, *, distributed: bool, streamed: bool) -> None:
    """One sentence for a lever this set-up cannot take."""
    if speed.fp8:
        if device.type != "cuda":
            raise AvatarRenderError("Config key 'model.fp8' needs a CUDA GPU with float8 support (compute capability 8.9 or newer).")
        try:
            import torchao  # noqa: F401
        except ImportError:
            raise AvatarRenderError("Config key 'model.fp8' needs torchao: pip install torchao.") from None
        if torch.cuda.get_device_capability(device) < (8, 9):
            raise AvatarRenderError(f"Config key 'model.fp8' needs float8 matmuls, which {torch.cuda.get_device_name(device)} lacks "
                                    "(compute capability 8.9 or newer).")
    for key, on in (("model.cuda_graphs", speed.cuda_graphs), ("model.fp8", speed.fp8)):
        if on and device.type != "cuda":
            raise AvatarRenderError(f"Config key '{key}' needs a CUDA GPU.")
        if on and (distributed or streamed):
            raise AvatarRenderError(f"Config key '{key}' needs the DiT resident in one process "
                                    "(not under torchrun, not with dist.offload.dit=offloaded).")
    if speed.attention in ("efficient", "cudnn") and device.type != "cuda":
        raise AvatarRenderError(f"Config key 'model.attention' {speed.attention} needs a CUDA GPU (on a CPU: auto, flash or math).")


def fp8_filter(module: nn.Module, name: str) -> bool:
    """The linear layers float8 kernels take: both sizes multiples of 16."""
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 and module.out_features % 16 == 0


def apply_speed(net: nn.Module, speed: DiTSpeed) -> None:
    """In place, on the loaded DiT: float8 linear layers in its blocks, then each block compiled."""
    if speed.fp8:
        from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

        for block in net.blocks:
            quantize_(block, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()), filter_fn=fp8_filter)
    if speed.compile == "blocks":
        for block in net.blocks:
            block.compile()


@dataclass
class _Graph:
    graph: Any  # torch.cuda.CUDAGraph (or a stand-in with replay())
    inputs: list[Tensor]  # the graph's own input tensors, copied into before each replay
    output: Any  # the graph's output tensors (a pytree)


class GraphedCalls:
    """Calls of ``fn`` on tensors (a pytree of them) replayed from CUDA graphs, one per input signature
    (shapes, dtypes, devices and the tree's structure). The first call of a signature warms ``fn`` up on
    a side stream and captures it; every call copies its inputs into the graph's tensors, replays, and
    returns a copy of the output (the graph's own output is overwritten by the next replay).

    ``capture(fn, inputs) -> (graph, output)`` is the CUDA capture by default; tests on a CPU give a
    stand-in that checks the protocol."""

    def __init__(self, fn: Callable[..., Any], *, capture: Optional[Callable] = None, warmup: int = 2) -> None:
        self.fn = fn
        self.capture = capture or _cuda_capture
        self.warmup = warmup
        self.graphs: dict[Any, _Graph] = {}

    def __call__(self, *args: Any) -> Any:
        flat, spec = tree_flatten(args)
        key = (spec, tuple((tuple(t.shape), t.dtype, t.device) if isinstance(t, Tensor) else t for t in flat))
        entry = self.graphs.get(key)
        if entry is None:
            inputs = [t.clone() if isinstance(t, Tensor) else t for t in flat]
            graph, output = self.capture(lambda: self.fn(*tree_unflatten(inputs, spec)), self.warmup)
            entry = self.graphs[key] = _Graph(graph=graph, inputs=inputs, output=output)
        for mine, t in zip(entry.inputs, flat):
            if isinstance(t, Tensor) and mine.data_ptr() != t.data_ptr():
                mine.copy_(t)
        entry.graph.replay()
        out, out_spec = tree_flatten(entry.output)
        return tree_unflatten([t.clone() if isinstance(t, Tensor) else t for t in out], out_spec)


def _cuda_capture(run: Callable[[], Any], warmup: int) -> tuple[Any, Any]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):  # kernels chosen and workspaces made before the capture
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = run()
    return graph, output
