"""The decode stages in front of the SR stage: the causal VAE decode of the published latents with
the frames left on the device (``PixelDecode``: the Wan VAE at the generation size, or the 2x decoder
as the cheap path), and a second decode of the same latents by the 2x decoder as the fidelity path
of the one-step model (``FidelityDecode``). Each carries its decoder's cache as ``LatentDecode`` does
(a checkpoint keeps the last few latents and the cache is rebuilt from them)."""

from __future__ import annotations

import dataclasses

import torch

from avatar_render.infinitetalk.stage_io import DecodeCarry, Decoded, LatentSegment, ModelStatic
from avatar_render.infinitetalk.stages import LatentDecode, anchor_colour
from avatar_render.models.sr.vae2x import pixel_shuffle_video
from avatar_render.models.vae import StreamingDecoder, WanVae


def decode_latents(vae: WanVae, latents: torch.Tensor, carry: DecodeCarry,
                   frames: int) -> tuple[torch.Tensor, DecodeCarry]:
    """The next latents [16, n, h, w] of the stream -> (its first ``frames`` frames [1, 3, T, H, W] in
    [-1, 1] on the compute device, pixel-shuffled for the 2x decoder; the carry after them)."""
    dec = StreamingDecoder(vae)
    out, cache = dec.decode(latents[None], carry.cache)
    if out.shape[1] != 3:
        out = pixel_shuffle_video(out)
    recent = torch.cat([carry.recent, latents.to(carry.recent)], dim=1)[:, -dec.window():]
    return out[:, :, :frames], DecodeCarry(cache, recent, carry.decoded + latents.shape[1])


def guarded_decode(stage: LatentDecode, x: LatentSegment | Decoded, static: ModelStatic,
                   carry: DecodeCarry) -> tuple[torch.Tensor, DecodeCarry]:
    """``x``'s latents decoded by ``stage``'s VAE, its colour guard applied: (frames, carry after them)."""
    frames, carry = decode_latents(stage.vae, x.latents, carry, x.end - x.start)
    if stage.colour_guard > 0:
        frames = anchor_colour(frames, static.ref_mean, static.ref_std, stage.colour_guard)
    return frames, carry


class PixelDecode(LatentDecode):
    """Latents -> frames on the device, whole frames in every process (the SR stage needs them whole)."""

    name = "decode"
    input_type = LatentSegment
    output_type = Decoded

    def run(self, x: LatentSegment, *, static: ModelStatic, carry: DecodeCarry) -> tuple[Decoded, DecodeCarry]:
        frames, carry = guarded_decode(self, x, static, carry)
        return Decoded(start=x.start, end=x.end, pixels=frames, latents=x.latents), carry


class FidelityDecode(LatentDecode):
    """The same latents by the 2x decoder: the path the SR stage blends the mouth toward."""

    name = "decode2x"
    input_type = Decoded
    output_type = Decoded

    def run(self, x: Decoded, *, static: ModelStatic, carry: DecodeCarry) -> tuple[Decoded, DecodeCarry]:
        frames, carry = guarded_decode(self, x, static, carry)
        return dataclasses.replace(x, fidelity=frames), carry
