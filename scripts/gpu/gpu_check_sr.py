"""Speed of the SR stage at full size with random weights (``scripts/gpu/gpu_check.py --sr`` runs it).

For each output size (720p and 1080p, generated at half the size as configs/flashtalk-sr*.yaml do)
it times, on one FlashTalk chunk (28 new frames), after a warm-up chunk:

* the one-step SwiftVR stream (``SwiftVRStream.step``: ReAE encode + one DiT pass + ReAE decode)
  and each of its parts, with the DiT resident and with its blocks streamed from pinned host memory
  (``dist.offload.sr=offloaded``);
* the face guard (tracking, colour match, mouth blend, identity check) on the same frames;
* the cheap path: the Wan2.1 2x decoder's streaming decode of the chunk's 7 latents.

and reports SR frames per second, real-time factor at 25 fps and peak GPU memory. Without a GPU the
tiny architectures run on the CPU so the script itself can be checked; those timings say nothing
about GPU speed.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from avatar_render.distributed.streaming import BlockStreamer
from avatar_render.face.layout import fallback_layout
from avatar_render.infinitetalk.sr_guard import FaceGuard, GuardSettings, TrackState
from avatar_render.models.sr.swiftvr import ReaeModule, SwiftDiTModule, config_for
from avatar_render.models.sr.swiftvr_stream import SwiftVRStream
from avatar_render.models.sr.vae2x import Upscale2xVae, vae2x_config
from avatar_render.models.vae import StreamingDecoder

CHUNK = 28  # new frames of a FlashTalk chunk
FULL_SIZES = ((640, 352, 1280, 720), (960, 528, 1920, 1080))  # generation (w, h) -> output (W, H)


@dataclass
class SRRow:
    output: str
    generated: str
    swiftvr_chunk_s: float  # SwiftVRStream.step over 28 frames
    encode_s: float
    dit_s: float
    decode_s: float
    swiftvr_fps: float
    swiftvr_peak_gib: float
    track_s: float  # face tracking on the host, overlapped with the SR's GPU work in the stage
    guard_s: float  # colour match, mouth blend, identity check after the SR
    streamed_chunk_s: float  # the SR DiT's blocks streamed from pinned host memory
    streamed_peak_gib: float
    vae2x_chunk_s: float  # the 2x decoder over the chunk's 7 latents
    vae2x_fps: float


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def peak(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def run_sr(*, out_json: str | None = None) -> list[SRRow]:
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    size = "14b" if gpu else "tiny"
    dtype = torch.bfloat16 if gpu else torch.float32
    sizes = FULL_SIZES if gpu else ((32, 32, 64, 64),)
    print(f"SR on {torch.cuda.get_device_name(0) if gpu else 'CPU (tiny models: timings not representative)'}")
    reae_cfg, dit_cfg = config_for(size)
    t = time.perf_counter()
    reae = ReaeModule(reae_cfg, device=device, dtype=dtype, seed=1)
    dit = SwiftDiTModule(dit_cfg, device=device, dtype=dtype, seed=2)
    vae2x = Upscale2xVae(vae2x_config(size), device=device, dtype=torch.float32, seed=3)  # model.vae_dtype default
    for m in (reae, dit, vae2x):
        m.load()
        m.prefetch()
    sync(device)
    print(f"SwiftVR DiT {sum(p.numel() for p in dit.net.parameters()) / 1e9:.2f} B, ReAE "
          f"{sum(p.numel() for p in reae.net.parameters()) / 1e6:.1f} M parameters ready in "
          f"{time.perf_counter() - t:.1f} s")
    rows = []
    g = torch.Generator().manual_seed(0)
    for gw, gh, w, h in sizes:
        stream = SwiftVRStream(reae, dit, lowres=(gw, gh), out=(w, h), overlap=1)
        frames = (torch.rand(2 * CHUNK + 1, gh, gw, 3, generator=g) * 255).to(torch.uint8).to(device)
        first, chunk = frames[: CHUNK + 1], frames[CHUNK + 1 :]  # N0 holds one frame more
        with torch.no_grad():
            _, state = stream.step(first, stream.start())  # warm-up (and a state mid-stream)
            reset_peak(device)
            holder = {}
            chunk_s = timed(lambda: holder.update(out=stream.step(chunk, state)), device)
            sr_peak = peak(device)
            pixels = chunk
            enc_s = timed(lambda: holder.update(z=stream._encode(pixels, state.encoder)), device)
            z = holder["z"][0]
            dit_s = timed(lambda: holder.update(r=stream._restore(torch.cat([state.context, z]), state.latents - 1)),
                          device)
            dec_s = timed(lambda: stream._decode(holder["r"][1:], state.decoder), device)
            sr = holder["out"][0].float()
            lowres = chunk.permute(0, 3, 1, 2).float() / 255
            guard = FaceGuard(reference=chunk[0].cpu().numpy(), layout=fallback_layout(gw, gh), cover=stream.cover,
                              settings=GuardSettings())
            up = stream.cover.apply(lowres, mode="bicubic").clamp(0, 1)
            host = chunk.cpu().numpy()
            track_s = timed(lambda: holder.update(track=guard.track(host, TrackState())), device)  # (beside the SR)
            guard_s = timed(lambda: guard.apply(sr, up, up, holder["track"][0]), device)
            # The cheap path: the 2x decoder over the chunk's latents.
            dec = StreamingDecoder(vae2x)
            latents = torch.randn(1, 16, CHUNK // 4, gh // 8, gw // 8, device=device)
            cache = dec.decode(torch.randn(1, 16, 1, gh // 8, gw // 8, device=device), dec.start())[1]
            vae2x_s = timed(lambda: dec.decode(latents, cache), device)
            # The SR DiT's blocks streamed from pinned host memory, one block ahead.
            streamer = BlockStreamer(dit.net.blocks, device, ahead=1)
            streamer.prefetch()
            reset_peak(device)
            streamed_s = timed(lambda: stream.step(chunk, state), device)
            streamed_peak = peak(device)
            streamer.remove()
        row = SRRow(output=f"{w}x{h}", generated=f"{gw}x{gh}", swiftvr_chunk_s=chunk_s, encode_s=enc_s, dit_s=dit_s,
                    decode_s=dec_s, swiftvr_fps=CHUNK / chunk_s, swiftvr_peak_gib=sr_peak, track_s=track_s,
                    guard_s=guard_s,
                    streamed_chunk_s=streamed_s, streamed_peak_gib=streamed_peak, vae2x_chunk_s=vae2x_s,
                    vae2x_fps=CHUNK / vae2x_s)
        rows.append(row)
        print(f"SR {row.generated} -> {row.output}: SwiftVR chunk {chunk_s:.3f} s (encode {enc_s:.3f}, "
              f"DiT {dit_s:.3f}, decode {dec_s:.3f}) = {row.swiftvr_fps:.1f} fps ({row.swiftvr_fps / 25:.2f}x real "
              f"time), peak {sr_peak:.1f} GiB | tracking {track_s:.3f} s (beside the SR), guard {guard_s:.3f} s | "
              f"DiT streamed: chunk {streamed_s:.3f} s, peak {streamed_peak:.1f} GiB | "
              f"2x decode {vae2x_s:.3f} s = {row.vae2x_fps:.1f} fps")
    if out_json:
        import json

        with open(out_json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
    return rows


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    run_sr()
