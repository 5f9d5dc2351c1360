"""Stage switches of one render: per-stage times and the visible overhead of each switch.

The switch from stage A to stage B ends at B's first module forward (every nn.Module call is
watched) and is printed from two starts that bound the GPU's idle time between the stages: A's return
(a lower bound: whatever A did after its last kernel counts as A's time) and A's last module forward
(an upper bound: A's kernels outside modules, such as copying its outputs back, count as the switch).
The modules are placed as a render places them (``dist.offload`` decides; a render moves nothing
between stages). Run it in one process or under torchrun (process 0 prints):

    python scripts/bench/bench_dist.py -c configs/tiny.yaml
    torchrun --nproc-per-node 8 scripts/bench/bench_dist.py -c configs/infinitetalk-480p.yaml

On a CPU or with the tiny model the numbers show the mechanics, not representative speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]

from avatar_render.backends import backend  # noqa: E402
from avatar_render.config import load_config  # noqa: E402
from avatar_render.distributed.device_mesh import resolve_device  # noqa: E402
from avatar_render.distributed.launch import session  # noqa: E402
from avatar_render.job.setup import prepared  # noqa: E402
from avatar_render.pipeline.chain import StageChain  # noqa: E402
from avatar_render.telemetry import peak_rss_mb  # noqa: E402


class Timeline:
    """The first and last module forward and the end of each stage call, and the time spent switching.

    On a GPU the marks are CUDA events recorded on the compute stream (no synchronisation per
    module, which would slow the stages down), so they time the GPU's work; on a CPU they are
    wall-clock readings.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.stage: str | None = None
        self.first = self.last = None
        self.prev: tuple[str, object, object] | None = None  # (stage, its last module's mark, its end's mark)
        self.stage_s: dict[str, list[float]] = defaultdict(list)
        self.switch_s: dict[str, list[tuple[float, float]]] = defaultdict(list)  # (from A's end, from A's last module)

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def between(self, a, b) -> float:
        return a.elapsed_time(b) / 1000 if self.cuda else b - a

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def op_start(self, module, args) -> None:
        if self.stage is not None and self.first is None:
            self.first = self.mark()

    def op_end(self, module, args, output) -> None:
        if self.stage is not None:
            self.last = self.mark()

    def run(self, stage, x, static, carry):
        self.stage, self.first, self.last = stage.name, None, None
        start = time.perf_counter()
        out = stage.run(x, static=static, carry=carry)
        end = self.mark()
        self.sync()
        self.stage_s[stage.name].append(time.perf_counter() - start)
        if self.first is not None:
            if self.prev is not None:
                name, last, done = self.prev
                self.switch_s[f"{name} -> {stage.name}"].append((self.between(done, self.first),
                                                                 self.between(last, self.first)))
            self.prev = (stage.name, self.last, end)
        self.stage = None
        return out


class Timed:
    """A stage whose calls go through the timeline (same name, types and modules)."""

    def __init__(self, inner, timeline: Timeline) -> None:
        self.inner, self.timeline = inner, timeline
        self.name, self.input_type, self.output_type = inner.name, inner.input_type, inner.output_type

    def modules(self):
        return self.inner.modules()

    def init_carry(self, static):
        return self.inner.init_carry(static)

    def run(self, x, *, static, carry):
        return self.timeline.run(self.inner, x, static, carry)


def ms(values: list[float]) -> str:
    return f"{1000 * statistics.mean(values):9.2f} {1000 * max(values):9.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", type=Path, default=ROOT / "configs" / "tiny.yaml")
    ap.add_argument("--ref", type=Path, default=ROOT / "examples" / "face.png")
    ap.add_argument("--audio", type=Path, default=ROOT / "examples" / "talk.wav")
    ap.add_argument("--seconds", type=float, default=3.0, help="audio rendered (from its start)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()
    cfg = load_config(a.config, tuple(a.overrides))
    with session(sp=cfg.dist.sp, device=cfg.model.device) as mesh:
        # One process computes on model.device (a GPU when there is one); under torchrun on its mesh device.
        if mesh.distributed:
            device = mesh.device
        else:
            device = resolve_device(cfg.model.device) if backend(cfg.backend).weights else torch.device("cpu")
        tl = Timeline(device)
        with prepared(cfg, a.ref, a.audio, mesh) as job:  # the set-up of a render
            pipeline, static, audio = job.pipeline, job.static, job.audio
            decode = pipeline.decode  # a chain (decode, then SR) is timed stage by stage
            decode = (StageChain(tuple(Timed(s, tl) for s in decode.stages)) if isinstance(decode, StageChain)
                      else Timed(decode, tl))
            timed = dataclasses.replace(pipeline, generate=tuple(Timed(s, tl) for s in pipeline.generate),
                                        decode=decode)
            cuda = device.type == "cuda"
            if cuda:  # the chunk loop's own peak (the init stage's encoders are gone by now)
                torch.cuda.reset_peak_memory_stats(device)
            hooks = (torch.nn.modules.module.register_module_forward_pre_hook(tl.op_start),
                     torch.nn.modules.module.register_module_forward_hook(tl.op_end))
            limit = round(a.seconds * float(cfg.fps))
            t0 = time.perf_counter()
            frames, first = 0, None
            for item in timed.stream(static, audio, seed=cfg.seed):
                first = time.perf_counter() - t0 if first is None else first
                frames = item.end
                if frames >= limit:
                    break
            wall = time.perf_counter() - t0
            for h in hooks:
                h.remove()
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else peak_rss_mb() / 1024
        peaks = [peak]
        if mesh.distributed:
            peaks = [None] * mesh.world
            torch.distributed.all_gather_object(peaks, peak, group=mesh.control)
        if not mesh.is_writer:
            return
        kind = torch.cuda.get_device_name(device) if cuda else "CPU"
        print(f"devices: {mesh.world} x {kind} ({mesh.backend if mesh.distributed else 'single process'}, "
              f"sp={mesh.sp}); model: {cfg.model.size}; {frames} frames in {wall:.2f} s, first frame after "
              f"{first or 0.0:.2f} s")
        what = "GPU memory allocated in the chunk loop" if cuda else "resident memory"
        print(f"peak {what} per process (GiB): " + ", ".join(f"{p:.2f}" for p in peaks))
        if not cuda or cfg.model.size == "tiny":
            print("NOTE: CPU and/or tiny model: these timings show the mechanics and are NOT representative of GPU "
                  "speed.")
        print(f"\n{'stage':<22}{'calls':>6} {'mean ms':>9} {'max ms':>9}")
        for name, v in tl.stage_s.items():
            print(f"{name:<22}{len(v):>6} {ms(v)}")
        if "a2v" in tl.stage_s and backend(cfg.backend).weights:
            print(f"sampling step: {1000 * statistics.mean(tl.stage_s['a2v']) / cfg.model.steps:.1f} ms "
                  f"(a2v / {cfg.model.steps} steps); generated {frames / wall:.2f} fps over {wall:.1f} s")
        print(f"\n{'switch, from A:':<22}{'':>6} {'end':>19} {'last module':>19}")
        print(f"{'':<22}{'calls':>6} {'mean ms':>9} {'max ms':>9} {'mean ms':>9} {'max ms':>9}")
        for key, v in tl.switch_s.items():
            print(f"{key:<22}{len(v):>6} {ms([a for a, _ in v])} {ms([b for _, b in v])}")


if __name__ == "__main__":
    main()
