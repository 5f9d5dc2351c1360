"""CPU figures of the SR stage at the tiny size: the same speech rendered without SR at the generation
size and at the output size, and with each SR kind, each render in its own process on one thread.
Prints, per render, the median over chunks of each stage's milliseconds per frame, the peak resident
memory and what a checkpoint holds. The tiny models show the mechanics and the relative cost of the
stages on a CPU; they say nothing about GPU speed (scripts/gpu/gpu_check.sh has those).

    python scripts/figures/sr_cpu_figures.py --seconds 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNS = {  # name: (config, overrides)
    "no SR, 64x64": ("tiny.yaml", ()),
    "no SR, 128x128": ("tiny.yaml", ("video.width=128", "video.height=128")),
    "vae2x 64 -> 128": ("tiny-sr.yaml", ("model.sr=vae2x",)),
    "swiftvr 64 -> 128": ("tiny-sr.yaml", ()),
    "swiftvr + 2x fidelity": ("tiny-sr.yaml", ("model.sr_fidelity=vae2x",)),
}
STAGES = ("context", "a2v", "decode", "decode2x", "sr", "write")


def clip(seconds: float, dest: Path) -> Path:
    with wave.open(str(ROOT / "examples" / "talk.wav")) as src, wave.open(str(dest), "wb") as out:
        out.setparams(src.getparams())
        out.writeframes(src.readframes(int(seconds * src.getframerate())))
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds of examples/talk.wav rendered")
    a = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'render':<24}{'frames':>7}{'fps':>7}" + "".join(f"{s:>10}" for s in STAGES) + f"{'peak MB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        speech = clip(a.seconds, Path(tmp) / "speech.wav")
        for name, (config, overrides) in RUNS.items():
            report = Path(tmp) / "r.json"
            cmd = [sys.executable, "-m", "avatar_render", "render", "--ref", str(ROOT / "examples" / "face.png"),
                   "--audio", str(speech), "-o", str(Path(tmp) / "o.mp4"), "--force", "--quiet", "--report",
                   str(report),
                   "-c", str(ROOT / "configs" / config), *overrides]
            done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            if done.returncode:
                print(f"{name}: failed: {done.stderr.strip()[-500:]}")
                continue
            rep = json.loads(report.read_text())
            chunks = rep["chunks"]

            def per_frame(stage: str) -> str:
                values = [1000 * c["stage_s"][stage] / (c["end"] - c["start"]) for c in chunks
                          if stage in c.get("stage_s", {})]
                return f"{statistics.median(values):10.1f}" if values else f"{'-':>10}"

            print(f"{name:<24}{rep['frames']:>7}{rep['generated_fps']:>7.1f}" + "".join(per_frame(s) for s in STAGES)
                  + f"{rep['peak_rss_mb']:>9.0f}")
    print(f"load average after: {os.getloadavg()[0]:.1f}; stage columns: median over chunks of ms per frame")


if __name__ == "__main__":
    main()
