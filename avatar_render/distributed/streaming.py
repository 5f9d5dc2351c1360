"""Pinned-host offload with per-block streaming, for one process (torchrun runs use FSDP2's offload).

A model's repeated blocks live in pinned host memory; each block is copied to the GPU on a side
stream ``ahead`` blocks before its forward, so block n+1's transfer overlaps block n's compute, and
its GPU copy is dropped after its forward. Everything outside the blocks stays where it is. The
upload order wraps around, so the first blocks of the next forward are on their way while the last
ones run. GPU memory held by the blocks: ``ahead + 1`` of them instead of all.

Applied from outside the model through forward hooks; ``remove()`` puts every block back on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn


def _slots(block: nn.Module) -> list[tuple[nn.Module, str, bool]]:
    """(owner, attribute, is_parameter) of every tensor of ``block``."""
    out = []
    for name, _ in block.named_parameters():
        owner, _, attr = name.rpartition(".")
        out.append((block.get_submodule(owner), attr, True))
    for name, b in block.named_buffers():
        if b is not None:
            owner, _, attr = name.rpartition(".")
            out.append((block.get_submodule(owner), attr, False))
    return out


def _get(owner: nn.Module, attr: str, param: bool) -> torch.Tensor:
    return owner._parameters[attr] if param else owner._buffers[attr]


def _set(owner: nn.Module, attr: str, param: bool, t: torch.Tensor) -> None:
    if param:
        owner._parameters[attr].data = t
    else:
        owner._buffers[attr] = t


class BlockStreamer:
    def __init__(self, blocks: Sequence[nn.Module], device: torch.device, *, ahead: int = 1) -> None:
        self.blocks = list(blocks)
        self.device = torch.device(device)
        self.ahead = max(1, min(ahead, len(self.blocks) - 1))
        self.cuda = self.device.type == "cuda"
        self.copy_stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.slots = [_slots(b) for b in self.blocks]
        self.host: list[list[torch.Tensor]] = []
        for slots in self.slots:  # [block][tensor]: the host copies, pinned where a GPU will read them
            tensors = []
            for owner, attr, param in slots:
                t = _get(owner, attr, param).detach()
                # One copy into the host memory it will live in (pinned where a GPU will read it).
                tensors.append(torch.empty_like(t, device="cpu", pin_memory=self.cuda).copy_(t) if self.cuda
                               else t.to("cpu"))
                _set(owner, attr, param, tensors[-1])
            self.host.append(tensors)
        if self.cuda:
            torch.cuda.empty_cache()  # the device copies just dropped
        self.pending: dict[int, tuple[torch.cuda.Event | None, list[torch.Tensor]]] = {}
        self.hooks = [h for i, b in enumerate(self.blocks) for h in (
            b.register_forward_pre_hook(partial(self._before, i)),
            b.register_forward_hook(partial(self._after, i)),
        )]

    def upload(self, i: int) -> None:
        """Start copying block ``i`` to the device (no-op if it is on its way)."""
        i %= len(self.blocks)
        if i in self.pending:
            return
        if not self.cuda:
            self.pending[i] = (None, [t.to(self.device, copy=True) for t in self.host[i]])  # a real copy, as on a GPU
            return
        with torch.cuda.stream(self.copy_stream):
            tensors = [t.to(self.device, non_blocking=True) for t in self.host[i]]
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        self.pending[i] = (done, tensors)

    def prefetch(self) -> None:
        """Start the first blocks' copies (when the model is about to run again)."""
        for i in range(self.ahead):
            self.upload(i)

    def release(self) -> None:
        """Drop copies on their way (the model is set aside for a while)."""
        self.pending.clear()

    def _before(self, i: int, module: nn.Module, args) -> None:
        for j in range(i, i + self.ahead + 1):
            self.upload(j)
        done, tensors = self.pending.pop(i)
        if done is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(done)
            for t in tensors:
                t.record_stream(stream)  # the copy stream's memory is read here: not reused before this point
        for (owner, attr, param), t in zip(self.slots[i], tensors):
            _set(owner, attr, param, t)

    def _after(self, i: int, module: nn.Module, args, output) -> None:
        for (owner, attr, param), t in zip(self.slots[i], self.host[i]):
            _set(owner, attr, param, t)

    def remove(self) -> None:
        """Stop streaming: every block back on the device for good."""
        for h in self.hooks:
            h.remove()
        self.pending.clear()
        for slots, host in zip(self.slots, self.host):
            for (owner, attr, param), t in zip(slots, host):
                _set(owner, attr, param, t.to(self.device))
        self.host = []

    def device_bytes(self) -> int:
        """Bytes of block weights the streamer holds on the device right now."""
        return sum(t.numel() * t.element_size() for _, ts in self.pending.values() for t in ts) if self.cuda else 0
