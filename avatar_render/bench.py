"""Speed and memory benchmark: render speech of several durations, each in its own process so
that peak memory is measured per render, and collect the reports."""

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


@dataclass(frozen=True)
class BenchCase:
    seconds: float
    width: int
    height: int


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


def run_case(case: BenchCase, *, reference: Path, speech: Path, workdir: Path, overrides: tuple[str, ...] = ()) -> dict:
    audio = loop_speech(speech, case.seconds, workdir / f"speech_{case.seconds:g}s.wav")
    out = workdir / f"render_{case.seconds:g}s_{case.width}x{case.height}.mp4"
    report = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "avatar_render", "render", "--ref", str(reference), "--audio", str(audio),
           "-o", str(out), "--force", "--quiet", "--report", str(report),
           f"video.width={case.width}", f"video.height={case.height}", *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise AvatarRenderError(f"The {case.seconds:g} s benchmark render failed: {done.stderr.strip() or done.stdout.strip()}")
    audio.unlink()
    out.unlink()
    return json.loads(report.read_text())


def run_bench(cases: list[BenchCase], *, reference: Path, speech: Path, out_dir: Path | None = None,
              overrides: tuple[str, ...] = (), on_result: Callable[[BenchCase, dict], None] | None = None) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(out_dir) if out_dir else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        for case in cases:
            rep = run_case(case, reference=reference, speech=speech, workdir=workdir, overrides=overrides)
            rss = np.array([c["rss_mb"] for c in rep.get("chunks", [])] or [0.0])
            row = {k: rep[k] for k in ("duration_s", "frames", "width", "height", "chunks", "inputs_s", "time_to_first_frame_s",
                                        "first_frame_on_disk_s", "wall_s", "generated_fps", "realtime_factor", "peak_rss_mb", "stage_s")}
            row["rss_mb_first_chunk"], row["rss_mb_last_chunk"] = float(rss[0]), float(rss[-1])
            results.append(row)
            if on_result:
                on_result(case, row)
    return results
