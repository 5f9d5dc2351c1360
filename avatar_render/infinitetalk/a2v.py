"""The A2V stage: flow-matching sampling of one chunk's latents.

N chunks pin their leading latents to the context (the reference latent for N0, the previous chunk's
last latents afterwards) at every step, as the family injects motion frames. I chunks pin both ends:
the anchor latent of N(k) in front and the anchor latent of N(k+1) behind, and regenerate between.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from avatar_render.infinitetalk.stage_io import AudioWindow, LatentChunk, ModelStatic
from avatar_render.models.grid import latent_of, latents_in
from avatar_render.models.sampler import Evaluate, SamplerConfig, passes, sample, serial
from avatar_render.models.vae import WanVae
from avatar_render.pipeline.module import Module
from avatar_render.pipeline.stage import Stage
from avatar_render.telemetry import count


@dataclass(frozen=True)
class ContextCarry:
    # context_mode "latents": [16, m, h, w], the last latents of the latest N chunk;
    # "reencode": [16, n, h, w], all the latents that chunk's model saw (a stream that decodes on its own).
    # None before N0.
    latents: Optional[torch.Tensor]
    # model.cache_kv: every DiT block's cross-attention keys and values of the request's prompt ("text")
    # and negative prompt ("null") with its reference image, made by the first pass that needed them.
    # Not saved in checkpoints (made again after a resume).
    kv: Optional[dict[str, tuple]] = None


def reencoded(vae: WanVae, chunk_latents: torch.Tensor, context_frames: int) -> torch.Tensor:
    """Decode a chunk, re-encode its last frames: [16, n, h, w] -> [16, m, h, w] whose first latent
    holds one frame, as the family makes its motion frames."""
    frames = vae.decode(chunk_latents[None])  # [1, 3, T, H, W]
    return vae.encode(frames[:, :, -context_frames:])[0].cpu()


def pinned(kind: str, carry: ContextCarry, static: ModelStatic, anchors: tuple) -> tuple[torch.Tensor, int]:
    """The latents held fixed in front of a chunk ([16, m, h, w]) and how many sit behind it (0 or 1)."""
    if kind == "I":
        return anchors[0], 1
    return (static.ref_latent if carry.latents is None else carry.latents), 0


def dit_tokens(config, latent_shape: tuple[int, ...]) -> int:
    """Tokens of one DiT pass over latents [16, n, h, w] (all of them, whatever the processes share)."""
    _, n, h, w = latent_shape
    pt, ph, pw = config.patch_size
    return (n // pt) * (h // ph) * (w // pw)


class A2VStage(Stage[AudioWindow, LatentChunk]):
    name = "a2v"
    input_type = AudioWindow
    output_type = LatentChunk

    def __init__(self, *, dit: Module, vae: WanVae, sampler: SamplerConfig, context_frames: int, context_mode: str,
                 evaluate: Evaluate = serial) -> None:
        self.dit = dit  # a DiTModule: .model is the WanAudioDiT, .predict one pass with the levers of .speed
        self.evaluate = evaluate  # how a step's guidance passes are run (dist.cfg_parallel spreads them over processes)
        self.vae = vae
        self.sampler = sampler
        self.context_frames = context_frames
        self.context_latents = latents_in(context_frames)  # m: latents that condition the next chunk
        self.context_mode = context_mode
        count("dit_tokens", 0)  # declared: chunk records carry it from the first one on

    def modules(self) -> tuple[Module, ...]:
        return (self.dit, self.vae) if self.context_mode == "reencode" else (self.dit,)

    def init_carry(self, static: Any) -> ContextCarry:
        return ContextCarry(latents=None)

    def saved_carry(self, carry: ContextCarry) -> ContextCarry:
        return ContextCarry(latents=carry.latents)  # the keys and values are made again (hundreds of MB at 14B)

    def run(self, x: AudioWindow, *, static: ModelStatic, carry: ContextCarry) -> tuple[LatentChunk, ContextCarry]:
        plan = x.chunk.plan
        if self.context_mode == "reencode" and plan.kind == "N" and carry.latents is not None:
            carry = ContextCarry(latents=reencoded(self.vae, carry.latents, self.context_frames), kv=carry.kv)
        front, n_back = pinned(plan.kind, carry, static, x.chunk.anchors)
        back = x.chunk.anchors[1] if n_back else None
        noise = x.noise
        n = noise.shape[1]
        m = front.shape[1]
        model = self.dit.model
        dtype = next(model.parameters()).dtype
        device = self.dit.compute_device
        # Everything a pass reads goes to the device once a chunk (a copy per pass would stall the host).
        cond = (static.cond if x.cond is None else x.cond)[:, :, :n].to(device, dtype)
        audio = x.features.to(device, dtype)
        zero_audio = torch.zeros_like(audio)
        text, text_null = static.text.to(device, dtype), static.text_null.to(device, dtype)
        texts = {"cond": text, "no_text": text_null, "uncond": text_null, "no_audio": text}
        variant = {"cond": "text", "no_text": "null", "uncond": "null", "no_audio": "text"}
        # (a chunk with its own image features makes its own keys and values, kept for its passes only)
        own_image = x.clip_fea is not None
        kv = ({} if own_image else dict(carry.kv or {})) if self.dit.speed.cache_kv else None
        clip_fea = (static.clip_fea if x.clip_fea is None else x.clip_fea).to(device, dtype)
        front = front.to(device, torch.float32)
        back = None if back is None else back.to(device, torch.float32)

        def pin(z: torch.Tensor) -> torch.Tensor:
            z = z.clone()
            z[:, :m] = front
            if back is not None:
                z[:, -1:] = back
            return z

        def predict(z: torch.Tensor, t: torch.Tensor, name: str) -> torch.Tensor:
            inp = torch.cat([z.to(device, dtype)[None], cond], dim=1)  # [1, 36, n, h, w]
            a = zero_audio if name in ("uncond", "no_audio") else audio
            with torch.no_grad():
                if kv is None:
                    v = self.dit.predict(inp, t.to(device), texts[name], clip_fea, a)
                elif variant[name] in kv:
                    v = self.dit.predict(inp, t.to(device), None, None, a, cross_kv=kv[variant[name]])
                else:
                    v, kv[variant[name]] = self.dit.predict(inp, t.to(device), texts[name], clip_fea, a, keep_kv=True)
            return v[0].float()

        latents = sample(self.sampler, noise=noise.float().to(device), predict=predict, pin=pin,
                         evaluate=self.evaluate).cpu()
        count("dit_tokens", dit_tokens(model.config, noise.shape) * self.sampler.steps * len(passes(self.sampler)))
        if own_image:
            kv = carry.kv  # (the request's own, untouched)
        if plan.kind == "I":
            return (LatentChunk(plan=plan, latents=latents, first_latent=latent_of(plan.start)),
                    ContextCarry(carry.latents, kv))
        new = latents if plan.start == 0 else latents[:, m:]  # N0 publishes its reference latent as frame 0
        out = LatentChunk(plan=plan, latents=new, first_latent=latent_of(plan.start))
        keep = latents if self.context_mode == "reencode" else new[:, -self.context_latents :]
        return out, ContextCarry(latents=keep.clone(), kv=kv)
