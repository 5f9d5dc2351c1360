"""The preview's speed against its encoder's, at each size, in one run (the figures of docs/preview.md).

Each size renders the same speech (``--speech`` looped to ``--seconds``) with ``avatar-render render``
in a process of its own (its report gives the whole job's rate and peak memory), then times the render's
encoder alone on the frames of the file it wrote (``avatar_render.io.encode_rate``): the ratio of the two
rates is what a machine's load changes least, and so are the CPU milliseconds a frame costs (the render's
process, all its threads; the encoder alone). With ``--before DIR`` (another checkout of the project),
each size is also rendered by that code, the two taking turns (which goes first alternates), and the
rows are set side by side; ``--repeats`` runs everything again.

    python scripts/bench/preview_speed.py --seconds 60 --json speed.json
    python scripts/bench/preview_speed.py --before ../other-checkout --repeats 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
from pathlib import Path

from avatar_render.bench import BenchCase, run_case, summarize

ROOT = Path(__file__).resolve().parents[2]
SIZES = ((512, 512), (1280, 720), (1920, 1080))


def measure(case: BenchCase, code: Path, *, work: Path, speech: Path, reference: Path) -> dict:
    """One render of ``case`` by the project at ``code``, and its encoder alone on its frames."""
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = str(code)  # (the render's process runs that checkout's code)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        rep = run_case(case, reference=reference, speech=speech, workdir=work, report=work / "report.json",
                       force=True)
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = before
    now = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = summarize(rep, backend=case.backend)
    frames = row["frames"]
    return {**{k: row[k] for k in ("width", "height", "frames", "wall_s", "realtime_factor", "encode_realtime_factor",
                                   "encode_ratio", "peak_rss_mb", "stage_s")},
            # CPU milliseconds a frame, all threads: the render's process, and the encoder alone
            "render_cpu_ms": round((now.ru_utime + now.ru_stime - used.ru_utime - used.ru_stime
                                    - rep["encode_only"]["process_cpu_s"]) / frames * 1e3, 2),
            "encode_cpu_ms": round(rep["encode_only"]["cpu_s"] / frames * 1e3, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--sizes", default=",".join(f"{w}x{h}" for w, h in SIZES))
    ap.add_argument("--speech", type=Path, default=ROOT / "examples" / "talk.wav")
    ap.add_argument("--ref", type=Path, default=ROOT / "examples" / "face.png")
    ap.add_argument("--before", type=Path, help="another checkout of the project, rendered in turn with this one")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--json", type=Path, help="write every row here")
    args = ap.parse_args()
    args.speech, args.ref = args.speech.resolve(), args.ref.resolve()
    out = None if args.json is None else args.json.resolve()
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    codes = {"this": ROOT, **({"before": args.before.resolve()} if args.before else {})}
    rows = []
    print(f"{'code':7} {'size':>9} {'x real':>7} {'encode x':>8} {'ratio':>6} {'peak MB':>8} {'CPU ms/frame':>12}"
          f" {'encode':>6} {'load':>5}", flush=True)
    with tempfile.TemporaryDirectory(prefix="preview-speed-") as tmp:
        os.chdir(tmp)  # (``python -m`` looks in the working folder first: PYTHONPATH picks the code)
        for repeat in range(args.repeats):
            for w, h in sizes:
                for name, code in (list(codes.items()) if repeat % 2 == 0 else list(codes.items())[::-1]):
                    load = os.getloadavg()[0]
                    row = measure(BenchCase(args.seconds, w, h), code, work=Path(tmp), speech=args.speech,
                                  reference=args.ref)
                    rows.append({"code": name, "repeat": repeat, "load_before": load, **row})
                    print(f"{name:7} {f'{w}x{h}':>9} {row['realtime_factor']:7.2f} {row['encode_realtime_factor']:8.2f}"
                          f" {row['encode_ratio']:6.2f} {row['peak_rss_mb']:8.1f} {row['render_cpu_ms']:12.2f}"
                          f" {row['encode_cpu_ms']:6.2f} {load:5.1f}", flush=True)
    if out is not None:
        out.write_text(json.dumps({"seconds": args.seconds, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
