"""The registry of backends and super-resolution modes: each declared once, here, as plain data.

The job, the config, the metrics, ``doctor`` and the batch ask it what a backend needs instead of
comparing its name. A backend's code is named by ``"module:function"`` and imported only when asked
for, so that reading the registry imports neither torch nor a backend (the preview starts fast).
Adding a backend: its room (a ``build_*(cfg, mesh) -> Pipeline`` and its doctor checks) and one
``Backend(...)`` below. ``tests/test_architecture.py`` fails on a backend's or an SR mode's name
compared anywhere else.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from avatar_render.errors import AvatarRenderError


@dataclass(frozen=True)
class Check:
    """One line of ``avatar-render doctor``."""

    group: str  # "versions", "codecs", "devices", "models", "backends", "model files", "inputs"
    name: str
    ok: bool
    detail: str  # plain text (it may hold brackets, as in .[model])


@dataclass(frozen=True)
class Backend:
    name: str  # the value of the config's ``backend``
    build: str  # "module:function": (cfg, mesh) -> Pipeline
    checks: str  # "module:function": (cfg or None, *, can_encode) -> list[Check], what doctor says of it
    section: str  # the config section of its own settings, its frame rate (``<section>.fps``) among them
    lead_frames: int = 0  # frames N0 generates before its chunk_frames (the pipeline's ``ChunkSizes.lead_frames``)
    check_sizes: str = ""  # "module:function": (cfg) -> None, raising on chunk sizes it cannot take; "": any
    early: str = ""  # "module:function": (cfg, reference path) -> None, set-up work started in a thread
    #   before the rest of the package is imported (the command line calls it); "": none
    needs: str = ""  # what its code imports beyond the base install, named when it is missing; "": nothing
    weights: bool = False  # it runs networks with weights (``model.*``: size, device, steps, model.root)
    gpu: bool = False  # a job takes a GPU (the batch shares the visible GPUs out, one per process)
    fps_free: bool = False  # its frame rate may be set to a video reference's (the note says how)
    rig: bool = False  # it moves a mesh fitted to the face in every source frame (dense landmarks); else
    #   it crops the first frame's face for all
    session_chunks: bool = False  # its chunk sizes are free: a real-time session uses ``session.chunk_frames`` and a
    #   live render starts with a short chunk (low latency)
    transcript: bool = False  # its mouth follows the words given (``preview.transcript``) when there are some

    def load(self, attribute: str) -> Callable[..., Any]:
        """The function ``attribute`` ("build", "checks", "check_sizes", "early") names, imported now."""
        module, _, function = getattr(self, attribute).partition(":")
        try:
            return getattr(importlib.import_module(module), function)
        except ImportError as e:
            if not self.needs:
                raise
            raise AvatarRenderError(f"The {self.name} backend needs {self.needs} ({e.name} is missing): "
                                    "pip install -e '.[model]' after installing torch for your hardware.") from None


@dataclass(frozen=True)
class SRMode:
    """What the diffusion backend's publishing slot does after the decode (``model.sr``)."""

    name: str
    upscales: bool  # it generates below the output size (``model.gen_width``, derived as half when 0)
    one_step: bool  # the one-step SR network (SwiftVR); else the 2x VAE decoder when it upscales


BACKENDS: dict[str, Backend] = {}
SR_MODES: dict[str, SRMode] = {}


def register(backend: Backend) -> Backend:
    assert backend.name not in BACKENDS, f"backend {backend.name} registered twice"
    BACKENDS[backend.name] = backend
    return backend


def register_sr(mode: SRMode) -> SRMode:
    assert mode.name not in SR_MODES, f"SR mode {mode.name} registered twice"
    SR_MODES[mode.name] = mode
    return mode


def backend(name: str) -> Backend:
    """The registered backend ``name``; a user's unknown name is refused in one sentence."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise AvatarRenderError(f"Backend '{name}' is not available (one of {', '.join(BACKENDS)}).") from None


def sr_mode(name: str) -> SRMode:
    try:
        return SR_MODES[name]
    except KeyError:
        raise AvatarRenderError(f"model.sr '{name}' is not available (one of {', '.join(SR_MODES)}).") from None


PREVIEW = register(Backend(
    name="preview", build="avatar_render.preview.engine:build_preview", checks="avatar_render.preview.checks:checks",
    section="preview", fps_free=True, rig=True, session_chunks=True, transcript=True,
    early="avatar_render.preview.early:start"))
INFINITETALK = register(Backend(
    name="infinitetalk", build="avatar_render.infinitetalk.engine:build_infinitetalk",
    checks="avatar_render.infinitetalk.checks:checks", section="model",
    lead_frames=1,  # the first latent holds one frame (the reference's), so later chunks start at 1 + 4k
    check_sizes="avatar_render.infinitetalk.engine:check_sizes", needs="PyTorch, diffusers and transformers",
    weights=True, gpu=True))

register_sr(SRMode("none", upscales=False, one_step=False))
register_sr(SRMode("vae2x", upscales=True, one_step=False))
register_sr(SRMode("swiftvr", upscales=True, one_step=True))
