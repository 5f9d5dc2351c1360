"""The t, d, k and g the preview's phone recogniser hears, read by the test that names some of them lip closures
(``preview.phones._lip_release``): how many of those that are an aligned b or p it catches, and how many of those
that are an aligned t, d, k or g it takes for one, at several LIP_ONSET thresholds.

Each recording NAME.wav needs its words in NAME.txt. A heard t, d, k or g (the recogniser's own name, before the
test) is a lip stop when an aligned b or p lies within 50 ms of its middle, a tongue stop when an aligned t, d, k
or g does and no b or p within 100 ms; the rest are left out. Its release is the sharpest rise of the level within
its segment; its burst the 16 ms from there (share under 1.5 kHz at least LIP_BURST_LOW, above 3 kHz under
LIP_BURST_HF); its vowel onset 20-50 ms after it (log10 of the energy in 0.9-1.5 kHz over 1.5-2.5 kHz).

    python scripts/figures/tongue_stops.py REC.wav [REC.wav ...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from lip_phones import heard
from measure_preview import align, load_16k

from avatar_render.preview import phones as ph

THRESHOLDS = (0.0, 0.2, 0.3, ph.LIP_ONSET, 0.5, 0.6, 0.8)


def readings(path: Path, recognizer: ph.PhoneRecognizer) -> list[tuple[bool, float, float, float]]:
    """(a lip stop, burst share under 1.5 kHz, share over 3 kHz, vowel onset ratio) of each heard t/d/k/g."""
    audio = load_16k(path)
    aligned = [(label, (a + b) / 2) for label, a, b in align(path, path.with_suffix(".txt").read_text())]
    lips = [t for label, t in aligned if label in ("B", "P")]
    tongue = [t for label, t in aligned if label in ph.TONGUE_STOPS]
    out = []
    original, ph._lip_release = ph._lip_release, lambda audio, stop, floor: None  # the recogniser's own names
    try:
        phones = heard(audio, recognizer)
    finally:
        ph._lip_release = original
    for label, a, b in phones:
        m = (a + b) / 2
        lip = any(abs(m - t) < 0.05 for t in lips)
        if label not in ph.TONGUE_STOPS or not (lip or any(abs(m - t) < 0.05 for t in tongue)):
            continue
        if not lip and any(abs(m - t) < 0.1 for t in lips):
            continue
        after = round(ph.VOWEL_ONSET_S[1] * ph.RATE)
        at = ph._release(audio, a - 0.01, b + 0.01, after)
        if at is None:
            continue
        low, high = ph._shares(audio[at : at + ph.BURST_N], (-1, 1500), (3000, np.inf))
        f2_low, f2_high = ph._shares(audio[at + round(ph.VOWEL_ONSET_S[0] * ph.RATE) : at + after], (900, 1500),
                                     (1500, 2500))
        out.append((lip, float(low), float(high), float(np.log10((f2_low + 1e-6) / (f2_high + 1e-6)))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recordings", nargs="+", type=Path)
    args = ap.parse_args()
    recognizer, rows = ph.PhoneRecognizer(), []
    for path in args.recordings:
        got = readings(path, recognizer)
        rows += got
        burst = [r for r in got if r[1] >= ph.LIP_BURST_LOW and r[2] < ph.LIP_BURST_HF]
        caught = sum(r[0] and r[3] >= ph.LIP_ONSET for r in burst)
        false = sum(not r[0] and r[3] >= ph.LIP_ONSET for r in burst)
        print(f"{path.stem}: lip stops {caught}/{sum(r[0] for r in got)} caught, "
              f"tongue stops {false}/{sum(not r[0] for r in got)} taken for lips")
    lip = sum(r[0] for r in rows)
    burst = [r for r in rows if r[1] >= ph.LIP_BURST_LOW and r[2] < ph.LIP_BURST_HF]
    print(f"all: {lip} lip stops and {len(rows) - lip} tongue stops heard as t, d, k or g")
    print(f"  the burst alone: {sum(r[0] for r in burst)} caught, {sum(not r[0] for r in burst)} taken for lips")
    for th in THRESHOLDS:
        print(f"  with the vowel onset >= {th}: {sum(r[0] and r[3] >= th for r in burst)} caught, "
              f"{sum(not r[0] and r[3] >= th for r in burst)} taken for lips")


if __name__ == "__main__":
    main()
