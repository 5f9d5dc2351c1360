"""Speed and memory benchmark: render speech of several durations, sizes and backends, each in its
own process so that peak memory is measured per render; collect the reports, write JSON and plots."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from avatar_render.errors import AvatarRenderError

DEFAULT_DURATIONS = (10.0, 60.0, 600.0)
DEFAULT_SIZES = ((256, 256), (512, 512))
DEFAULT_BACKENDS = ("preview",)


@dataclass(frozen=True)
class BenchCase:
    seconds: float
    width: int
    height: int
    backend: str = "preview"

    @property
    def name(self) -> str:
        return f"{self.seconds:g}s_{self.width}x{self.height}_{self.backend}"


def bench_matrix(durations=DEFAULT_DURATIONS, sizes=DEFAULT_SIZES, backends=DEFAULT_BACKENDS) -> list[BenchCase]:
    """Every combination, backends outermost, then sizes, then durations (short first)."""
    return [BenchCase(seconds=float(s), width=w, height=h, backend=b) for b in backends for (w, h) in sizes for s in sorted(durations)]


def loop_speech(source: Path, seconds: float, dest: Path) -> Path:
    """A WAV of exactly ``seconds`` made by repeating ``source`` (a 16-bit PCM WAV), written block by block."""
    with wave.open(str(source), "rb") as src:
        rate, channels, width = src.getframerate(), src.getnchannels(), src.getsampwidth()
        clip = src.readframes(src.getnframes())
    if width != 2 or not clip:
        raise AvatarRenderError(f"Benchmark speech '{source}' must be a non-empty 16-bit PCM WAV.")
    need = int(round(seconds * rate)) * channels * width
    with wave.open(str(dest), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        while need > 0:
            block = clip[: min(len(clip), need)]
            out.writeframes(block)
            need -= len(block)
    return dest


def run_case(case: BenchCase, *, reference: Path, speech: Path, workdir: Path, overrides: tuple[str, ...] = (),
             config: Path | None = None) -> dict:
    audio = loop_speech(speech, case.seconds, workdir / f"speech_{case.seconds:g}s.wav")
    out = workdir / f"render_{case.name}.mp4"
    report = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "avatar_render", "render", "--ref", str(reference), "--audio", str(audio),
           "-o", str(out), "--force", "--quiet", "--report", str(report), *(("-c", str(config)) if config else ()),
           f"backend={case.backend}", f"video.width={case.width}", f"video.height={case.height}", *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        why = (done.stderr.strip() or done.stdout.strip()).removeprefix("Error: ")
        raise AvatarRenderError(f"The {case.seconds:g} s {case.width}x{case.height} {case.backend} benchmark render failed: {why}")
    audio.unlink()
    out.unlink()
    return json.loads(report.read_text())


def run_bench(cases: list[BenchCase], *, reference: Path, speech: Path, out_dir: Path | None = None,
              overrides: tuple[str, ...] = (), on_result: Callable[[BenchCase, dict], None] | None = None,
              config: Path | None = None) -> list[dict]:
    """Render every case; one row per case. With ``out_dir``, each render's report stays in ``out_dir/reports``."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(out_dir) / "reports" if out_dir else Path(tmp)
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise AvatarRenderError(f"Cannot create the benchmark folder '{workdir}': {e.strerror or e}.") from None
        for case in cases:
            rep = run_case(case, reference=reference, speech=speech, workdir=workdir, overrides=overrides, config=config)
            row = summarize(rep, backend=case.backend)
            results.append(row)
            if on_result:
                on_result(case, row)
    return results


def summarize(rep: dict, *, backend: str) -> dict:
    """A benchmark row from a render report: its headline figures and its per-chunk series."""
    row = {k: rep[k] for k in ("duration_s", "frames", "fps", "width", "height", "inputs_s", "time_to_first_frame_s",
                                "first_frame_on_disk_s", "wall_s", "generated_fps", "realtime_factor", "peak_rss_mb", "stage_s")}
    row["peak_gpu_mb"] = rep.get("peak_gpu_mb")  # None without a GPU
    row["backend"] = backend
    chunks = rep["chunks"]  # the report's chunk records
    row["chunks"] = len(chunks)
    row.update(first_frame_figures(rep))
    t = np.array([c["t_s"] for c in chunks], np.float64)
    frames = np.array([c["end"] - c["start"] for c in chunks], np.float64)
    dt = np.diff(np.concatenate([[rep["inputs_s"]], t])) if len(t) else t
    rss = [c["rss_mb"] for c in chunks]
    row["rss_mb_first_chunk"], row["rss_mb_last_chunk"] = (float(rss[0]), float(rss[-1])) if rss else (0.0, 0.0)
    row["series"] = {
        "t_s": t.round(4).tolist(),
        "rss_mb": rss,
        "end_frame": [c["end"] for c in chunks],
        "fps": (frames / np.maximum(dt, 1e-6)).round(2).tolist(),
    }
    return row


def first_frame_figures(rep: dict) -> dict:
    """What the first frames waited for, from a report's chunk records: the weights' loading (``load_s``,
    None when the report does not time it apart), the DiT tokens processed before the first frame and,
    since that frame may need no sampling (the diffusion backend's first frame is the reference latent's),
    the wall seconds and DiT tokens before the first frame that did (None for a backend without a DiT)."""
    chunks = rep["chunks"]
    tokens = [c.get("work", {}).get("dit_tokens") for c in chunks]
    has_dit = any(t is not None for t in tokens)
    tokens = [t or 0 for t in tokens]
    sampled = next((i for i, t in enumerate(tokens) if t > 0), None)
    return {
        "load_s": rep.get("stage_s", {}).get("load"),
        "first_frame_tokens": tokens[0] if has_dit and chunks else None,
        "first_sampled_frame_s": None if sampled is None else round(chunks[sampled]["t_s"] - rep["inputs_s"], 4),
        "first_sampled_frame_tokens": None if sampled is None else tokens[sampled],
        "first_sampled_frame": None if sampled is None else chunks[sampled]["start"],
    }


def write_results(rows: list[dict], out_dir: Path, *, json_path: Path | None = None) -> list[Path]:
    """bench.json (or ``json_path``) and the plots, in ``out_dir``; returns the paths written."""
    from avatar_render.metrics.plots import plot_bench

    json_path = json_path or Path(out_dir) / "bench.json"
    try:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(rows, indent=1) + "\n")
    except OSError as e:
        raise AvatarRenderError(f"Cannot write the benchmark results to '{json_path}': {e.strerror or e}.") from None
    return [json_path, *plot_bench(rows, out_dir)]


def parse_matrix(durations: str, sizes: str, backends: str) -> list[BenchCase]:
    """The cases of comma-separated lists such as "10,60", "512x512,256x256" and "preview"."""
    try:
        secs = [float(d) for d in durations.split(",") if d.strip()]
        dims = [tuple(int(v) for v in s.lower().split("x")) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise AvatarRenderError("--durations takes numbers like 10,60 and --sizes takes sizes like 512x512,256x256.") from None
    names = [b.strip() for b in backends.split(",") if b.strip()]
    if not secs or any(s <= 0 for s in secs) or not dims or any(len(d) != 2 or min(d) <= 0 for d in dims):
        raise AvatarRenderError("--durations takes positive numbers like 10,60 and --sizes takes sizes like 512x512.")
    if not names:
        raise AvatarRenderError("--backends takes backend names like preview.")
    return bench_matrix(secs, dims, names)
