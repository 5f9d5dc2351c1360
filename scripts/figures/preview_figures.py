"""Every "done means" figure of the preview in one run: renders the example and the extra recordings with
the default configuration, measures each on its own frames with face landmarks (scripts/figures/measure_preview.py),
and times the whole job (encode included) at 512x512, 1280x720 and 1920x1080; a longer render of the
example for the seam ratio (``avatar-render inspect``) and its peak memory against a 10 s render's.

    python scripts/figures/preview_figures.py [--out bench-out/preview] [--seam-s 198] [--skip-speed] [--skip-seams]
        [--only talk mbp ...] [--transcript] [--json figures.json] [overrides ...]

--transcript renders each English recording with its words given (``preview.transcript``: the phones aligned
to them, not heard); the other languages' are rendered as without it.

The extra recordings are made by ``scripts/fixtures/make_examples.py --extra OUT/rec`` (espeak-ng, and pip for the
human voice) when missing; one that could not be made is left out, with a message.
Needs the face landmark model (scripts/fetch_face_model.py). Overrides (key=value) go to every render.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FACE = ROOT / "examples" / "face.png"
TALK = ROOT / "examples" / "talk.wav"
EXTRA = ("voice2", "spanish", "mbp", "eeoo", "mbp_f3", "mbp_text2", "librivox", "german", "spanish2", "mandarin")
# aligned with their text (closures, ee/oo); the other languages are not
ENGLISH = ("voice2", "mbp", "eeoo", "mbp_f3", "mbp_text2", "librivox")
# more English recordings with their words, rendered only when named with --only: the six voices of "The opening and
# the closures" and the four of Flite's slt voice ("High voices"; made only where the flite program is installed)
MORE = ("mbp_m3", "mbp_rp", "mbp_029", "mbp_scot", "mbp_f5", "mbp_klatt",
        "slt_mbp", "slt_mbp3", "slt_mbp4", "slt_text2")
# other languages with the phones their synthesizer spoke (closures counted on those), also only with --only
TIMED = ("mbp_es", "mbp_de", "mbp_fr", "mbp_it", "mbp_pt")
SIZES = ((1280, 720), (1920, 1080))


def cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "avatar_render", *args], check=True, stdout=subprocess.DEVNULL)


def render(out: Path, audio: Path, *overrides: str) -> dict:
    report = out.with_suffix(".json")
    cli("render", "--ref", str(FACE), "--audio", str(audio), "-o", str(out), "--report", str(report), "--force",
        *overrides)
    return json.loads(report.read_text())


def repeat_wav(src: Path, dst: Path, seconds: float) -> None:
    """``src`` played again and again to ``seconds`` (or cut to them), written a copy at a time (an hour of it
    held at once would make this process, and so the peak its renders report, hundreds of MB larger)."""
    with wave.open(str(src)) as w:
        params, data = w.getparams(), w.readframes(w.getnframes())
    left = round(seconds * params.framerate) * params.sampwidth * params.nchannels
    with wave.open(str(dst), "wb") as w:
        w.setparams(params)
        while left > 0:
            w.writeframes(data[:left])
            left -= len(data[:left])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "preview")
    ap.add_argument("--seam-s", type=float, default=198.0, help="length of the seam render (8 x the example)")
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--skip-seams", action="store_true")
    ap.add_argument("--only", nargs="*", default=None,
                    help="recordings to render and measure (talk, EXTRA, MORE and TIMED names)")
    ap.add_argument("--transcript", action="store_true", help="give the English recordings' words to the renders")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out, rec = args.out, args.out / "rec"
    out.mkdir(parents=True, exist_ok=True)
    names = args.only if args.only is not None else ["talk", *EXTRA]
    if not all((rec / f"{n}.wav").is_file() for n in (*EXTRA, *(n for n in names if n in TIMED))):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "fixtures" / "make_examples.py"), "--extra", str(rec)],
                       check=True)
    for name in [n for n in names if n != "talk" and not (rec / f"{n}.wav").is_file()]:
        print(f"== {name}: left out ({rec / name}.wav could not be made)")
        names.remove(name)
    figures: dict = {"recordings": {}}
    # The long and the short render first, while this process is small (see the import of measure below).
    if not args.skip_seams:
        long, short = out / "long.wav", out / "short.wav"
        repeat_wav(TALK, long, args.seam_s)
        repeat_wav(TALK, short, 10.0)
        r_long = render(out / "long.mp4", long, *args.overrides)
        r_short = render(out / "short.mp4", short, *args.overrides)
        inspect = out / "long_inspect.json"
        subprocess.run([sys.executable, "-m", "avatar_render", "inspect", str(out / "long.mp4"), "--report",
                        str(out / "long.json"), "--ref", str(FACE), "--json", str(inspect)], check=True,
                       stdout=subprocess.DEVNULL)
        s = json.loads(inspect.read_text())["seams"]
        figures["seams"] = {
            "seconds": args.seam_s,
            "seam_ratio": round(s["ratio"], 3),
            "n_seams": round(s["seam_ratio"], 3),
            "i_chunk_edges": round(s["edge_ratio"], 3),
            "worst": s["worst"],
            "peak_rss_mb": r_long["peak_rss_mb"],
            "peak_rss_mb_10s": r_short["peak_rss_mb"],
            "peak_memory_ratio": round(r_long["peak_rss_mb"] / r_short["peak_rss_mb"], 3),
        }
        print(f"== seams ({args.seam_s:.0f} s): {figures['seams']}")
    # (imported only now: a child's peak resident size starts at its parent's size when it was started, and the
    # measuring's libraries make this process large)
    from measure_preview import measure

    for name in names:
        audio = TALK if name == "talk" else rec / f"{name}.wav"
        words = []
        if args.transcript and name in ("talk", *ENGLISH, *MORE):
            words = [f"preview.transcript={TALK.with_suffix('.txt') if name == 'talk' else rec / f'{name}.txt'}"]
        report = render(out / f"{name}.mp4", audio, *words, *args.overrides)
        text = (rec / f"{name}.txt").read_text() if name in (*ENGLISH, *MORE, *TIMED) else None
        m = measure(out / f"{name}.mp4", FACE, audio, text)
        m["realtime_factor"] = report["realtime_factor"]
        figures["recordings"][name] = m
        print(f"== {name} ({report['duration_s']:.1f} s, {report['realtime_factor']:.2f}x real time)")
        for k, v in m.items():
            print(f"  {k}: {v}")
    if not args.skip_speed:
        speed = {"512x512": figures["recordings"].get("talk", {}).get("realtime_factor")}
        for w, h in SIZES:
            r = render(out / f"talk_{h}p.mp4", TALK, f"video.width={w}", f"video.height={h}", *args.overrides)
            speed[f"{w}x{h}"] = r["realtime_factor"]
            took = f"{r['wall_s']:.1f} s for {r['duration_s']:.1f} s"
            print(f"== speed {w}x{h}: {r['realtime_factor']:.2f}x real time ({took})")
        if speed["512x512"] is None:
            speed["512x512"] = render(out / "talk.mp4", TALK, *args.overrides)["realtime_factor"]
        figures["speed_x_realtime"] = speed
    print("\n== targets")
    for name, m in figures["recordings"].items():
        line = [f"aperture r {m['r_aperture_vs_level']} (>= 0.6)",
                f"silence/speech aperture {m['aperture_silence_over_speech']} (< 0.1)",
                f"blinks {m['blinks_per_minute']}/min (8-30)",
                f"still SSIM mean {m['ssim_still_mean']}, 5th pct {m['ssim_still_p5']}, min {m['ssim_still_min']}, "
                f"frames >= 0.95: {m['ssim_still_frames_over_0.95']}",
                f"teeth {m.get('teeth_present_frames')}"]
        if "mbp_closed_by_aperture" in m:
            line.append(f"m/b/p closed {m['mbp_closed_by_aperture']} (>= 80 %)")
        if "ee_wider_than_oo" in m:
            line.append(f"ee wider than oo {m['ee_wider_than_oo']} (5/5)")
        print(f"  {name}: " + "; ".join(line))
    if "speed_x_realtime" in figures:
        print(f"  speed: {figures['speed_x_realtime']} (4x, 2x, 1x)")
    if "seams" in figures:
        s = figures["seams"]
        memory = f"peak memory {s['peak_memory_ratio']} x a 10 s render's (<= 1.05)"
        print(f"  seams: ratio {s['seam_ratio']} (<= 1.2), {memory}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
