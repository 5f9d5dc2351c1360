"""Each per-GPU throughput lever of the A2V DiT, before and after, and the warm time to first frame.

With random full-size bf16 weights (speed does not depend on their values) on this machine's GPU:

1. One DiT pass at the FlashTalk chunk shapes (the short first chunk: 2 latents; a later chunk: 9
   latents) at 640x640 and 768x448: eager with PyTorch's own SDPA choice (the baseline), then each
   lever on its own: the cross-attention keys and values cached (``model.cache_kv``), each SDPA backend
   (``model.attention``), the blocks compiled (``model.compile=blocks``), float8 matmuls (``model.fp8``,
   needs torchao), the pass replayed as a CUDA graph (``model.cuda_graphs``), and all that help together.
   For each: seconds per pass, achieved TFLOP/s (FLOPs counted by PyTorch's flop counter) and MFU
   against the GPU's dense bf16 peak, and the generated fps it gives a 4-step, 1-pass chunk of 28 frames
   (plus the VAE decode of those frames, timed here too).
2. The warm time to first frame: the FlashTalk pipeline (configs/flashtalk.yaml, its short first
   chunk) built once, then one request's chunk loop run twice in the same process: the time to its first
   published frame (the reference latent's), to its first sampled frames, and the DiT tokens before each;
   with ``run.overlap_decode`` off and on, the generated fps over a few chunks.

    python scripts/gpu/gpu_levers.py --json docs/gpu_levers_h200.json
    python scripts/gpu/gpu_levers.py --only attention,cache_kv --sizes 640x640
    python scripts/gpu/gpu_levers.py --pipeline-only --chunks 3    # part 2 alone

Without a GPU it runs the tiny architecture on the CPU (the GPU-only levers are left out), so the
script itself can be checked; those timings say nothing about GPU speed. fp8 needs torchao
(``pip install torchao``; on a machine without the internet: ``pip download torchao -d wheels/`` beside,
then ``pip install --no-deps wheels/torchao-*.whl`` there).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]

from avatar_render.infinitetalk.components import architectures  # noqa: E402
from avatar_render.models.dit import build_dit, materialize_random  # noqa: E402
from avatar_render.models.dit_speed import DiTSpeed, GraphedCalls, apply_speed, attention_context  # noqa: E402
from avatar_render.models.grid import frames_in  # noqa: E402
from avatar_render.models.vae import StreamingDecoder, WanVae  # noqa: E402

# Dense bf16 peak FLOP/s by GPU name (the vendor's figures without sparsity); MFU is against these.
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "H800": 989e12, "A100": 312e12, "L40S": 362e12, "B200": 2250e12}
LEVERS = ("baseline", "cache_kv", "flash", "efficient", "cudnn", "math", "compile", "fp8", "cuda_graphs", "best")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t) / repeats


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16.items() if k in name), None)


def analytic_flops(c, tokens: int, frames: int, text: int = 512, image: int = 257) -> float:
    """Matmul and attention FLOPs of one pass by hand (2 per multiply-add): per block the self-attention
    projections and scores, the cross-attention query/output (keys and values of text and image too unless
    cached), the audio cross-attention, the FFN; patch embedding and head left out (under 1 %)."""
    d, f = c.dim, c.ffn_dim
    per_block = (2 * tokens * 4 * d * d + 4 * tokens * tokens * d  # self-attention: q k v o, QK^T and AV
                 + 2 * tokens * 2 * d * d + 4 * tokens * (text + image) * d  # cross-attention: q o, scores
                 + 2 * (text + image) * 2 * d * d  # its keys and values (0 with cache_kv)
                 + 2 * tokens * 2 * d * d + 4 * tokens * c.audio_context_tokens * d  # audio: q proj, scores
                 + 2 * tokens * 2 * d * f)  # FFN
    return c.num_layers * per_block


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="640x640,768x448")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=",".join(LEVERS), help="levers to time, comma-separated: " + ", ".join(LEVERS))
    ap.add_argument("--no-pipeline", action="store_true",
                    help="leave out part 2 (the warm first frame and the overlapped decode)")
    ap.add_argument("--pipeline-only", action="store_true", help="part 2 alone")
    ap.add_argument("--chunks", type=int, default=3,
                    help="part 2: each request runs until CHUNKS x chunk.chunk_frames frames are out")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if a.pipeline_only:
        figures = {"device": torch.cuda.get_device_name(0) if gpu else "cpu",
                   "pipeline": pipeline_figures(device, a.chunks)}
        if a.json:
            a.json.write_text(json.dumps(figures, indent=1) + "\n")
        return
    arch = architectures("14b" if gpu else "tiny")
    c = arch.dit
    dtype = torch.bfloat16 if gpu else torch.float32
    sizes = [tuple(int(v) for v in s.split("x")) for s in a.sizes.split(",")] if gpu else [(64, 64)]
    only = set(a.only.split(","))
    if not gpu:
        only -= {"efficient", "cudnn", "fp8", "cuda_graphs"}
    peak = peak_flops(device)
    print(f"device: {torch.cuda.get_device_name(0) if gpu else 'CPU (tiny model: timings not representative)'}; torch "
          f"{torch.__version__}; dense bf16 peak {'unknown' if peak is None else f'{peak / 1e12:.0f} TFLOP/s'}")
    t = time.perf_counter()
    dit = materialize_random(build_dit(c), device=device, dtype=dtype).eval().requires_grad_(False)
    sync(device)
    print(f"DiT {sum(p.numel() for p in dit.parameters()) / 1e9:.2f} B parameters ready in "
          f"{time.perf_counter() - t:.1f} s")
    vae = WanVae(arch.vae, device=device, dtype=torch.float32)
    vae.load()
    figures: dict = {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "peak_bf16_flops": peak, "passes": [],
                     "decode": {}}
    text = torch.randn(1, 512, c.text_dim, device=device, dtype=dtype)
    clip = torch.randn(1, 257, c.clip_dim, device=device, dtype=dtype)
    t_in = torch.tensor([500.0], device=device)

    def inputs(n: int, w: int, h: int):
        x = torch.randn(1, 36, n, h // 8, w // 8, device=device, dtype=dtype)
        audio = torch.randn(1, frames_in(n), c.audio_window, c.audio_layers, c.audio_dim, device=device, dtype=dtype)
        return x, audio

    for w, h in sizes:  # the VAE decode of a chunk's 7 new latents (28 frames), float32 as the pipeline runs it
        dec = StreamingDecoder(vae)
        with torch.no_grad():
            cache = dec.decode(torch.randn(1, 16, 1, h // 8, w // 8, device=device), dec.start())[1]
            z = torch.randn(1, 16, 7, h // 8, w // 8, device=device)
            figures["decode"][f"{w}x{h}"] = timed(lambda: dec.decode(z, cache), device, 1)

    def save() -> None:  # after every figure: a part cut short by its time limit keeps what it measured
        if a.json:
            a.json.write_text(json.dumps(figures, indent=1) + "\n")

    def run_lever(name: str, net, speed: DiTSpeed, n: int, w: int, h: int, graphs: bool = False) -> dict:
        x, audio = inputs(n, w, h)
        ctx = attention_context(speed.attention)
        with torch.no_grad(), ctx():
            _, kv = net(x, t_in, text, clip, audio, keep_kv=True)
            if speed.cache_kv:
                call = lambda: net(x, t_in, None, None, audio, cross_kv=kv)  # noqa: E731
            else:
                call = lambda: net(x, t_in, text, clip, audio)  # noqa: E731
            if graphs:
                g = GraphedCalls(lambda x, a, k: net(x, t_in, None, None, a, cross_kv=k) if speed.cache_kv
                                 else net(x, t_in, text, clip, a))
                call = lambda: g(x, audio, kv if speed.cache_kv else None)  # noqa: E731
            t0 = time.perf_counter()
            call()  # the first call compiles or captures
            sync(device)
            first_s = time.perf_counter() - t0
            with FlopCounterMode(display=False) as fc:
                net(x, t_in, None, None, audio, cross_kv=kv) if speed.cache_kv else net(x, t_in, text, clip, audio)
            seconds = timed(call, device, a.repeats)
        tokens = n * (h // 16) * (w // 16)
        flops = float(fc.get_total_flops())
        row = {"lever": name, "size": f"{w}x{h}", "latents": n, "tokens": tokens, "pass_s": round(seconds, 4),
               "first_call_s": round(first_s, 2), "tflops": round(flops / seconds / 1e12, 1),
               "analytic_tflop_per_pass": round(analytic_flops(c, tokens, frames_in(n)) / 1e12, 2),
               "counted_tflop_per_pass": round(flops / 1e12, 2),
               "mfu": None if peak is None else round(flops / seconds / peak, 3)}
        if n == 9:  # a later FlashTalk chunk: 4 steps of one pass, then the decode of its 28 new frames
            row["generated_fps"] = round(28 / (4 * seconds + figures["decode"][f"{w}x{h}"]), 2)
        figures["passes"].append(row)
        save()
        mfu = "" if row["mfu"] is None else f" MFU {row['mfu']:.2f}"
        fps = f" -> {row['generated_fps']:.2f} fps" if "generated_fps" in row else ""
        print(f"{name:<12} {row['size']:<8} {n} latents {tokens:6d} tokens: pass {seconds * 1000:8.1f} ms "
              f"({row['tflops']:.0f} TFLOP/s{mfu}; counted {row['counted_tflop_per_pass']:.2f} TFLOP, by hand "
              f"{row['analytic_tflop_per_pass']:.2f}; first call {first_s:.1f} s){fps}")
        return row

    base = DiTSpeed(cache_kv=False)
    plain = {"baseline": base, "cache_kv": replace(base, cache_kv=True)}
    plain.update({b: replace(base, attention=b) for b in ("flash", "efficient", "cudnn", "math")})
    shapes = [(n, w, h) for w, h in sizes for n in (2, 9)]
    for name, speed in plain.items():
        if name not in only:
            continue
        for n, w, h in shapes:
            try:
                run_lever(name, dit, speed, n, w, h)
            except RuntimeError as e:  # a backend that does not take these shapes or this GPU
                print(f"{name:<12} {w}x{h} {n} latents: not available ({str(e).splitlines()[0][:120]})")
    if "cuda_graphs" in only:
        for n, w, h in shapes:
            run_lever("cuda_graphs", dit, replace(base, cache_kv=True), n, w, h, graphs=True)
    best_attention = min((r for r in figures["passes"] if r["lever"] in ("baseline", "flash", "efficient", "cudnn")
                          and r["latents"] == 9),
                         key=lambda r: r["pass_s"], default={"lever": "baseline"})["lever"]
    for name in ("fp8", "compile", "best"):  # fp8 first: it needs no compilation, the two others do
        if name not in only:
            continue
        if name == "fp8":
            try:
                import torchao  # noqa: F401
            except ImportError:
                print("fp8: torchao is not installed here (pip install torchao): left out")
                continue
        speed = DiTSpeed(compile="blocks" if name in ("compile", "best") else "none",
                         fp8=name == "fp8" or (name == "best" and "fp8" in only),
                         attention="auto" if best_attention == "baseline" else best_attention, cache_kv=name == "best")
        if speed.fp8:
            try:
                import torchao  # noqa: F401
            except ImportError:
                speed = replace(speed, fp8=False)
        net = materialize_random(build_dit(c), device=device, dtype=dtype).eval().requires_grad_(False)
        del dit  # one full-size DiT on the GPU at a time
        if gpu:
            torch.cuda.empty_cache()
        apply_speed(net, speed)
        # Compiling costs a compilation per new shape: the compiled rows keep to the first size's later-chunk
        # shape, the one the fps figure is about.
        for n, w, h in shapes if name == "fp8" else [s_ for s_ in shapes[:2] if s_[0] == 9]:
            run_lever(name, net, speed, n, w, h)
        dit = net
    figures["best_attention"] = best_attention
    del dit
    if gpu:
        torch.cuda.empty_cache()
    if not a.no_pipeline:
        figures["pipeline"] = pipeline_figures(device, a.chunks)
    save()
    if a.json:
        print(f"wrote {a.json}")


def pipeline_figures(device: torch.device, chunks: int) -> dict:
    """The warm first frame and the overlapped decode, through the backend's own pipeline."""
    from avatar_render.config import load_config
    from avatar_render.distributed.launch import session
    from avatar_render.io.audio import AudioReader
    from avatar_render.job.setup import prepared
    from avatar_render.telemetry import Telemetry

    gpu = device.type == "cuda"
    config = ROOT / "configs" / ("flashtalk.yaml" if gpu else "tiny.yaml")
    speech = ROOT / "examples" / "talk.wav"
    out = {}
    for overlap in (False, True):
        overrides = ("face.box=[178,69,92,92]", f"run.overlap_decode={str(overlap).lower()}",
                     *(() if gpu else ("chunk.first_frames=4",)))
        cfg = load_config(config, overrides)
        with session(sp=1, device=cfg.model.device) as mesh:
            t = time.perf_counter()
            with prepared(cfg, ROOT / "examples" / "face.png", speech, mesh) as job:
                setup_s = time.perf_counter() - t
                runs = []
                for _ in range(2):  # the same request twice: cold (first kernels, allocator), then warm
                    with AudioReader(speech, fps=cfg.fps, model_rate=job.pipeline.audio_rate) as reader:
                        telemetry = Telemetry(keep_records=False)
                        t0 = time.perf_counter()
                        first = sampled = None
                        frames = 0
                        ends: list[tuple[float, int]] = []  # (seconds, frames published) at each new chunk's frames
                        for item in job.pipeline.stream(job.static, reader, seed=cfg.seed):
                            now = time.perf_counter() - t0
                            tokens = telemetry.work().get("dit_tokens", 0)
                            first = first or (now, tokens)
                            if sampled is None and tokens:
                                sampled = (now, tokens)
                            if tokens and item.end > frames:
                                ends.append((now, item.end))
                            frames = item.end
                            if frames >= chunks * cfg.chunk.chunk_frames:
                                break
                        wall = time.perf_counter() - t0
                    # The steady rate: from the second sampled publication on. With run.overlap_decode a chunk's
                    # frames come out during the next chunk's sampling, so frames / wall over a few chunks
                    # would charge it one more chunk's sampling than the plain loop.
                    (t_a, f_a), (t_b, f_b) = ends[min(1, len(ends) - 1)], ends[-1]
                    steady = (f_b - f_a) / (t_b - t_a) if t_b > t_a else None
                    peak = torch.cuda.max_memory_allocated(device) / 2**30 if gpu else None
                    runs.append({"first_frame_s": round(first[0], 4), "first_frame_tokens": first[1],
                                 "peak_gpu_gib": None if peak is None else round(peak, 1),
                                 "first_sampled_s": round(sampled[0], 4), "first_sampled_tokens": sampled[1],
                                 "frames": frames, "generated_fps": round(frames / wall, 2),
                                 "steady_fps": None if steady is None else round(steady, 2)})
        key = "overlap_decode" if overlap else "plain"
        out[key] = {"setup_s": round(setup_s, 2), "cold": runs[0], "warm": runs[1]}
        r = runs[1]
        print(f"pipeline ({key}): set-up {setup_s:.1f} s; warm: first frame {r['first_frame_s'] * 1000:.0f} ms "
              f"[{r['first_frame_tokens']} DiT tokens], first sampled frames {r['first_sampled_s'] * 1000:.0f} ms "
              f"[{r['first_sampled_tokens']} tokens]; {r['generated_fps']:.2f} fps over {r['frames']} frames, "
              f"steady {r['steady_fps']} fps "
              f"(cold: first frame {runs[0]['first_frame_s'] * 1000:.0f} ms, {runs[0]['generated_fps']:.2f} fps)")
    return out


if __name__ == "__main__":
    main()
