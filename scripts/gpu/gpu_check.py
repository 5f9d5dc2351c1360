"""Speed of the full-size diffusion backend on this machine's GPU, with random bf16 weights.

Speed does not depend on the weights' values, so no checkpoint is needed. For each resolution it
times one DiT forward pass at the chunk's token count, derives time per sampling step (passes per
step from the guidance settings), per chunk and generated frames per second, times the streaming
VAE decode of one chunk (float32, as the pipeline runs it, and bfloat16), counts the pass's FLOPs
to give the achieved TFLOP/s, and reports peak GPU memory; then times the same passes with the DiT's
blocks streamed from pinned host memory (its peak memory then holds two blocks, not forty). Prints a table and
writes JSON.

    python scripts/gpu/gpu_check.py --out gpu_check.json            # 480p and 720p, InfiniteTalk + FlashTalk recipes
    python scripts/gpu/gpu_check.py --sizes 640x640 --repeats 5
    python scripts/gpu/gpu_check.py --sr --out gpu_check_sr.json   # the SR stage (scripts/gpu/gpu_check_sr.py)

Without a GPU it runs the tiny architecture on the CPU so the script itself can be checked; those
timings say nothing about GPU speed.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from avatar_render.distributed.streaming import BlockStreamer
from avatar_render.infinitetalk.components import architectures
from avatar_render.models.dit import build_dit, materialize_random
from avatar_render.models.grid import frames_in
from avatar_render.models.sampler import SamplerConfig, passes
from avatar_render.models.vae import StreamingDecoder, WanVae

RECIPES = {  # name: (new frames per chunk, context frames, steps, sampler)
    "infinitetalk": (72, 9, 40, SamplerConfig(steps=40, text_scale=5.0, audio_scale=4.0)),
    "flashtalk": (28, 5, 4, SamplerConfig(steps=4, text_scale=1.0, audio_scale=1.0)),
}


@dataclass
class Row:
    recipe: str
    size: str
    tokens: int
    pass_s: float
    pass_tflops: float  # achieved: counted FLOPs of one pass / its time
    step_s: float
    chunk_s: float
    decode_s: float  # VAE decode of one chunk's new latents, in the dtype the pipeline uses (float32)
    decode_bf16_s: float
    generated_fps: float
    realtime_factor: float
    peak_gib: float
    streamed_pass_s: float = 0.0  # the DiT's blocks streamed from pinned host memory (dist.offload.dit=offloaded)
    streamed_peak_gib: float = 0.0
    compiled_pass_s: float = 0.0  # each block compiled (--compile; first size only)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int) -> float:
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t) / repeats


def counted(fn) -> float:
    """FLOPs of one call (matrix products and attention, as PyTorch's flop counter sees them); also the warm-up."""
    with FlopCounterMode(display=False) as fc:
        fn()
    return float(fc.get_total_flops())


def decode_seconds(vae: WanVae, latents: int, lat_h: int, lat_w: int, device: torch.device) -> float:
    """One streaming decode of ``latents`` latent frames (4 frames each), after a one-latent start."""
    dec = StreamingDecoder(vae)
    with torch.no_grad():
        cache = dec.decode(torch.randn(1, 16, 1, lat_h, lat_w, device=device), dec.start())[1]  # also the warm-up
        z = torch.randn(1, 16, latents, lat_h, lat_w, device=device)
        return timed(lambda: dec.decode(z, cache), device, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="640x640,960x960",
                    help="WIDTHxHEIGHT list (480p and 720p pixel counts by default)")
    ap.add_argument("--repeats", type=int, default=2, help="timed DiT passes after the warm-up")
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    ap.add_argument("--compile", action="store_true",
                    help="time the passes at the first size with each DiT block compiled (torch.compile) instead of "
                         "streamed")
    ap.add_argument("--sr", action="store_true",
                    help="time the SR stage instead (SwiftVR at 720p and 1080p output, the 2x decoder; "
                         "scripts/gpu/gpu_check_sr.py)")
    args = ap.parse_args()
    if args.sr:
        from gpu_check_sr import run_sr

        run_sr(out_json=args.out)
        return
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    arch = architectures("14b" if gpu else "tiny")
    dtype = torch.bfloat16 if gpu else torch.float32
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")] if gpu else [(64, 64)]
    print(f"device: {torch.cuda.get_device_name(0) if gpu else 'CPU (tiny model: timings not representative)'}; torch "
          f"{torch.__version__}")
    t = time.perf_counter()
    dit = materialize_random(build_dit(arch.dit), device=device, dtype=dtype).eval().requires_grad_(False)
    sync(device)
    print(f"DiT {sum(p.numel() for p in dit.parameters()) / 1e9:.2f} B parameters ready in "
          f"{time.perf_counter() - t:.1f} s")
    vae32 = WanVae(arch.vae, device=device, dtype=torch.float32)
    vae16 = WanVae(arch.vae, device=device, dtype=dtype)
    vae32.load()
    vae16.load()
    rows = []
    decode: dict[tuple[int, int], tuple[float, float]] = {}  # (w, h) -> seconds per latent (float32, bfloat16)
    for w, h in sizes:
        lat_h, lat_w = h // 8, w // 8
        n = 18  # one InfiniteTalk chunk's new latents (72 frames)
        decode[(w, h)] = tuple(decode_seconds(v, n, lat_h, lat_w, device) / n for v in (vae32, vae16))
        print(f"VAE decode {w}x{h}: {decode[(w, h)][0] * 1000 / 4:.1f} ms per frame float32, "
              f"{decode[(w, h)][1] * 1000 / 4:.1f} bfloat16")
    for name, (new_frames, context_frames, steps, sampler) in RECIPES.items():
        for w, h in sizes:
            m = 1 + (context_frames - 1) // 4
            n = m + new_frames // 4
            lat_h, lat_w = h // 8, w // 8
            frames = frames_in(n)
            x = torch.randn(1, 36, n, lat_h, lat_w, device=device, dtype=dtype)
            ctx = torch.randn(1, 512, arch.dit.text_dim, device=device, dtype=dtype)
            clip = torch.randn(1, 257, arch.dit.clip_dim, device=device, dtype=dtype)
            audio = torch.randn(1, frames, arch.dit.audio_window, arch.dit.audio_layers, arch.dit.audio_dim,
                                device=device, dtype=dtype)
            t_in = torch.tensor([500.0], device=device)
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                flops = counted(lambda: dit(x, t_in, ctx, clip, audio))
                pass_s = timed(lambda: dit(x, t_in, ctx, clip, audio), device, args.repeats)
            step_s = pass_s * len(passes(sampler))
            decode_s, decode16_s = (v * (n - m) for v in decode[(w, h)])
            chunk_s = step_s * steps + decode_s
            fps = new_frames / chunk_s
            tokens = n * (lat_h // 2) * (lat_w // 2)
            peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0
            rows.append(Row(name, f"{w}x{h}", tokens, pass_s, flops / pass_s / 1e12, step_s, chunk_s, decode_s,
                            decode16_s,
                            fps, fps / 25.0, peak))
            r = rows[-1]
            print(f"{name:12s} {r.size:9s} tokens {tokens:6d} | pass {pass_s:.3f} s ({r.pass_tflops:.0f} TFLOP/s) | "
                  f"step {step_s:.3f} s | chunk ({steps} steps + decode {decode_s:.2f} s) {chunk_s:.1f} s | "
                  f"{fps:.2f} fps = {r.realtime_factor:.3f}x real time | peak {peak:.1f} GiB")
    # The same passes with the blocks in pinned host memory, each copied to the GPU one block ahead.
    def pass_inputs(r: Row) -> tuple[torch.Tensor, torch.Tensor]:
        """Latents and audio features of one chunk of ``r``'s recipe and size."""
        new_frames, context_frames, _, _ = RECIPES[r.recipe]
        w, h = (int(v) for v in r.size.split("x"))
        n = 1 + (context_frames - 1) // 4 + new_frames // 4
        x = torch.randn(1, 36, n, h // 8, w // 8, device=device, dtype=dtype)
        dims = (arch.dit.audio_window, arch.dit.audio_layers, arch.dit.audio_dim)
        return x, torch.randn(1, frames_in(n), *dims, device=device, dtype=dtype)

    streamer = BlockStreamer(dit.blocks, device) if not args.compile else None  # (--compile: eager vs compiled only)
    for r in rows if streamer is not None else ():
        x, audio = pass_inputs(r)
        with torch.no_grad():
            dit(x, t_in, ctx, clip, audio)  # warm-up
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            r.streamed_pass_s = timed(lambda: dit(x, t_in, ctx, clip, audio), device, 1)
        r.streamed_peak_gib = torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0
        print(f"{r.recipe:12s} {r.size:9s} streamed blocks: pass {r.streamed_pass_s:.3f} s "
              f"({r.streamed_pass_s / r.pass_s:.2f}x resident) | peak {r.streamed_peak_gib:.1f} GiB (resident "
              f"{r.peak_gib:.1f})")
    if args.compile:  # each block its own compiled region: identical blocks share one compilation
        for block in dit.blocks:
            block.compile()
        for r in rows:
            if r.size != f"{sizes[0][0]}x{sizes[0][1]}":
                continue
            x, audio = pass_inputs(r)
            with torch.no_grad():
                t = time.perf_counter()
                dit(x, t_in, ctx, clip, audio)  # compiles
                sync(device)
                compile_s = time.perf_counter() - t
                r.compiled_pass_s = timed(lambda: dit(x, t_in, ctx, clip, audio), device, args.repeats)
            print(f"{r.recipe:12s} {r.size:9s} compiled blocks: pass {r.compiled_pass_s:.3f} s "
                  f"({r.compiled_pass_s / r.pass_s:.2f}x eager; compiling took {compile_s:.0f} s)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)


if __name__ == "__main__":
    main()
