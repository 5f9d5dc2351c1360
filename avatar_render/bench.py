"""Speed and memory benchmark: render speech of several durations, sizes and backends, each in its
own process so that peak memory is measured per render; collect the reports, write JSON and plots."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from avatar_render.config import EVEN_SIDE, FILE_GOP_S, MAX_SIDE
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import os_reason, shown
from avatar_render.files.read import read_json, regular_file
from avatar_render.files.targets import Inputs, check_folder, check_target, signature
from avatar_render.files.write import (
    create_new,
    make_folder,
    remove,
    remove_empty_folder,
    replace_atomically,
    temp_folder,
)
from avatar_render.metrics.inspect import PLOT
from avatar_render.telemetry import REPORT

DEFAULT_DURATIONS = (10.0, 60.0, 600.0)
DEFAULT_SIZES = ((256, 256), (512, 512))
DEFAULT_BACKENDS = ("preview",)
MAX_SECONDS = 24 * 3600  # the longest audio a benchmark case renders (its WAV is written first)
BENCH = "bench"  # the kind of file bench.json is (files.targets.signature)
PLOTS = ("bench_memory.png", "bench_fps.png", "bench_stages.png")


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
    return [BenchCase(seconds=float(s), width=w, height=h, backend=b) for b in backends for (w, h) in sizes
            for s in sorted(durations)]


def speech_format(source: Path) -> tuple[int, int, int]:
    """Sample rate, channels and bytes per sample of the benchmark's speech, a non-empty 16-bit PCM WAV."""
    source = regular_file(source, what="benchmark speech", give="a 16-bit PCM WAV", empty_ok=False)
    try:
        with wave.open(str(source), "rb") as src:
            rate, channels, width, frames = src.getframerate(), src.getnchannels(), src.getsampwidth(), src.getnframes()
    except (wave.Error, EOFError, OSError):
        frames = width = 0
    if width != 2 or not frames:
        raise AvatarRenderError(f"The benchmark speech {shown(source)} must be a non-empty 16-bit PCM WAV.")
    return rate, channels, width


def loop_speech(source: Path, seconds: float, dest: Path) -> Path:
    """A WAV of exactly ``seconds`` made by repeating ``source`` (a 16-bit PCM WAV), written block by block."""
    rate, channels, width = speech_format(source)
    with wave.open(str(source), "rb") as src:
        clip = src.readframes(src.getnframes())
    need = int(round(seconds * rate)) * channels * width
    with create_new(dest) as f, wave.open(f, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        while need > 0:
            block = clip[: min(len(clip), need)]
            out.writeframes(block)
            need -= len(block)
    return dest


def run_case(case: BenchCase, *, reference: Path, speech: Path, workdir: Path, report: Path,
             overrides: tuple[str, ...] = (), config: Path | None = None, force: bool = False) -> dict:
    """Render ``case`` from speech looped to its length in ``workdir`` (a temporary folder of ours:
    the audio and the video are removed whatever happens); its report goes to ``report`` (replacing
    one that bench did not write only with ``force``). Returns the report, with ``encode_only``: the
    render's encoder timed alone on the frames of its file (``io.encode_rate``), just after the render."""
    audio = workdir / f"speech_{case.seconds:g}s.wav"
    out = workdir / f"render_{case.name}.mp4"
    try:
        loop_speech(speech, case.seconds, audio)
        cmd = [sys.executable, "-m", "avatar_render", "render", "--ref", str(reference), "--audio", str(audio),
               "-o", str(out), "--quiet", "--report", str(report), *(("--force",) if force else ()),
               *(("-c", str(config)) if config else ()),
               f"backend={case.backend}", f"video.width={case.width}", f"video.height={case.height}", *overrides]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip() or done.stdout.strip()).removeprefix("Error: ")
            raise AvatarRenderError(
                f"The {case.seconds:g} s {case.width}x{case.height} {case.backend} benchmark render failed: {why}")
        rep = read_json(report, what="benchmark report", give="a report of 'avatar-render render'")
        return {**rep, "encode_only": _encode_only(out, rep["config"])}
    finally:
        remove(audio)
        remove(out)


def _encode_only(video: Path, config: dict) -> dict:
    """The encoder alone on a render's frames, with the render's video settings (from its report), in a
    process of its own: a process started by this one counts this one's largest size as its own peak
    memory (it begins as a copy), and the decoded frames would make that the next render's peak."""
    v, chunk = config["video"], config["chunk"]
    args = dict(crf=v["crf"], preset=v["preset"], gop_seconds=v["gop_seconds"] or FILE_GOP_S,  # (a file's)
                chunk_frames=chunk["chunk_frames"])
    code = ("import json, sys, time; from avatar_render.io.encode_rate import encode_rate; "
            "r = encode_rate(sys.argv[1], **json.loads(sys.argv[2])); "
            "print(json.dumps([r.frames, r.seconds, r.cpu_seconds, r.frames_per_second, r.realtime_factor, "
            "time.process_time()]))")
    path = [str(Path(__file__).resolve().parents[1]), *filter(None, [os.environ.get("PYTHONPATH")])]  # (this code)
    done = subprocess.run([sys.executable, "-c", code, str(video), json.dumps(args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
    if done.returncode != 0:
        raise AvatarRenderError(f"The encoder alone could not be timed on {shown(video)}: "
                                f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else 'no reason given'}")
    frames, seconds, cpu, fps, factor, process_cpu = json.loads(done.stdout)
    return {"frames": frames, "seconds": round(seconds, 4), "fps": round(fps, 2), "realtime_factor": round(factor, 3),
            "cpu_s": round(cpu, 4), "process_cpu_s": round(process_cpu, 4)}  # (its process: the decoding too)


def check_bench(cases: list[BenchCase], *, reference: Path, speech: Path, out_dir: Path,
                json_path: Optional[Path], config: Path | None, force: bool) -> bool:
    """Everything a benchmark writes, checked before its first render: the folder, each case's report,
    bench.json and the plots (replaced only if bench wrote them, or with ``force``), and room for the
    longest case's audio in the temporary folder. Whether it made the folder (gone again if a check fails)."""
    made = check_folder(out_dir, what="benchmark folder", create=True)
    try:
        _check_bench(cases, reference=reference, speech=speech, out_dir=out_dir, json_path=json_path, config=config,
                     force=force)
    except BaseException:
        if made:
            remove_empty_folder(out_dir)
        raise
    return made


def _check_bench(cases: list[BenchCase], *, reference: Path, speech: Path, out_dir: Path,
                 json_path: Optional[Path], config: Path | None, force: bool) -> None:
    inputs = Inputs({"reference file": reference, "speech file": speech, "config file": config})
    reports = Path(out_dir) / "reports"
    for path in [Path(json_path or Path(out_dir) / "bench.json"), *(Path(out_dir) / name for name in PLOTS)]:
        kind = PLOT if path.suffix == ".png" and path.parent == Path(out_dir) else BENCH
        check_target(path, what="benchmark result", force=force, kind=kind, inputs=inputs)
    if reports.exists():
        check_folder(reports, what="reports folder", create=False)
        for case in cases:
            check_target(reports / report_name(case), what="benchmark report", force=force, kind=REPORT,
                         inputs=inputs)
    regular_file(reference, what="reference", give="an image or video file", empty_ok=False)
    rate, channels, width = speech_format(speech)
    longest = max(c.seconds for c in cases)
    need = math.ceil(longest * rate) * channels * width + (64 << 20)
    with temp_folder() as tmp:
        free = shutil.disk_usage(tmp).free
    if need > free:
        raise AvatarRenderError(f"The {longest:g} s case needs {need / 1e9:.1f} GB for its audio in the temporary "
                                f"folder, which has {free / 1e9:.1f} GB free; give shorter --durations or set TMPDIR.")


def report_name(case: BenchCase) -> str:
    return f"render_{case.name}.json"


def run_bench(cases: list[BenchCase], *, reference: Path, speech: Path, out_dir: Path,
              overrides: tuple[str, ...] = (), on_result: Callable[[BenchCase, dict], None] | None = None,
              config: Path | None = None, force: bool = False) -> list[dict]:
    """Render every case; one row per case. Each render's report stays in ``out_dir/reports``; its
    audio and video live in a temporary folder only while it runs."""
    results = []
    reports = Path(out_dir) / "reports"
    made = [folder for folder in (reports, Path(out_dir)) if not folder.exists()]
    try:
        make_folder(reports)
    except OSError as e:
        raise AvatarRenderError(f"Cannot create the benchmark folder {shown(reports)}: {os_reason(e)}.") from None
    try:
        with temp_folder("avatar-render-bench-") as workdir:
            for case in cases:
                rep = run_case(case, reference=reference, speech=speech, workdir=workdir,
                               report=reports / report_name(case), overrides=overrides, config=config, force=force)
                row = summarize(rep, backend=case.backend)
                results.append(row)
                if on_result:
                    on_result(case, row)
    except BaseException:
        for folder in made:
            remove_empty_folder(folder)
        raise
    return results


def summarize(rep: dict, *, backend: str) -> dict:
    """A benchmark row from a render report: its headline figures and its per-chunk series."""
    row = {k: rep[k] for k in ("duration_s", "frames", "fps", "width", "height", "inputs_s", "time_to_first_frame_s",
                                "first_frame_on_disk_s", "wall_s", "generated_fps", "realtime_factor", "peak_rss_mb",
                                "stage_s")}
    row["peak_gpu_mb"] = rep.get("peak_gpu_mb")  # None without a GPU
    # The encoder alone on the same frames, and the render's whole-job rate over it (1: as fast as its encode).
    encode = rep.get("encode_only")
    row["encode_realtime_factor"] = None if encode is None else encode["realtime_factor"]
    row["encode_ratio"] = (None if encode is None or not encode["realtime_factor"]
                           else round(rep["realtime_factor"] / encode["realtime_factor"], 3))
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
    """bench.json (or ``json_path``: ``{"written_by": ..., "rows": [...]}``) and the plots, in ``out_dir``;
    returns the paths written."""
    from avatar_render.metrics.plots import plot_bench

    json_path = Path(json_path or Path(out_dir) / "bench.json")
    text = json.dumps({"written_by": signature(BENCH), "rows": rows}, indent=1) + "\n"
    try:
        replace_atomically(json_path, text.encode())
    except OSError as e:
        raise AvatarRenderError(f"Cannot write the benchmark results to {shown(json_path)}: {os_reason(e)}.") from None
    return [json_path, *plot_bench(rows, out_dir)]


def parse_matrix(durations: str, sizes: str, backends: str) -> list[BenchCase]:
    """The cases of comma-separated lists such as "10,60", "512x512,256x256" and "preview"."""
    try:
        secs = [float(d) for d in durations.split(",") if d.strip()]
        dims = [tuple(int(v) for v in s.lower().split("x")) for s in sizes.split(",") if s.strip()]
    except ValueError:
        raise AvatarRenderError(
            "--durations takes numbers like 10,60 and --sizes takes sizes like 512x512,256x256.") from None
    names = [b.strip() for b in backends.split(",") if b.strip()]
    if not secs or not all(0 < s <= MAX_SECONDS for s in secs):  # (NaN fails every comparison)
        raise AvatarRenderError(f"--durations takes positive numbers of seconds up to {MAX_SECONDS} (24 hours), "
                                "like 10,60.")
    if not dims or any(len(d) != 2 or not all(16 <= v <= MAX_SIDE and v % 2 == 0 for v in d) for d in dims):
        raise AvatarRenderError(f"--sizes takes sizes like 512x512, each side {EVEN_SIDE} pixels (as a render's).")
    if not names:
        raise AvatarRenderError("--backends takes backend names like preview.")
    return bench_matrix(secs, dims, names)
