"""SwiftVR over a stream that arrives in pieces of any length, each answered at once, in constant memory.

The model's own protocol: low-res frames are resized to the output size (bilinear), the ReAE encodes
each group of 4 frames into a latent (carrying its causal state), one DiT pass restores a chunk of
latents (placed in time by a RoPE offset; the previous chunk's last ``overlap`` latents go in front
as context and their outputs are dropped), and the decoder turns each latent into 4 frames, the very
first 3 being padding. So output frame ``i`` comes from latent ``(i + 3) // 4``, which needs input
frames up to ``4 ((i + 3) // 4) + 3``: up to 6 frames of look-ahead.

A piece of frames ``[a, b)`` must be answered with exactly those frames, before the next piece
exists. ``step`` therefore splits what it has into the whole groups, which it commits (the encoder
and decoder states advance over them, and they enter the DiT's time line), and a speculative tail:
the unfinished group and the groups the look-ahead reaches, filled with copies of the last frame as
SwiftVR itself pads the end of a video. The tail is encoded, restored and decoded from the committed
states, which are then left as they were; its raw frames are held and encoded again, for real, with
the next piece. The frames a piece publishes from the tail therefore saw a repeated frame instead
of their true successors (never more than 6 of them per piece); all others are what the model makes
of the true frames, as far as a DiT chunk is the piece (its attention spans one chunk).

State (``SwiftState``) is a few latents and frames at most: the held frames, the DiT context, and the
two halves' layer states. A checkpoint keeps instead the last committed low-res frames and restored
latents, from which ``restored`` rebuilds the layer states exactly (their memory reaches back a
bounded number of steps, ``encoder_reach`` / ``decoder_reach``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from avatar_render.errors import AvatarRenderError
from avatar_render.models.sr.geometry import Cover
from avatar_render.models.sr.reae import MemBlock, ReaeState, TGrow, TPool, decode, encode
from avatar_render.models.sr.swiftvr import ReaeModule, SwiftDiTModule

PAD_TO = 32  # the DiT sees pixels in multiples of 32 (16 for the ReAE, 2 for its patches)


@dataclass(frozen=True)
class SwiftState:
    encoder: Optional[ReaeState]  # None in a checkpoint (rebuilt from ``recent_frames``)
    decoder: Optional[ReaeState]  # None in a checkpoint (rebuilt from ``recent_latents``)
    held: torch.Tensor  # [r, h, w, 3] uint8: frames after the last whole group (r < 4), not yet committed
    recent_frames: torch.Tensor  # [R, h, w, 3] uint8: the last committed frames (R <= encoder window)
    recent_latents: torch.Tensor  # [Rd, C, hl, wl]: the last committed restored latents (decoder window)
    context: torch.Tensor  # [k, C, hl, wl]: the last committed low-quality latents (the DiT's context)
    latents: int  # latents committed: the RoPE position of the next one
    frames: int  # frames answered so far


def encoder_reach(net) -> int:
    """Input frames the encoder's state depends on, rounded up to whole groups: each MemBlock looks one
    step back at its frame rate, each TPool needs its group."""
    reach, rate = 0, 1
    for layer in net.encoder:
        if isinstance(layer, MemBlock):
            reach += rate
        elif isinstance(layer, TPool):
            reach += (layer.stride - 1) * rate
            rate *= layer.stride
    return math.ceil(reach / 4) * 4 + 4


def decoder_reach(net) -> int:
    """Latents the decoder's state depends on: each MemBlock looks one step back at its rate."""
    reach, rate = 0.0, 1
    for layer in net.decoder:
        if isinstance(layer, MemBlock):
            reach += 1 / rate
        elif isinstance(layer, TGrow):
            rate *= layer.stride
    return math.ceil(reach) + 1


class SwiftVRStream:
    """Restores low-res frames ``lowres`` (w, h) to ``out`` (W, H). Holds no stream state."""

    def __init__(self, reae: ReaeModule, dit: SwiftDiTModule, *, lowres: tuple[int, int], out: tuple[int, int],
                 overlap: int = 1, piece: int = 2) -> None:
        self.reae, self.dit = reae, dit
        self.cover = Cover(src=lowres, dst=out)
        self.lowres, self.out = lowres, out
        self.padded = tuple(math.ceil(s / PAD_TO) * PAD_TO for s in out)  # (W', H')
        self.overlap = overlap
        self.piece = piece  # latents the ReAE runs at a time (bounds its activations; exact either way)

    @property
    def _latent_shape(self) -> tuple[int, int, int]:
        f = self.reae.config.spatial_factor
        return self.reae.config.latent_channels, self.padded[1] // f, self.padded[0] // f

    def start(self) -> SwiftState:
        net = self.reae.model
        if self.reae.config.latent_channels != self.dit.config.channels:
            raise AvatarRenderError(f"The SwiftVR autoencoder makes {self.reae.config.latent_channels}-channel latents "
                                    f"and its DiT reads {self.dit.config.channels}: the two files are not from one "
                                    "model.")
        dev = self.reae.compute_device
        w, h = self.lowres
        frames = torch.zeros(0, h, w, 3, dtype=torch.uint8, device=dev)
        latents = torch.zeros(0, *self._latent_shape, device=dev, dtype=self.reae.dtype)
        return SwiftState(encoder=ReaeState.start(net.encoder), decoder=ReaeState.start(net.decoder), held=frames,
                          recent_frames=frames, recent_latents=latents, context=latents, latents=0, frames=0)

    def _pixels(self, frames: torch.Tensor) -> torch.Tensor:
        """[T, h, w, 3] uint8 -> [T, 3, H', W'] in [0, 1], resized to the output and padded as the model runs."""
        x = frames.permute(0, 3, 1, 2).to(self.reae.dtype) / 255.0
        x = self.cover.apply(x, mode="bilinear")
        return F.pad(x, (0, self.padded[0] - self.out[0], 0, self.padded[1] - self.out[1]))

    def _encode(self, frames: torch.Tensor, state: ReaeState) -> tuple[torch.Tensor, ReaeState]:
        out = []
        n = 4 * self.piece
        for a in range(0, frames.shape[0], n):
            z, state = encode(self.reae.model, self._pixels(frames[a : a + n]), state)
            out.append(z)
        return (torch.cat(out) if out
                else torch.zeros(0, *self._latent_shape, device=frames.device, dtype=self.reae.dtype)), state

    def _decode(self, latents: torch.Tensor, state: ReaeState) -> tuple[torch.Tensor, ReaeState]:
        out = []
        for a in range(0, latents.shape[0], self.piece):
            x, state = decode(self.reae.model, latents[a : a + self.piece].to(self.reae.dtype), state)
            out.append(x)
        W, H = self.padded
        return torch.cat(out) if out else torch.zeros(0, 3, H, W, device=latents.device), state

    def _restore(self, lq: torch.Tensor, t_offset: int) -> torch.Tensor:
        """One DiT pass over lq latents [n, C, h, w] -> restored latents [n, C, h, w]."""
        dit = self.dit.model
        dev = self.dit.compute_device
        x = lq.to(dev, self.dit.dtype).permute(1, 0, 2, 3)[None]  # [1, C, n, h, w]
        prompt = self.dit.prompt[None].to(dev)
        with torch.no_grad():
            velocity = dit(x, prompt, t_offset)
        return (x.float() - velocity)[0].permute(1, 0, 2, 3).to(lq.device, self.reae.dtype)

    @torch.no_grad()
    def step(self, frames: torch.Tensor, state: SwiftState) -> tuple[torch.Tensor, SwiftState]:
        """The next frames [T, h, w, 3] uint8 -> (the same frames restored [T, 3, H, W] in [0, 1], state)."""
        T = frames.shape[0]
        seq = torch.cat([state.held, frames.to(state.held.device)])
        whole = seq.shape[0] // 4 * 4
        end = state.frames + T  # one past the last frame to answer
        g0 = state.latents
        need = (end - 1 + 3) // 4 + 1  # latents that answer every frame up to end - 1
        z_c, encoder = self._encode(seq[:whole], state.encoder)  # committed
        spec = seq[whole:]
        extra = 4 * (need - (g0 + z_c.shape[0])) - spec.shape[0]
        spec = torch.cat([spec, seq[-1:].expand(extra, *seq.shape[1:])])  # the last frame repeated, as at a video's end
        z_s, _ = self._encode(spec, encoder)
        k = state.context.shape[0]
        restored = self._restore(torch.cat([state.context, z_c, z_s]), g0 - k)[k:]
        r_c, r_s = restored[: z_c.shape[0]], restored[z_c.shape[0] :]
        x_c, decoder = self._decode(r_c, state.decoder)
        x_s, _ = self._decode(r_s, decoder)
        decoded = torch.cat([x_c, x_s])  # decoded frames 4 g0 .. 4 need; output frame i is decoded frame i + trim
        trim = self.reae.model.config.trim
        first = state.frames + trim - 4 * g0
        out = decoded[first : first + T, :, : self.out[1], : self.out[0]]
        new = SwiftState(
            encoder=encoder, decoder=decoder, held=seq[whole:].clone(),
            recent_frames=torch.cat([state.recent_frames, seq[:whole]])[-encoder_reach(self.reae.model):].clone(),
            recent_latents=torch.cat([state.recent_latents, r_c])[-decoder_reach(self.reae.model):].clone(),
            context=torch.cat([state.context, z_c])[-self.overlap:].clone() if self.overlap else state.context[:0],
            latents=g0 + z_c.shape[0], frames=end,
        )
        return out.float(), new

    def saved(self, state: SwiftState) -> SwiftState:
        return dataclasses.replace(state, encoder=None, decoder=None)

    @torch.no_grad()
    def restored(self, saved: SwiftState) -> SwiftState:
        """The layer states again, from the committed frames and latents a checkpoint keeps."""
        net = self.reae.model
        enc, dec = ReaeState.start(net.encoder), ReaeState.start(net.decoder)
        if saved.recent_frames.shape[0]:
            _, enc = self._encode(saved.recent_frames.to(self.reae.compute_device), enc)
        if saved.recent_latents.shape[0]:
            _, dec = self._decode(saved.recent_latents.to(self.reae.compute_device), dec)
        return dataclasses.replace(saved, encoder=enc, decoder=dec)
