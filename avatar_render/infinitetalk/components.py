"""The five modules of the diffusion backend, configured from ``cfg.model`` and located in a local
folder in the family's published layout (or given random weights when ``model.root`` is unset)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from avatar_render.config import ModelConfig
from avatar_render.distributed.device_mesh import resolve_device
from avatar_render.errors import AvatarRenderError
from avatar_render.infinitetalk.parallel import DiTPlan, block_stream
from avatar_render.models.audio_encoder import TINY_WAV2VEC2, AudioEncoder
from avatar_render.models.checkpoints import (
    find_audio_module,
    read_dit_weights,
    resolve_base_files,
)
from avatar_render.models.dit import (
    DiTConfig,
    WanAudioDiT,
    build_dit,
    materialize_random,
    param_dtype,
)
from avatar_render.models.dit_speed import DiTSpeed, GraphedCalls, apply_speed, attention_context, check_speed
from avatar_render.models.image_encoder import ImageEncoder, ImageEncoderConfig
from avatar_render.models.text_encoder import TextEncoder, TextEncoderConfig
from avatar_render.models.vae import VaeConfig, WanVae
from avatar_render.models.weights import StreamedBlocksModule, StreamPlan

WAV2VEC_DIR = "chinese-wav2vec2-base"  # the audio encoder the family uses, beside or inside the model folder


class DiTModule(StreamedBlocksModule):
    """The A2V transformer: Wan-native or diffusers base weights + the audio-module file + LoRAs."""

    name = "dit"
    what = "A2V transformer"

    def __init__(self, config: DiTConfig, *, root: Optional[Path], audio_module: Optional[Path],
                 loras: tuple[tuple[Path, float], ...] = (), device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                 parallel: Optional[DiTPlan] = None, stream: Optional[StreamPlan] = None,
                 speed: DiTSpeed = DiTSpeed()) -> None:
        super().__init__(device=device, dtype=dtype, seed=seed, shard=parallel.apply if parallel else None)
        self.config, self.root, self.audio_module, self.loras = config, root, audio_module, loras
        self.plan = parallel  # how the DiT is split across processes (dist.parallelize)
        self.stream_plan = stream if parallel is None else None  # blocks in pinned host memory, brought in ahead
        self.speed = speed  # the throughput levers (models/dit_speed.py)
        self._attention = attention_context(speed.attention)
        self._graphed: Optional[GraphedCalls] = None

    def _load(self) -> None:
        if self.root is None:
            # Random weights made straight in the target dtype on the compute device: the
            # generic path builds in float32 first, twice the memory (about 75 GB at 14B).
            net = materialize_random(build_dit(self.config), device=self.device, dtype=self.dtype, seed=self.seed)
            self.net = net.eval().requires_grad_(False)
        elif self.plan is not None and self.plan.home is not None:
            self.net = self._sharded_from_files(self.plan)
        else:
            super()._load()
        if self.stream_plan is not None:
            self.stream(self.net.blocks, self.net)
        apply_speed(self.net, self.speed)

    def predict(self, x: torch.Tensor, t: torch.Tensor, context: Optional[torch.Tensor],
                clip_fea: Optional[torch.Tensor], audio: torch.Tensor, *, cross_kv=None, keep_kv: bool = False):
        """One DiT pass (``WanAudioDiT.forward``) with the levers that act per call: the SDPA backend and,
        with ``cuda_graphs``, a replayed graph (the passes that hand back their keys and values run eagerly)."""
        with self._attention():
            if self.speed.cuda_graphs and not keep_kv:
                if self._graphed is None:
                    net = self.net
                    self._graphed = GraphedCalls(lambda x, t, c, f, a, kv: net(x, t, c, f, a, cross_kv=kv))
                return self._graphed(x, t, context, clip_fea, audio, cross_kv)
            return self.net(x, t, context, clip_fea, audio, cross_kv=cross_kv, keep_kv=keep_kv)

    def _sharded_from_files(self, plan: DiTPlan) -> nn.Module:
        """Shard first, then read: every process reads each tensor and keeps its own piece, so no
        process ever holds the whole DiT (with the full-size model, 38 GB of host memory each)."""
        self.check_files()
        with torch.device("meta"):
            net = build_dit(self.config)
        for name, p in list(net.named_parameters()):  # the dtypes the weights will have
            owner, _, leaf = name.rpartition(".")
            net.get_submodule(owner)._parameters[leaf] = nn.Parameter(
                torch.empty_like(p, dtype=param_dtype(name, self.dtype)), requires_grad=False)
        plan.apply(net)
        net.to_empty(device=plan.home)
        self.read_weights(net)
        return net.eval().requires_grad_(False)

    @property
    def compute_device(self) -> torch.device:
        return self.device if self.streamer is not None else super().compute_device

    def weight_files(self) -> list[Path]:
        if self.root is None:
            return []
        try:
            files = list(resolve_base_files(self.root))
        except AvatarRenderError:  # nothing there: name the file the family publishes
            files = [self.root / "diffusion_pytorch_model.safetensors.index.json"]
        return files + ([self.audio_module] if self.audio_module else []) + [p for p, _ in self.loras]

    def build(self) -> nn.Module:
        return WanAudioDiT(self.config)

    def read_weights(self, net: nn.Module) -> None:
        # Resident in one process: each tensor straight from the file's memory map to its device (no host
        # copy on the way). Sharded or streamed: to the host, where the shards or the block streamer take them.
        to = self.device if self.plan is None and self.stream_plan is None else "cpu"
        read_dit_weights(net, self.root, audio=self.audio_module, dtype=self.dtype, loras=self.loras, device=to)

    @property
    def model(self) -> WanAudioDiT:
        assert self.net is not None, "load the DiT first"
        return self.net  # type: ignore[return-value]


@dataclass(frozen=True)
class Components:
    dit: DiTModule
    vae: WanVae
    text: TextEncoder
    image: ImageEncoder
    audio: AudioEncoder


@dataclass(frozen=True)
class Architectures:
    dit: DiTConfig
    vae: VaeConfig
    text: TextEncoderConfig
    image: ImageEncoderConfig
    audio: Optional[dict]  # wav2vec2 config overrides; None = read from the model folder (or wav2vec2-base)


def architectures(size: str) -> Architectures:
    if size == "tiny":
        audio, text, image = dict(TINY_WAV2VEC2), TextEncoderConfig.tiny(), ImageEncoderConfig.tiny()
        dit = dataclasses.replace(DiTConfig.tiny(), clip_dim=image.hidden_size, text_dim=text.d_model,
                                  audio_layers=audio["num_hidden_layers"], audio_dim=audio["hidden_size"])
        return Architectures(dit=dit, vae=VaeConfig.tiny(), text=text, image=image, audio=audio)
    return Architectures(dit=DiTConfig.infinitetalk_14b(), vae=VaeConfig(), text=TextEncoderConfig(),
                         image=ImageEncoderConfig(), audio=None)


def dit_speed(m: ModelConfig) -> DiTSpeed:
    return DiTSpeed(compile=m.compile, attention=m.attention, fp8=m.fp8, cuda_graphs=m.cuda_graphs, cache_kv=m.cache_kv)


def make_components(m: ModelConfig, *, seed: int, parallel: Optional[DiTPlan] = None,
                    text_shard: Optional[Callable[[nn.Module], None]] = None,
                    device: Optional[torch.device] = None, stream_dit: int = 0) -> Components:
    """``parallel``: how the DiT is split across processes; ``text_shard``: applied to the loaded text
    encoder (multi-process); ``device``: this process's GPU there;
    ``stream_dit`` > 0: keep the DiT's blocks in pinned host memory, each copied to the device
    that many blocks ahead of its forward."""
    device = resolve_device(m.device, device)
    dtype = getattr(torch, m.dtype)
    root = Path(m.root).expanduser() if m.root else None
    if root is not None and not root.is_dir():
        raise AvatarRenderError(f"model.root '{root}' is not a folder; point it at the downloaded model folder.")
    arch = architectures(m.size)
    audio_cfg, text_cfg, image_cfg, vae_cfg, dit_cfg = arch.audio, arch.text, arch.image, arch.vae, arch.dit
    wav2vec = None
    if root is not None:
        wav2vec = next((p for p in (root / WAV2VEC_DIR, root.parent / WAV2VEC_DIR) if p.is_dir()), root / WAV2VEC_DIR)
    audio_module = None
    if m.audio_module:
        audio_module = Path(m.audio_module).expanduser()
    elif root is not None:  # in the folder, or where the family's download puts it beside the folder
        audio_module = find_audio_module(root) or find_audio_module(root.parent / "InfiniteTalk")
    loras = ((Path(m.lora).expanduser(), m.lora_scale),) if m.lora else ()
    speed = dit_speed(m)
    check_speed(speed, device, distributed=parallel is not None, streamed=stream_dit > 0)
    kw = dict(device=device, seed=seed)
    return Components(
        dit=DiTModule(dit_cfg, root=root, audio_module=audio_module, loras=loras, dtype=dtype, parallel=parallel,
                      stream=block_stream(stream_dit), speed=speed, **kw),
        vae=WanVae(vae_cfg, path=root, dtype=getattr(torch, m.vae_dtype), **kw),
        text=TextEncoder(text_cfg, path=root, dtype=dtype if device.type == "cuda" else torch.float32,
                         shard=text_shard, **kw),
        image=ImageEncoder(image_cfg, path=root, dtype=dtype if device.type == "cuda" else torch.float32, **kw),
        audio=AudioEncoder(path=wav2vec, config=audio_cfg, dtype=torch.float32, **kw),
    )
