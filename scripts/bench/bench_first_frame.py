"""Time to first frame of the diffusion backend, in wall seconds and in DiT tokens processed before it,
for the first chunk as long as the others (``chunk.first_frames=0``: the plan before issue 19) and
short; and the seam after the short first chunk against the other seams (``avatar-render inspect``'s
seam measurement, boundary by boundary).

    python scripts/bench/bench_first_frame.py                       # the tiny backend on the CPU (configs/tiny.yaml)
    python scripts/bench/bench_first_frame.py -c configs/flashtalk.yaml --seconds 4 'face.box=[178,69,92,92]'
    python scripts/bench/bench_first_frame.py --json docs/first_frame_cpu.json

Tokens do not depend on the machine: a chunk's tokens are its latents times the patches of a latent
frame, times the passes of a step and the steps. Before this work the first frame was published with
the whole first chunk, so the tokens before it were those before the first sampled frame with
``first_frames=0``; now the first frame (the reference latent's) needs none, and the first sampled
frames wait for the short first chunk only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

from avatar_render.bench import first_frame_figures  # noqa: E402
from avatar_render.face.patches import luma  # noqa: E402
from avatar_render.metrics.seams import FrameChange, chunk_boundaries, measure_seams  # noqa: E402
from avatar_render.metrics.video import iter_frames  # noqa: E402


def clip(src: Path, seconds: float, dst: Path) -> Path:
    with wave.open(str(src)) as s, wave.open(str(dst), "wb") as w:
        w.setparams(s.getparams())
        w.writeframes(s.readframes(int(seconds * s.getframerate())))
    return dst


def render(config: Path, ref: Path, audio: Path, out: Path, overrides: list[str]) -> dict:
    report = out.with_suffix(".json")
    cmd = [sys.executable, "-m", "avatar_render", "render", "--ref", str(ref), "--audio", str(audio), "-o", str(out),
           "--report", str(report), "--force", "--quiet", "-c", str(config), *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"render failed ({' '.join(overrides)}): {done.stderr.strip() or done.stdout.strip()}")
    return json.loads(report.read_text())


def seam_figures(video: Path, report: dict) -> dict:
    seams = [b for b in measure_seams(video, report).boundaries if b.kind == "seam"]
    first, rest = (seams[0], seams[1:]) if seams else (None, [])
    return {
        "first_seam_frame": first.frame if first else None,
        "first_seam_ratio": first.ratio if first else None,
        "other_seams_mean": round(statistics.mean(r.ratio for r in rest), 4) if rest else None,
        "other_seams_min": min((r.ratio for r in rest), default=None),
        "other_seams_max": max((r.ratio for r in rest), default=None),
    }


def changes(video: Path) -> list[float]:
    c = FrameChange()
    for frame in iter_frames(video):
        c.update(luma(frame))
    return c.values.numpy().tolist()


def paired(rows: list[dict], series: list[list[float]]) -> None:
    """Each seam's change against the same frame of the first render (first_frames=0), where it lies inside
    a chunk: the seam's own effect, without the stream's start (the first frames change more in any render:
    the decoder's causal state fills up). The first render's seams are paired with the second's frames."""
    seams = [[b.frame for b in chunk_boundaries({"config": r["config"]}, len(s)) if b.kind == "seam"]
             for r, s in zip(rows, series)]
    for i, (r, s) in enumerate(zip(rows, series)):
        other = series[1] if i == 0 and len(series) > 1 else series[0]
        others_seams = set(seams[1] if i == 0 and len(series) > 1 else seams[0])
        ratios = [(b, s[b] / other[b]) for b in seams[i] if b < len(other) and b not in others_seams]
        r["paired_first_seam"] = round(ratios[0][1], 4) if ratios else None
        rest = [v for _, v in ratios[1:]]
        r["paired_other_seams"] = [round(min(rest), 4), round(statistics.mean(rest), 4),
                                   round(max(rest), 4)] if rest else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", type=Path, default=ROOT / "configs" / "tiny.yaml")
    ap.add_argument("--ref", type=Path, default=ROOT / "examples" / "face.png")
    ap.add_argument("--audio", type=Path, default=ROOT / "examples" / "talk.wav")
    ap.add_argument("--seconds", type=float, default=6.0, help="audio rendered (from its start)")
    ap.add_argument("--first", default="0,4,8", help="chunk.first_frames values to compare (0: as long as the others)")
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    ap.add_argument("overrides", nargs="*", help="config overrides for every render")
    a = ap.parse_args()
    rows, series = [], []
    with tempfile.TemporaryDirectory() as tmp:
        audio = clip(a.audio, a.seconds, Path(tmp) / "clip.wav")
        for first in (int(v) for v in a.first.split(",")):
            out = Path(tmp) / f"first{first}.mp4"
            rep = render(a.config, a.ref, audio, out, [*a.overrides, f"chunk.first_frames={first}"])
            rows.append({"first_frames": first, "chunk": rep["config"]["chunk"], "frames": rep["frames"],
                         "inputs_s": rep["inputs_s"], "time_to_first_frame_s": rep["time_to_first_frame_s"],
                         "generated_fps": rep["generated_fps"], **first_frame_figures(rep), **seam_figures(out, rep),
                         "config": {"backend": rep["config"]["backend"], "chunk": rep["config"]["chunk"]}})
            series.append(changes(out))
    paired(rows, series)
    base = rows[0]
    before = base["first_sampled_frame_tokens"]  # what the first frame waited for before: the whole first chunk
    print(f"config {a.config.name} {' '.join(a.overrides)}; {a.seconds:g} s of audio; chunk settings "
          f"{ {k: v for k, v in base['chunk'].items() if k != 'first_frames'} }")
    print(f"before (first frame published with the whole first chunk): first frame after {before} DiT tokens, "
          f"{base['first_sampled_frame_s']:.3f} s")
    print(f"{'first_frames':>12} {'1st frame s':>11} {'tokens':>7} {'1st sampled':>11} {'s':>7} {'tokens':>7} "
          f"{'x fewer':>7} {'seam 1':>7} {'others mean/min/max':>22} {'paired 1':>8} {'others min/mean/max':>22} "
          f"{'fps':>6}")
    for r in rows:
        fewer = before / max(r["first_frame_tokens"], 1) if r["first_frame_tokens"] else float("inf")
        others = "-" if r["other_seams_mean"] is None else \
            f"{r['other_seams_mean']:.3f}/{r['other_seams_min']:.3f}/{r['other_seams_max']:.3f}"
        seam1 = "-" if r["first_seam_ratio"] is None else f"{r['first_seam_ratio']:.3f}"
        p1 = "-" if r["paired_first_seam"] is None else f"{r['paired_first_seam']:.3f}"
        po = "-" if r["paired_other_seams"] is None else "/".join(f"{v:.3f}" for v in r["paired_other_seams"])
        print(f"{r['first_frames']:>12} {r['time_to_first_frame_s']:>11.3f} {r['first_frame_tokens']:>7} "
              f"{'frame ' + str(r['first_sampled_frame']):>11} {r['first_sampled_frame_s']:>7.3f} "
              f"{r['first_sampled_frame_tokens']:>7} {fewer:>7.1f} {seam1:>7} {others:>22} {p1:>8} {po:>22} "
              f"{r['generated_fps']:>6.2f}")
        r["tokens_fewer_than_before"] = None if fewer == float("inf") else round(fewer, 2)
        r["sampled_tokens_fewer_than_before"] = round(before / r["first_sampled_frame_tokens"], 2)
    print("x fewer: DiT tokens before the first frame, before against now (inf: none now). seam 1: the seam ratio "
          "after the first chunk; others: the later seams' (1.0 = no more change than inside a chunk). paired: a "
          "seam's change over the same frame's in the other render, where it lies inside a chunk (the seam's own "
          "effect).")
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
