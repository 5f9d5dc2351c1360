"""The preview on photos that are not the example: renders each photo of ``scripts/fixtures/make_examples.py --faces``
with two voices (examples/talk.wav and the extra ``mbp`` recording), measures every render on its own
frames (scripts/figures/measure_preview.py: aperture vs speech, silence, closures, the inner mouth's teeth and grey
level spread on the widest-open third of the speech frames), times the whole job, and writes a contact
sheet per photo (scripts/figures/preview_frames.py).

    python scripts/figures/preview_references.py [--out bench-out/references] [--sheets docs] [--json OUT.json]
        [--only biden.jpg ...] [overrides ...]

Overrides (key=value) go to every render: ``face.landmarks=template`` measures the template mesh's placement
(the measuring still uses the landmark model).

The photos and recordings are made into OUT/faces and OUT/rec when missing (pip, espeak-ng); ones that
could not be made are left out, with a message. Needs the face landmark model (scripts/fetch_face_model.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TALK = ROOT / "examples" / "talk.wav"
PHOTOS = ("biden.jpg", "glasses.jpg", "obama3.jpg", "obama.jpg", "bw_glasses.jpg", "older.jpg", "hopper.jpg",
          "einstein.jpg", "breakingbad.jpg", "takeo.ppm")
FIGURES = (
    "r_aperture_vs_level",
    "aperture_silence_over_speech",
    "mbp_closed_by_aperture",
    "mbp_closed_against_floor",
    "widest_third_teeth_frames",
    "widest_third_inner_luma_spread_median",
    "blinks_per_minute",
    "blinks_per_minute_eye_pixels",
    "ssim_still_mean",
)


def run(*args: str) -> None:
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench-out" / "references")
    ap.add_argument("--sheets", type=Path, default=None, help="folder for the contact sheets (default: OUT)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--only", nargs="*", default=None, help="photo file names")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    faces, rec = args.out / "faces", args.out / "rec"
    if not all((faces / p).is_file() for p in PHOTOS):
        faces.mkdir(parents=True, exist_ok=True)
        run(str(ROOT / "scripts" / "fixtures" / "make_examples.py"), "--faces", str(faces))
    if not (rec / "mbp.wav").is_file():
        run(str(ROOT / "scripts" / "fixtures" / "make_examples.py"), "--extra", str(rec))
    voices = [("talk", TALK, None)]
    if (rec / "mbp.wav").is_file():
        voices.append(("mbp", rec / "mbp.wav", rec / "mbp.txt"))
    sheets = args.sheets or args.out
    # (the face is measured where the render chose it: with the template, by the cascade alone)
    chosen = ["--face-landmarks", next((o.split("=", 1)[1] for o in args.overrides if o.startswith("face.landmarks=")),
                                       "auto")]
    results = {}
    for photo in args.only or PHOTOS:
        ref = faces / photo
        if not ref.is_file():
            print(f"{photo}: not there, left out")
            continue
        for voice, audio, text in voices:
            video = args.out / f"{ref.stem}_{voice}.mp4"
            report = video.with_suffix(".report.json")
            run("-m", "avatar_render", "render", "--ref", str(ref), "--audio", str(audio), "-o", str(video),
                "--report", str(report), "--force", *args.overrides)
            figures = video.with_suffix(".json")
            cmd = [str(ROOT / "scripts" / "figures" / "measure_preview.py"), str(video), "--ref", str(ref),
                   "--audio", str(audio), "--json", str(figures)]
            try:
                run(*cmd, *chosen, *(["--text", str(text)] if text is not None else []))
            except subprocess.CalledProcessError:
                print(f"{video.name}: not measured (the landmark model lost the face in a frame)")
                results[f"{ref.stem}/{voice}"] = None
                continue
            out = json.loads(figures.read_text())
            speed = json.loads(report.read_text()).get("realtime_factor")
            results[f"{ref.stem}/{voice}"] = {k: out.get(k) for k in FIGURES} | {"realtime_x": speed}
            print(ref.stem, voice, results[f"{ref.stem}/{voice}"], flush=True)
            if voice == "talk":
                sheets.mkdir(parents=True, exist_ok=True)
                run(str(ROOT / "scripts" / "figures" / "preview_frames.py"), str(video), "--ref", str(ref),
                    "--tile", "160", "-o", str(sheets / f"preview_ref_{ref.stem.lower()}.png"), *chosen)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
