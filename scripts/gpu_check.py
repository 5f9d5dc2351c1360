"""Speed of the full-size diffusion backend on this machine's GPU, with random bf16 weights.

Speed does not depend on the weights' values, so no checkpoint is needed. For each resolution it
times one DiT forward pass at the chunk's token count, derives time per sampling step (passes per
step from the guidance settings), per chunk and generated frames per second, times the streaming
VAE decode of one chunk, and reports peak GPU memory. Prints a table and writes JSON.

    python scripts/gpu_check.py --out gpu_check.json            # 480p and 720p, InfiniteTalk + FlashTalk recipes
    python scripts/gpu_check.py --sizes 640x640 --repeats 5

Without a GPU it runs the tiny architecture on the CPU so the script itself can be checked; those
timings say nothing about GPU speed.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass

import torch

from avatar_render.infinitetalk.components import architectures
from avatar_render.infinitetalk.grid import frames_in
from avatar_render.models.dit import build_dit, materialize_random
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
    step_s: float
    chunk_s: float
    decode_s: float
    generated_fps: float
    realtime_factor: float
    peak_gib: float


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, repeats: int) -> float:
    fn()  # warm-up
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="640x640,960x960", help="WIDTHxHEIGHT list (480p and 720p pixel counts by default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    arch = architectures("14b" if gpu else "tiny")
    dtype = torch.bfloat16 if gpu else torch.float32
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")] if gpu else [(64, 64)]
    print(f"device: {torch.cuda.get_device_name(0) if gpu else 'CPU (tiny model: timings not representative)'}")
    t = time.perf_counter()
    dit = materialize_random(build_dit(arch.dit), device=device, dtype=dtype).eval().requires_grad_(False)
    print(f"DiT {sum(p.numel() for p in dit.parameters()) / 1e9:.2f} B parameters ready in {time.perf_counter() - t:.1f} s")
    vae = WanVae(arch.vae, device=device, dtype=dtype if gpu else torch.float32)
    vae.load()
    rows = []
    for name, (new_frames, context_frames, steps, sampler) in RECIPES.items():
        for w, h in sizes:
            m = 1 + (context_frames - 1) // 4
            n = m + new_frames // 4
            lat_h, lat_w = h // 8, w // 8
            frames = frames_in(n)
            x = torch.randn(1, 36, n, lat_h, lat_w, device=device, dtype=dtype)
            ctx = torch.randn(1, 64, arch.dit.text_dim, device=device, dtype=dtype)
            clip = torch.randn(1, 257, arch.dit.clip_dim, device=device, dtype=dtype)
            audio = torch.randn(1, frames, arch.dit.audio_window, arch.dit.audio_layers, arch.dit.audio_dim, device=device, dtype=dtype)
            t_in = torch.tensor([500.0], device=device)
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            with torch.no_grad():
                pass_s = timed(lambda: dit(x, t_in, ctx, clip, audio), device, args.repeats)
                z = torch.randn(1, 16, n - m, lat_h, lat_w, device=device)
                dec = StreamingDecoder(vae)
                cache = dec.decode(torch.randn(1, 16, 1, lat_h, lat_w, device=device), dec.start())[1]
                decode_s = timed(lambda: dec.decode(z, cache), device, 1)
            step_s = pass_s * len(passes(sampler))
            chunk_s = step_s * steps + decode_s
            fps = new_frames / chunk_s
            tokens = n * (lat_h // 2) * (lat_w // 2)
            peak = torch.cuda.max_memory_allocated() / 2**30 if gpu else 0.0
            rows.append(Row(name, f"{w}x{h}", tokens, pass_s, step_s, chunk_s, decode_s, fps, fps / 25.0, peak))
            r = rows[-1]
            print(f"{name:12s} {r.size:9s} tokens {tokens:6d} | pass {pass_s:.3f} s | step {step_s:.3f} s | "
                  f"chunk ({steps} steps + decode {decode_s:.2f} s) {chunk_s:.1f} s | {fps:.2f} fps = {r.realtime_factor:.3f}x real time | "
                  f"peak {peak:.1f} GiB")
    if args.out:
        with open(args.out, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)


if __name__ == "__main__":
    main()
