"""Cold start of the DiT: how fast its weights go from safetensors files to where they run.

Writes a checkpoint of random weights in the published Wan-native layout (an index and several
shards) for the full-size DiT cut to ``--layers`` blocks, then times reading it into the model built
on the meta device: one file after the other to the host (the loader before issue 19), side by side to
the host, and, with a GPU, side by side straight to the GPU against the host first and then the GPU.
The file cache is warm after the first read (the first row also pays the disk), so the rows compare
the reading and copying, not the disk.

    python scripts/bench/bench_load.py --layers 2 --dim 1024          # a small model, anywhere
    python scripts/bench/bench_load.py --layers 4 --out /tmp/dit       # 4 of the 14B model's 40 blocks (about 3 GB)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]

from avatar_render.models.checkpoints import INDEX_NAME, load_into, plan_sources  # noqa: E402
from avatar_render.models.dit import DiTConfig, build_dit, materialize_random  # noqa: E402


def write_checkpoint(config: DiTConfig, folder: Path, shards: int) -> int:
    """Random bf16 weights in ``shards`` files with an index; returns the bytes written."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # (random numbers are made much faster there)
    net = materialize_random(build_dit(config), device=device, dtype=torch.bfloat16)
    state = {k: v.contiguous().cpu() for k, v in net.state_dict().items()}
    del net
    names = list(state)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        part = {k: state[k] for k in names[i * per : (i + 1) * per]}
        if not part:
            continue
        file = f"diffusion_pytorch_model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(folder / file))
        weight_map.update({k: file for k in part})
        total += sum(t.numel() * t.element_size() for t in part.values())
    (folder / INDEX_NAME).write_text(json.dumps({"weight_map": weight_map}))
    return total


def timed_load(config: DiTConfig, folder: Path, *, device: str, workers: int, then: str | None = None) -> float:
    model = build_dit(config)
    sources = plan_sources(folder)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    load_into(model, sources, dtype=torch.bfloat16, device=device, workers=workers)
    if then is not None:
        model.to(then)
    if device.startswith("cuda") or (then or "").startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2, help="blocks of the DiT (the published model has 40)")
    ap.add_argument("--dim", type=int, default=0, help="model width (0: the published 5120, with its heads and FFN)")
    ap.add_argument("--shards", type=int, default=7, help="files of the checkpoint (the published 14B has 7)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for the checkpoint (default: a temporary one, removed)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    a = ap.parse_args()
    config = DiTConfig(num_layers=a.layers)
    if a.dim:
        config = dataclasses.replace(config, dim=a.dim, ffn_dim=a.dim * 27 // 10 // 16 * 16,
                                     num_heads=max(1, a.dim // 128))
    with tempfile.TemporaryDirectory(dir=a.out) as tmp:
        folder = Path(tmp)
        t = time.perf_counter()
        size = write_checkpoint(config, folder, a.shards)
        print(f"checkpoint: {size / 1e9:.2f} GB in {a.shards} shards ({config.num_layers} blocks of width "
              f"{config.dim}), written in {time.perf_counter() - t:.1f} s")
        rows = [("first read (disk): one file after the other, to the host", dict(device="cpu", workers=1)),
                ("one file after the other, to the host (before)", dict(device="cpu", workers=1)),
                ("side by side, to the host", dict(device="cpu", workers=8))]
        if torch.cuda.is_available():
            rows += [("one file after the other, host then GPU (before)", dict(device="cpu", workers=1, then="cuda")),
                     ("side by side, straight to the GPU (now)", dict(device="cuda", workers=8))]
        figures = []
        for what, kw in rows:
            s = timed_load(config, folder, **kw)
            figures.append({"what": what, "seconds": round(s, 3), "gb_per_s": round(size / 1e9 / s, 2)})
            print(f"{what:<58} {s:7.2f} s  {size / 1e9 / s:6.2f} GB/s")
        full = size * 40 / config.num_layers if not a.dim else None
        if full:
            gpu = [f for f in figures if "GPU" in f["what"]]  # where a GPU is, the weights must reach it
            best = min(f["seconds"] for f in (gpu or figures[1:]))
            where = "the GPU" if gpu else "the host"
            print(f"the 40-block DiT ({full / 1e9:.1f} GB) onto {where} at the best rate: about "
                  f"{best * full / size:.1f} s (warm file cache)")
    if a.json:
        a.json.write_text(json.dumps({"bytes": size, "layers": config.num_layers, "dim": config.dim, "rows": figures},
                                     indent=1) + "\n")


if __name__ == "__main__":
    main()
