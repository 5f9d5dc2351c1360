"""Jobs per hour of `avatar-render batch` on this machine: COUNT jobs of SECONDS of speech each
(examples/talk.wav repeated, examples/face.png), rendered with --jobs 1, 2, ... at each size; prints a
Markdown table and writes OUT/bench_batch.json.

    python scripts/bench/bench_batch.py --count 8 --seconds 30 --jobs 1,2 --sizes 256x256,512x512
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from avatar_render.bench import loop_speech

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--sizes", default="256x256,512x512")
    ap.add_argument("--out", type=Path, default=Path("bench-batch"))
    args = ap.parse_args()
    src = args.out / "jobs"
    src.mkdir(parents=True, exist_ok=True)
    speech = loop_speech(ROOT / "examples" / "talk.wav", args.seconds, src / "speech.wav")
    for i in range(args.count):  # the same speech under several names: COUNT separate jobs
        shutil.copy(speech, src / f"job{i:02d}.wav")
        shutil.copy(ROOT / "examples" / "face.png", src / f"job{i:02d}.png")
    speech.unlink()
    rows = []
    load = os.getloadavg()[0]
    print(f"{args.count} jobs of {args.seconds:g} s each; {os.cpu_count()} CPUs; load average before: {load:.1f}")
    print("| size | --jobs | wall | jobs per hour | video minutes per hour | mean fps per job |")
    print("|-----:|-------:|-----:|--------------:|-----------------------:|-----------------:|")
    for size in args.sizes.split(","):
        w, h = size.lower().split("x")
        for jobs in map(int, args.jobs.split(",")):
            out = args.out / f"out-{size}-j{jobs}"
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.monotonic()
            done = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "avatar_render",
                    "batch",
                    str(src),
                    "--out",
                    str(out),
                    "--jobs",
                    str(jobs),
                    "--quiet",
                    f"video.width={w}",
                    f"video.height={h}",
                ],
                capture_output=True,
                text=True,
            )
            wall = time.monotonic() - t0
            if done.returncode != 0:
                sys.exit(f"the batch failed: {done.stderr}")
            summary = json.loads((out / "batch-summary.json").read_text())
            fps = sum(j["generated_fps"] for j in summary["jobs"]) / len(summary["jobs"])
            row = {
                "size": size,
                "jobs": jobs,
                "count": args.count,
                "seconds": args.seconds,
                "wall_s": round(wall, 2),
                "jobs_per_hour": round(args.count / wall * 3600),
                "mean_generated_fps": round(fps, 1),
            }
            rows.append(row)
            minutes = row["jobs_per_hour"] * args.seconds / 60
            print(f"| {size} | {jobs} | {wall:.1f} s | {row['jobs_per_hour']} | {minutes:.0f} | {fps:.0f} |",
                  flush=True)
            shutil.rmtree(out)
    (args.out / "bench_batch.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(f"load average after: {os.getloadavg()[0]:.1f}; wrote {args.out / 'bench_batch.json'}")


if __name__ == "__main__":
    main()
