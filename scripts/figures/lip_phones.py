"""How many of a recording's m, b and p the preview's phone recogniser hears as lip closures, and how many other
consonants it hears so: the audio alone, before any drawing (what the mouth's closures follow without a transcript).

Each recording NAME.wav needs its words in NAME.txt. The m, b and p are those of a forced alignment of the words
(``measure_preview.align``), or the phones its synthesizer wrote beside it (NAME.phones: other languages); the
recogniser hears the recording a chunk's window at a time, as a render does (2 s and PHONE_PAD_S either side,
silence where that reaches before the recording's start or past its end, its DC offset taken out; each window's
phones kept over its own 2 s). An m/b/p is caught when a lip
phone (M, B, P after the recogniser's pauses are named) lies within 40 ms of its middle; a false closure is a lip
phone within 20 ms of the middle of an aligned t, d, k, g, n, ng, l, s, z, sh, zh, ch, jh, th, dh or y with no
m/b/p within 100 ms.

    python scripts/figures/lip_phones.py REC.wav [REC.wav ...] [--noise-db DB] [--json OUT.json]

--noise-db adds seeded pink noise of this RMS level (dBFS) to each recording before it is heard: a room's floor
under the voice (the words are aligned on the recording without it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from measure_preview import load_16k, spoken

from avatar_render.preview.engine import PHONE_PAD_S
from avatar_render.preview.motion import without_offset
from avatar_render.preview.phones import LIPS, RATE, PhoneRecognizer

CORE_S = 2.0  # the frames of a default chunk (50 at 25 fps)
TONGUE = set("T D K G N NG L S Z SH ZH CH JH TH DH Y".split())


def heard(audio: np.ndarray, recognizer: PhoneRecognizer) -> list[tuple[str, float, float]]:
    """(phone, start s, end s) over the recording, window by window."""
    out, k, seconds = [], 0, len(audio) / RATE
    pad = np.zeros(round(PHONE_PAD_S * RATE), np.float32)  # (as a render's windows: ``AudioReader.model_audio``)
    padded = np.concatenate([pad, audio, pad])
    while k * CORE_S < seconds:
        lo, hi = k * CORE_S, min((k + 1) * CORE_S, seconds)
        start = lo - PHONE_PAD_S
        window = without_offset(padded[round(lo * RATE) : round(hi * RATE) + 2 * len(pad)], rate=RATE)
        for p in recognizer.recognize(window):
            a, b = p.start + start, p.end + start
            if b > lo and a < hi:
                out.append((p.label, max(a, lo), min(b, hi)))
        k += 1
    return out


def count(path: Path, noise_db: float | None, recognizer: PhoneRecognizer) -> dict:
    audio = load_16k(path)
    if noise_db is not None:
        noise = np.fft.irfft(np.fft.rfft(np.random.default_rng(1).standard_normal(len(audio)))
                             / np.sqrt(np.maximum(np.fft.rfftfreq(len(audio), 1 / RATE), 1.0)), len(audio))
        audio = (audio + noise / np.sqrt(np.mean(noise**2)) * 10 ** (noise_db / 20)).astype(np.float32)
    middles = [(label, (a + b) / 2) for label, a, b in spoken(path, path.with_suffix(".txt").read_text())]
    lips = [(a, b) for label, a, b in heard(audio, recognizer) if label in LIPS]

    def near(t: float, within: float) -> bool:
        return any(a - within <= t <= b + within for a, b in lips)

    targets = [t for label, t in middles if label in LIPS]
    others = [t for label, t in middles if label in TONGUE and all(abs(t - u) >= 0.1 for u in targets)]
    return {"caught": sum(near(t, 0.04) for t in targets), "m_b_p": len(targets),
            "false": sum(near(t, 0.02) for t in others), "others": len(others)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recordings", nargs="+", type=Path)
    ap.add_argument("--noise-db", type=float, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    recognizer, results, total = PhoneRecognizer(), {}, np.zeros(4, int)
    for path in args.recordings:
        r = results[path.stem] = count(path, args.noise_db, recognizer)
        total += [r["caught"], r["m_b_p"], r["false"], r["others"]]
        print(f"{path.stem}: m/b/p caught {r['caught']}/{r['m_b_p']}, false closures {r['false']}/{r['others']}")
    print(f"all: m/b/p caught {total[0]}/{total[1]}, false closures {total[2]}/{total[3]}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
