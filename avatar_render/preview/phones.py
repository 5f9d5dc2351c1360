"""Phone recognition ("allphone") with PocketSphinx 5: its English acoustic model and phone language
model ship in its wheel, so this runs offline, on one core, many times faster than real time.

Each call decodes one audio window as its own utterance (batch cepstral mean) with the feature
extraction set up afresh, so that the result depends on that window only: a resumed render recognises
the same phones. (Without the reset the decoder carries state from one utterance to the next.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.pipeline.module import Module

RATE = 16_000  # the acoustic model's sample rate
GAP_S = 0.25  # a pause shorter than this inside speech is the closure of a stop consonant
BURST_N = round(0.016 * 16_000)  # samples of the release burst after it, whose spectrum tells lips from tongue
LOUD_DB = -32.0  # a long "pause" this loud (dBFS) ...
LOUD_SHARE = 0.8  # ... in this share of its 10-ms frames is sound the recogniser could not name
LIP_BURST_LOW = 0.6  # the lips made the closure when at least this share of the burst's energy is under 1.5 kHz
LIP_BURST_HF = 0.1  # and less than this share above 3 kHz
FRAME_S = 0.01  # PocketSphinx's frame shift
_ACOUSTIC = ("mdef", "means", "variances", "transition_matrices", "sendump", "feat.params", "noisedict")
# Narrower beams than the defaults: a little faster, the same phones in 97 % of the frames.
_SEARCH = dict(lw=2.0, pip=0.3, beam=1e-10, pbeam=1e-10)
_FREQS = np.fft.rfftfreq(BURST_N, 1 / RATE)


@dataclass(frozen=True)
class Phone:
    label: str  # CMU phone (AA, B, ...) or SIL; noise fillers are reported as SIL
    start: float  # seconds from the start of the window
    end: float


def model_dir() -> Path | None:
    """PocketSphinx's bundled English model folder, or None when PocketSphinx is not installed."""
    try:
        from pocketsphinx import get_model_path
    except ImportError:
        return None
    return Path(get_model_path("en-us"))


class PhoneRecognizer(Module):
    name = "phone_recognizer"

    def __init__(self) -> None:
        super().__init__()
        self._decoder = None

    def weight_files(self) -> list[Path]:
        root = model_dir()
        if root is None:
            return []
        return [*(root / "en-us" / f for f in _ACOUSTIC), root / "en-us-phone.lm.bin"]

    def _load(self) -> None:
        root = model_dir()
        if root is None:
            raise AvatarRenderError("PocketSphinx is not installed: pip install pocketsphinx.")
        missing = self.missing_files()
        if missing:
            raise AvatarRenderError(f"PocketSphinx's model file '{missing[0]}' is missing; reinstall pocketsphinx.")
        from pocketsphinx import Decoder

        self._decoder = Decoder(
            hmm=str(root / "en-us"),
            allphone=str(root / "en-us-phone.lm.bin"),
            samprate=RATE,
            loglevel="FATAL",
            **_SEARCH,
        )

    def recognize(self, audio: np.ndarray) -> tuple[Phone, ...]:
        """Phones of an (n,) float32 window at 16 kHz, in order, covering it."""
        self.load()
        assert self._decoder is not None
        pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16).tobytes()
        d = self._decoder
        d.reinit_feat()
        d.start_utt()
        d.process_raw(pcm, full_utt=True)
        d.end_utt()
        out = []
        for seg in d.seg():
            label = seg.word if seg.word.isalpha() and seg.word.isupper() else "SIL"
            out.append(Phone(label, seg.start_frame * FRAME_S, (seg.end_frame + 1) * FRAME_S))
        return stop_closures(tuple(out), audio)


def stop_closures(phones: tuple[Phone, ...], audio: np.ndarray) -> tuple[Phone, ...]:
    """Name the silences the recogniser leaves inside speech.

    A long one that is loud throughout is sound it could not place (noise, an unknown voice): a neutral
    open vowel. A short one between two sounds is the closure of a stop (the recogniser calls a p, b, t
    or k closure a pause): the lips made it when its release burst is low-pitched (most of its energy
    under 1.5 kHz, little above 3 kHz), a B; otherwise a T.
    """
    out = list(phones)
    frame = round(FRAME_S * RATE)
    for i, p in enumerate(out):
        seg = audio[round(p.start * RATE) : round(p.end * RATE)]
        if p.label != "SIL" or p.end - p.start < GAP_S or len(seg) < frame:
            continue
        frames = seg[: len(seg) // frame * frame].reshape(-1, frame)
        if np.mean(10 * np.log10(np.mean(frames**2, axis=1) + 1e-12) > LOUD_DB) >= LOUD_SHARE:
            out[i] = Phone("AH", p.start, p.end)
    for i in range(1, len(out) - 1):
        p = out[i]
        if p.label != "SIL" or p.end - p.start >= GAP_S or "SIL" in (out[i - 1].label, out[i + 1].label):
            continue
        shares = _burst_shares(audio, p.end)
        if shares is None:
            continue
        low, high = shares
        out[i] = Phone("B" if low >= LIP_BURST_LOW and high < LIP_BURST_HF else "T", p.start, p.end)
    return tuple(out)


def _burst_shares(audio: np.ndarray, near: float) -> tuple[float, float] | None:
    """The release burst of a stop closure ending about ``near`` seconds in (the sharpest rise of the level
    within 30 ms of it): the shares of its energy under 1.5 kHz and above 3 kHz, or None at the edge."""
    step, win = round(0.0025 * RATE), round(0.005 * RATE)
    lo, hi = round((near - 0.03) * RATE), round((near + 0.03) * RATE)
    if lo < win or hi + BURST_N > len(audio):
        return None
    starts = np.arange(lo, hi, step)
    level = np.array([10 * np.log10(np.mean(audio[t - win // 2 : t + win // 2] ** 2) + 1e-12) for t in starts])
    at = int(starts[1 + int(np.argmax(level[2:] - level[:-2]))])
    burst = audio[at : at + BURST_N]
    power = np.abs(np.fft.rfft(burst * np.hanning(BURST_N))) ** 2
    total = max(float(power.sum()), 1e-12)
    return float(power[_FREQS < 1500].sum() / total), float(power[_FREQS > 3000].sum() / total)
