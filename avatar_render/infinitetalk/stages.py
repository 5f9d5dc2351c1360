"""Init, context and decode stages of the diffusion backend (the A2V stage is in a2v.py)."""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from avatar_render.distributed.split_decode import RowSplit
from avatar_render.face.detect import FaceDetector, choose_face
from avatar_render.face.fit import fit_to_frame
from avatar_render.face.layout import fallback_layout
from avatar_render.infinitetalk.stage_io import (
    AudioWindow,
    DecodeCarry,
    LatentSegment,
    ModelStatic,
)
from avatar_render.infinitetalk.video_cond import VideoCondition, first_frame_condition, to_pixels
from avatar_render.models.audio_encoder import AudioEncoder
from avatar_render.models.grid import frames_in, latent_of, latents_for
from avatar_render.models.image_encoder import ImageEncoder
from avatar_render.models.text_encoder import TextEncoder
from avatar_render.models.vae import StreamingDecoder, WanVae
from avatar_render.pipeline.module import Module
from avatar_render.pipeline.stage import Stage
from avatar_render.pipeline.types import ChunkInput, Frames, RequestInput

# Audio the encoder sees beyond a chunk's model frames, on each side: wav2vec2's positional
# convolution spans about +-2.6 s, so less margin makes chunked features drift from whole-file ones.
AUDIO_MARGIN_S = 3.0


def to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """[1, 3, T, H, W] in [-1, 1] -> [T, H, W, 3] uint8, where the frames are."""
    return ((frames[0].permute(1, 2, 3, 0).clamp(-1, 1) + 1) * 127.5 + 0.5).to(torch.uint8)


def to_host(pixels: torch.Tensor) -> np.ndarray:
    """[T, H, W, 3] uint8 -> (T, H, W, 3) uint8 array.

    From a GPU the bytes land in pinned host memory, a fast copy without page faults; the array keeps
    its block, which PyTorch's pinned-memory cache hands out again once the writer is done with it.
    """
    return to_host_later(pixels)()


def to_host_later(pixels: torch.Tensor) -> Callable[[], np.ndarray]:
    """``to_host`` in two halves: the copy is queued now, and the returned call waits for it alone (not for
    the GPU work queued after it), so a host thread can take the frames while the GPU goes on."""
    if pixels.device.type != "cuda":
        host = pixels.cpu().numpy()
        return lambda: host
    out = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
    out.copy_(pixels, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(pixels.device))

    def wait() -> np.ndarray:
        done.synchronize()
        return out.numpy()

    return wait


class ModelInit(Stage[RequestInput, ModelStatic]):
    name = "init"
    input_type = RequestInput
    output_type = ModelStatic

    def __init__(self, *, vae: WanVae, text: TextEncoder, image: ImageEncoder, prompt: str, negative_prompt: str,
                 max_latents: int, face_box: list[int] | None = None, size: tuple[int, int] | None = None,
                 face_index: int | None = None) -> None:
        self.vae, self.text, self.image = vae, text, image
        self.face_box = face_box
        self.size = size  # (width, height) the model generates at; None = the request's (output) size
        self.prompt, self.negative_prompt = prompt, negative_prompt
        self.max_latents = max_latents  # the longest chunk, in latents
        self.detector = FaceDetector(index=face_index)

    def modules(self) -> tuple[Module, ...]:
        return (() if self.face_box else (self.detector,)) + (self.vae, self.text, self.image)

    def run(self, x: RequestInput, *, static: Any, carry: Any) -> tuple[ModelStatic, None]:
        layout, note = choose_face(x.reference, self.detector, self.face_box)
        focus = None if layout is None else (layout.face.x, layout.face.y, layout.face.w, layout.face.h)
        width, height = self.size or (x.width, x.height)
        image, fit = fit_to_frame(x.reference, width, height, focus=focus)
        pixels = to_pixels(image)  # [1, 3, 1, H, W]
        cond, clip = first_frame_condition(pixels, vae=self.vae, image=self.image, max_latents=self.max_latents)
        with torch.no_grad():
            text = self.text.encode(self.prompt).cpu()
            text_null = self.text.encode(self.negative_prompt).cpu()
        # They run once per request, and a pipeline serves one request: their memory is freed rather
        # than their weights copied to the host (11 GB of pinned memory for umT5-XXL, seconds to copy).
        # A video reference keeps the image encoder: every chunk is conditioned on its own source frame.
        for once in (self.text,) if x.video is not None else (self.text, self.image):
            once.release()
        video = None
        if x.video is not None:
            video = VideoCondition(video=x.video, reader=x.video.frames(), size=(width, height), focus=focus,
                                   max_latents=self.max_latents)
        latents = cond[:, 4:]
        flat = pixels[0, :, 0].reshape(3, -1)
        return ModelStatic(
            face_detected=layout is not None and layout.detected, face_note=note,
            cond=cond, ref_latent=latents[0, :, :1].clone(), clip_fea=clip, video=video,
            text=text, text_null=text_null, ref_mean=flat.mean(1), ref_std=flat.std(1),
            reference=image, layout=fallback_layout(width, height) if layout is None else layout.mapped(fit),
        ), None


def model_frames(x: ChunkInput, context_latents: int) -> tuple[int, int, int]:
    """(first video frame, video frames, latents) the model sees for this chunk, context included."""
    plan = x.plan
    if plan.kind == "I":
        n = latent_of(plan.end - 1) - latent_of(plan.start) + 1
        return plan.start, frames_in(n), n
    a, b = latents_for(plan.start, plan.end)
    m = 0 if plan.start == 0 else context_latents
    return plan.start - (frames_in(m) if m else 0), frames_in(m + b - a), m + b - a


# The chunk noise is made on the host (the same on every device and process) in a thread of its own:
# tens of milliseconds at 720p that would otherwise leave the GPU idle between stages.
_NOISE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chunk-noise")


def chunk_noise(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class AudioContext(Stage[ChunkInput, AudioWindow]):
    """Audio features for every frame the model sees in this chunk, and the chunk's noise."""

    name = "context"
    input_type = ChunkInput
    output_type = AudioWindow

    def __init__(self, *, audio: AudioEncoder, context_latents: int, latent_hw: tuple[int, int],
                 vae: Optional[WanVae] = None, image: Optional[ImageEncoder] = None) -> None:
        self.audio = audio
        self.vae, self.image = vae, image  # a video reference's chunks are conditioned on their source frames
        self.context_latents = context_latents
        self.latent_hw = latent_hw

    def modules(self) -> tuple[Module, ...]:
        return (self.audio,)

    def run(self, x: ChunkInput, *, static: Any, carry: Any) -> tuple[AudioWindow, None]:
        first, num_frames, num_latents = model_frames(x, self.context_latents)
        rate, fps = x.audio_rate, float(x.fps)
        # x.audio starts at plan.start/fps - pad; cut [first/fps - margin, (first + num_frames)/fps + margin)
        lo = round((x.audio_pad_s + (first - x.plan.start) / fps - AUDIO_MARGIN_S) * rate)
        hi = lo + round((num_frames / fps + 2 * AUDIO_MARGIN_S) * rate)
        window = np.zeros(hi - lo, np.float32)
        src = x.audio[max(lo, 0) : max(min(hi, len(x.audio)), 0)]
        window[max(-lo, 0) : max(-lo, 0) + len(src)] = src
        seed = (x.seed * 1_000_003 + 2 * x.plan.index + (x.plan.kind == "I")) % 2**63
        noise = _NOISE.submit(chunk_noise, seed, (16, num_latents, *self.latent_hw))  # while the encoder runs
        feats = self.audio.encode(window, num_frames=num_frames, pad_s=AUDIO_MARGIN_S, first_frame=first, fps=fps)
        cond = clip = None
        if self.vae is not None and self.image is not None and x.plan.start > 0 and static.video is not None:
            cond, clip = static.video.condition(x.plan.start, vae=self.vae, image=self.image)
        return AudioWindow(chunk=x, first_frame=first, features=feats[None], noise=noise.result(), cond=cond,
                           clip_fea=clip), None


def reference_lead(static: ModelStatic) -> LatentSegment:
    """Frame 0 of the published stream: N0's first latent is the reference's, pinned at every step, so
    its pixels are known before N0 is sampled (the pipeline's ``lead``)."""
    return LatentSegment(start=0, end=1, latents=static.ref_latent)


def side_stream(device: torch.device) -> Callable[[], AbstractContextManager]:
    """The decode jobs' context with ``run.overlap_decode``: on a GPU, a CUDA stream of their own, so the
    decode runs beside the next chunk's sampling; each job is ordered after the work queued before it
    was handed over (made in the loop's thread) and ends with its stream synchronised. On a CPU: nothing."""
    if torch.device(device).type != "cuda":
        return nullcontext
    stream = torch.cuda.Stream(device)

    def context() -> AbstractContextManager:
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(device))
        return _on(stream, ready)

    return context


@contextmanager
def _on(stream: "torch.cuda.Stream", ready: "torch.cuda.Event") -> Iterator[None]:
    stream.wait_event(ready)
    with torch.cuda.stream(stream):
        yield
    stream.synchronize()


class LatentDecode(Stage[LatentSegment, Frames]):
    """Causal VAE decode of the published latent stream, the decoder's cache carried across chunks."""

    name = "decode"
    input_type = LatentSegment
    output_type = Frames

    def __init__(self, *, vae: WanVae, colour_guard: float, split: Optional[RowSplit] = None,
                 writes: bool = True) -> None:
        self.vae = vae
        self.colour_guard = colour_guard
        self.split = split  # decode a strip of rows here, the other processes the rest (dist.split_decode)
        self.writes = writes  # False in the processes of a launch that do not write: no frames to the host

    def _decoder(self, height: int) -> StreamingDecoder:
        return StreamingDecoder(self.vae, rows=None if self.split is None else self.split.rows(height))

    def modules(self) -> tuple[Module, ...]:
        return (self.vae,)

    def init_carry(self, static: ModelStatic) -> DecodeCarry:
        empty = static.ref_latent.new_zeros(static.ref_latent.shape[0], 0, *static.ref_latent.shape[-2:])
        return DecodeCarry(cache=StreamingDecoder(self.vae).start(), recent=empty, decoded=0)

    def saved_carry(self, carry: DecodeCarry) -> DecodeCarry:
        return dataclasses.replace(carry, cache=None)  # rebuilt from ``recent`` on resume

    def restored_carry(self, saved: DecodeCarry, static: ModelStatic) -> DecodeCarry:
        return dataclasses.replace(
            saved, cache=self._decoder(saved.recent.shape[-2]).restore(saved.recent, saved.decoded))

    def run(self, x: LatentSegment, *, static: ModelStatic, carry: DecodeCarry) -> tuple[Frames, DecodeCarry]:
        height = x.latents.shape[-2]
        dec = self._decoder(height)
        frames, cache = dec.decode(x.latents[None], carry.cache)  # a strip of rows with a split decode
        frames = frames[:, :, : x.end - x.start]  # stays on the device for the colour work
        if self.colour_guard > 0:
            frames = anchor_colour(frames, static.ref_mean, static.ref_std, self.colour_guard,
                                   total=None if self.split is None else self.split.moments)
        pixels = to_uint8(frames)
        if self.split is not None:
            pixels = self.split.gather(pixels, height, self.vae.config.spatial_factor)
        # The processes that do not write pass on frames without rows (their count is what matters).
        out = to_host(pixels) if pixels is not None and self.writes else np.empty((frames.shape[2], 0, 0, 3), np.uint8)
        recent = torch.cat([carry.recent, x.latents.to(carry.recent)], dim=1)[:, -dec.window():]
        return Frames(start=x.start, frames=out), DecodeCarry(cache, recent, carry.decoded + x.latents.shape[1])


def anchor_colour(frames: torch.Tensor, mean: torch.Tensor, std: torch.Tensor, strength: float,
                  total: Optional[Callable[[torch.Tensor], torch.Tensor]] = None) -> torch.Tensor:
    """Pull each frame's per-channel mean and spread towards the reference's. frames: [1, 3, T, H, W],
    whole frames or a strip of rows whose sums ``total`` adds up over all strips."""
    flat = frames.flatten(3)
    f64 = torch.float64
    sums = torch.stack([flat.new_full(flat.shape[:-1], flat.shape[-1], dtype=f64), flat.sum(3, dtype=f64),
                        flat.square().sum(3, dtype=f64)])
    n, s1, s2 = sums if total is None else total(sums)  # each [1, 3, T]
    m = s1 / n
    s = ((s2 - s1 * m) / (n - 1).clamp_min(1)).clamp_min(0).sqrt().clamp_min(1e-4)
    m, s = m[..., None].to(flat), s[..., None].to(flat)
    target = (flat - m) / s * std.to(flat).view(1, 3, 1, 1) + mean.to(flat).view(1, 3, 1, 1)
    return (flat + strength * (target - flat)).view_as(frames).clamp(-1, 1)
