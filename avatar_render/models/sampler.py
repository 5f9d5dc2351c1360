"""Flow-matching sampling as the Wan / InfiniteTalk family does it.

Noise level runs from 1000 (pure noise) to 0 over ``steps`` steps, warped by ``shift``
(``s' = shift * s / (1 + (shift - 1) * s)`` with ``s`` in [0, 1]). The model predicts the flow
``v = noise - x0``, so ``x(t') = x(t) + (t' - t) / 1000 * v``. Guidance combines up to three passes:
conditional, text dropped (negative prompt, audio kept), and unconditional (negative prompt, zero audio).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import torch

NUM_TRAIN_TIMESTEPS = 1000


@dataclass(frozen=True)
class SamplerConfig:
    steps: int = 40
    shift: float = 5.0
    text_scale: float = 5.0  # 1.0 = no text guidance (two passes per step)
    audio_scale: float = 4.0  # 1.0 with text_scale 1.0 = no guidance (one pass per step)


def timesteps(cfg: SamplerConfig) -> torch.Tensor:
    """[steps + 1] float32, decreasing from 1000 to 0."""
    t = torch.linspace(NUM_TRAIN_TIMESTEPS, 1, cfg.steps, dtype=torch.float64) / NUM_TRAIN_TIMESTEPS
    t = cfg.shift * t / (1 + (cfg.shift - 1) * t)
    return torch.cat([t * NUM_TRAIN_TIMESTEPS, torch.zeros(1, dtype=torch.float64)]).float()


def passes(cfg: SamplerConfig) -> tuple[str, ...]:
    """Which model evaluations one step needs."""
    if cfg.text_scale == 1.0 and cfg.audio_scale == 1.0:
        return ("cond",)
    if cfg.text_scale == 1.0:
        return ("cond", "no_audio")
    return ("cond", "no_text", "uncond")


def guide(cfg: SamplerConfig, v: dict[str, torch.Tensor]) -> torch.Tensor:
    """Combine the passes of one step into one flow."""
    if len(v) == 1:
        return v["cond"]
    if "no_audio" in v:
        return v["no_audio"] + cfg.audio_scale * (v["cond"] - v["no_audio"])
    return v["uncond"] + cfg.text_scale * (v["cond"] - v["no_text"]) + cfg.audio_scale * (v["no_text"] - v["uncond"])


Predict = Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor]  # (latents, t [1], pass name) -> flow
Pin = Callable[[torch.Tensor], torch.Tensor]  # overwrite the latents held fixed (context, anchors)
# (pass names, run one pass by name) -> every pass's flow; one after the other unless spread over processes
Evaluate = Callable[[Sequence[str], Callable[[str], torch.Tensor]], dict[str, torch.Tensor]]


def serial(names: Sequence[str], run: Callable[[str], torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: run(name) for name in names}


def sample(cfg: SamplerConfig, *, noise: torch.Tensor, predict: Predict, pin: Pin,
           evaluate: Evaluate = serial) -> torch.Tensor:
    """noise: [C, F, H, W] -> clean latents of the same shape. ``pin`` runs before and after every step."""
    ts = timesteps(cfg).to(noise.device)
    names = passes(cfg)
    x = noise
    for i in range(cfg.steps):
        x = pin(x)
        t = ts[i : i + 1]
        v = guide(cfg, evaluate(names, lambda name: predict(x, t, name)))
        x = x + ((ts[i + 1] - ts[i]) / NUM_TRAIN_TIMESTEPS).to(x.dtype) * v.to(x.dtype)
    return pin(x)
