"""Phone recognition ("allphone") with PocketSphinx 5: its English acoustic model and phone language
model ship in its wheel, so this runs offline, on one core, many times faster than real time, through
its C API (``preview.sphinx``: other threads run while a window is recognised).

Each call decodes one audio window as its own utterance (batch cepstral mean) with the feature
extraction set up afresh, so that the result depends on that window only: a resumed render recognises
the same phones. (Without the reset the decoder carries state from one utterance to the next.)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.pipeline.module import Module
from avatar_render.preview import ahead, voice
from avatar_render.preview.sphinx import SphinxDecoder

RATE = 16_000  # the acoustic model's sample rate
GAP_S = 0.25  # a pause shorter than this inside speech is the closure of a stop consonant
# ... whose lips, when its release is a lip's, are shut over all of it but its first GAP_LEAD_S, teeth together
# there, and at least over its last GAP_CLOSURE_S: such short pauses are often a t, k or unaspirated p (Spanish),
# and a whole-pause closure shut the lips on the loud frames beside it (docs/preview.md, "Other languages")
GAP_LEAD_S = 0.04
GAP_CLOSURE_S = 0.06
ONSET_S = 0.1  # a longer pause ending in a low-pitched onset ends with the lips closed this long
BURST_N = round(0.016 * 16_000)  # samples of the release burst after it, whose spectrum tells lips from tongue
LOUD_BELOW_PEAK_DB = 20.0  # inside a long "pause", a stretch within this of the window's loudest 10 ms ...
LOUD_FLOOR_DB = -50.0  # ... and above this (dBFS) ...
LOUD_RUN_S = 0.1  # ... for this long is sound the recogniser could not name
MURMUR_LOW = 0.85  # in such sound, lips closed on a voice (m, b) sound like this share of energy under 500 Hz ...
MURMUR_MID = 0.12  # ... less than this between 1 and 3 kHz ...
MURMUR_HF = 0.02  # ... and less than this above 3 kHz
MURMUR_S = 0.03  # for at least this long, steady ...
MURMUR_STEADY_DB = 6.0  # ... within this
MURMUR_N = round(0.025 * 16_000)  # samples of the spectrum around each 10-ms frame
CLOSURE_S = 0.08  # how long the lips stay shut for one m, b or p
# ... one aligned to the words spoken (``lip_closures``): its release is placed, so a shorter closure still shuts
# the lips at every m/b/p, and leaves them open on more of the loud frames around it (docs/preview.md)
ALIGNED_CLOSURE_S = 0.06
LIPS = ("M", "B", "P")
HELD_QUIET_DB = 20.0  # sound this far under the window's loudest 10 ms right after an m, b or p ...
HELD_S = 0.03  # ... for this long keeps the lips shut
LIP_BURST_LOW = 0.6  # the lips made the closure when at least this share of the burst's energy is under 1.5 kHz
LIP_BURST_HF = 0.1  # and less than this share above 3 kHz
# A t, d, k or g the recogniser heard is a b or p when its burst is a lip's and the vowel after it starts with its
# second formant low (the lips' transition): log10 of its energy in 0.9-1.5 kHz over 1.5-2.5 kHz, 20-50 ms after the
# release, at least this (docs/preview.md, "Lip stops heard as tongue stops")
LIP_ONSET = 0.4
VOWEL_ONSET_S = (0.02, 0.05)  # (that stretch, seconds after the release)
LIP_BURST_CLEAR_DB = 20.0  # a burst is read only this far over the window's floor (under noise it is the noise's)
TONGUE_STOPS = ("T", "D", "K", "G")
FRAME_S = 0.01  # PocketSphinx's frame shift
# The recogniser hears a window over a noise floor at least this far under its loudest 10 ms, as in the recordings
# its model learnt from: a quieter floor (a synthetic voice's stop closures are digital silence) is raised to it
# with pink noise, for the recogniser only (docs/preview.md, "A noise floor under the speech")
FLOOR_BELOW_PEAK_DB = 44.0
FLOOR_PERCENTILE = 5  # the window's floor: this percentile of its 10-ms levels
# ... raised only where it lies more than this under it: a room's own noise near it is left alone (a little noise
# added to it changes what the recogniser hears as a small change of the recording does: at random)
FLOOR_MARGIN_DB = 6.0
QUIET_BELOW_PEAK_DB = 30.0  # 10-ms frames this far under the window's loudest ...
QUIET_ABOVE_FLOOR_DB = 10.0  # ... and within this of its floor ...
QUIET_S = 0.03  # ... for at least this long are a pause, whatever the recogniser calls them (noise in a closure)
_ACOUSTIC = ("mdef", "means", "variances", "transition_matrices", "sendump", "feat.params", "noisedict")
_MURMUR_BANDS = ((-1, 500), (1000, 3000), (3000, np.inf))  # Hz: under 500, 1-3 kHz, over 3 kHz
# Narrower beams than the defaults: a little faster, the same phones in 97 % of the frames.
_SEARCH = dict(lw=2.0, pip=0.3, beam=1e-10, pbeam=1e-10)
# The recogniser hears fewer of a high voice's m, b and p (women's, children's: a shorter vocal tract than most of
# its model's speakers): a window whose median pitch lies over HIGH_VOICE_HZ is heard a second time with every
# frequency times HIGH_VOICE_WARP (the window slowed as much, the phones' times mapped back), and the m, b and p heard
# so go in over what was first heard there (docs/preview.md, "High voices")
HIGH_VOICE_HZ = 150.0
HIGH_VOICE_WARP = 0.9


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


def make_decoder(root: Path) -> SphinxDecoder:
    """A decoder of the allphone search on the model folder ``root`` (``model_dir()``)."""
    # (dict=None: not the word dictionary the default config loads, which phones do not use: 0.2 s, 22 MB)
    return SphinxDecoder(hmm=str(root / "en-us"), allphone=str(root / "en-us-phone.lm.bin"), samprate=RATE,
                         dict=None, loglevel="FATAL", **_SEARCH)


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
        self._decoder = ahead.take(ahead.PHONE_DECODER) or make_decoder(root)  # (preview.early may have made it)

    def recognize(self, audio: np.ndarray) -> tuple[Phone, ...]:
        """Phones of an (n,) float32 window at 16 kHz, in order, covering it."""
        self.load()
        floored = with_floor(audio)
        out = self._decode(floored, 1.0)
        if high_voice(audio):
            out = with_lips(out, tuple(p for p in self._decode(floored, HIGH_VOICE_WARP) if p.label in LIPS))
        return stop_closures(quiet_gaps(out, audio), audio)

    def _decode(self, audio: np.ndarray, warp: float) -> tuple[Phone, ...]:
        """The decoder's phones of the window heard with its frequencies times ``warp``, in the window's time."""
        assert self._decoder is not None
        pcm = (np.clip(lowered(audio, warp), -1.0, 1.0) * 32767).astype(np.int16)
        out = []
        for word, first, last in self._decoder.segments(pcm):
            label = word if word.isalpha() and word.isupper() else "SIL"
            out.append(Phone(label, first * FRAME_S * warp, (last + 1) * FRAME_S * warp))
        return tuple(out)


def high_voice(audio: np.ndarray) -> bool:
    """Whether the (n,) float32 window's voice is high (its median pitch over ``HIGH_VOICE_HZ``)."""
    pitch = voice.pitch_hz(audio, RATE)
    return pitch is not None and pitch > HIGH_VOICE_HZ


def with_lips(phones: tuple[Phone, ...], lips: tuple[Phone, ...]) -> tuple[Phone, ...]:
    """The phones with each of ``lips`` (m, b, p heard in the window lowered) put in over what was heard there."""
    if not phones or not lips:
        return phones
    end = phones[-1].end
    lips = tuple(Phone(p.label, p.start, min(p.end, end)) for p in lips if p.start < end)
    out = []
    for p in phones:
        pieces = [(p.start, p.end)]
        for q in lips:
            pieces = [(a, b) for s, e in pieces for a, b in ((s, min(e, q.start)), (max(s, q.end), e)) if b > a]
        out += [Phone(p.label, a, b) for a, b in pieces]
    return tuple(sorted((*out, *lips), key=lambda p: p.start))


def lowered(audio: np.ndarray, warp: float) -> np.ndarray:
    """The (n,) float32 window with every frequency times ``warp`` (<= 1), as long as 1 / warp times it."""
    if warp == 1.0:
        return audio
    n = int(len(audio) / warp)  # (band-limited: the spectrum zero-padded)
    return (np.fft.irfft(np.fft.rfft(audio), n) * (n / len(audio))).astype(np.float32)


def with_floor(audio: np.ndarray) -> np.ndarray:
    """The (n,) float32 window with its noise floor raised to FLOOR_BELOW_PEAK_DB under its loudest 10 ms, where it
    lies more than FLOOR_MARGIN_DB lower: seeded pink noise, the same for the same window (a resumed render hears
    the same phones)."""
    level = frame_levels(audio)
    if not len(level):
        return audio
    target = 10 ** ((float(level.max()) - FLOOR_BELOW_PEAK_DB) / 10)
    floor = 10 ** (float(np.percentile(level, FLOOR_PERCENTILE)) / 10)
    if floor * 10 ** (FLOOR_MARGIN_DB / 10) >= target:
        return audio
    out = _pink(len(audio)) * np.float32(np.sqrt(target - floor))
    out += audio
    return out


@functools.lru_cache(maxsize=4)
def _pink(n: int) -> np.ndarray:
    """(n,) float32 pink noise (power falling as 1/f) of RMS 1, from a fixed seed; made once for each length (the
    windows of a render are nearly all one length)."""
    spectrum = np.fft.rfft(np.random.default_rng(0).standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    freqs[0] = freqs[1] if n > 2 else 1.0
    noise = np.fft.irfft(spectrum / np.sqrt(freqs), n)
    noise = (noise / max(float(np.sqrt(np.mean(noise**2))), 1e-12)).astype(np.float32)
    noise.flags.writeable = False
    return noise


def quiet_gaps(phones: tuple[Phone, ...], audio: np.ndarray) -> tuple[Phone, ...]:
    """The recogniser's phones with the window's quiet stretches made pauses (SIL): at least QUIET_S of 10-ms
    frames QUIET_BELOW_PEAK_DB under its loudest and within QUIET_ABOVE_FLOOR_DB of its floor. Over a
    recording's own noise, the recogniser names the quiet of a stop's closure as a sound (a th, a t); a pause
    there is what ``stop_closures`` names from its release. A phone a gap falls in is split around it."""
    level = frame_levels(audio)
    n = len(level)
    if not n or not phones:
        return phones
    quiet = level < min(float(level.max()) - QUIET_BELOW_PEAK_DB,
                        float(np.percentile(level, FLOOR_PERCENTILE)) + QUIET_ABOVE_FLOOR_DB)
    owner = np.full(n, -1)  # the phone each frame belongs to; -1: a pause
    for i, p in enumerate(phones):
        owner[round(p.start / FRAME_S) : round(p.end / FRAME_S)] = -1 if p.label == "SIL" else i
    gaps = [(a, b) for is_quiet, a, b in _runs(quiet) if is_quiet and (b - a) * FRAME_S >= QUIET_S]
    if all((owner[a:b] == -1).all() for a, b in gaps):
        return phones
    for a, b in gaps:
        owner[a:b] = -1
    out = [Phone("SIL" if i < 0 else phones[i].label, a * FRAME_S, b * FRAME_S) for i, a, b in _runs(owner)]
    # (the first phone keeps its start; the recogniser's last frame may end past the levels' last)
    out[0] = Phone(out[0].label, phones[0].start, out[0].end)
    out[-1] = Phone(out[-1].label, out[-1].start, max(phones[-1].end, out[-1].end))
    return tuple(out)


def stop_closures(phones: tuple[Phone, ...], audio: np.ndarray) -> tuple[Phone, ...]:
    """Name the silences the recogniser leaves inside speech, and place its lip closures.

    Loud stretches of a long one are sound it could not place (noise, an unknown voice, a word it took for
    a filler): a neutral open vowel, but an M where the sound is a murmur (nearly all of it low-pitched, as
    a voice is behind closed lips). A short one between two sounds is the closure of a stop (the recogniser
    calls a p, b, t or k closure a pause): the lips made it when its release burst is low-pitched (most of
    its energy under 1.5 kHz, little above 3 kHz), a B with the teeth together (a T) over its first GAP_LEAD_S;
    otherwise a T.
    Speech that starts after a longer pause with such a low-pitched onset (a b or p, and also a voiced sound
    such as an r or a w, which lips closed in the pause open into) starts from closed lips: the pause's last
    ONSET_S is a B.
    An m, b or p the recogniser heard longer than a closure is shut only over its last CLOSURE_S, up to the
    release that ends it (its segment often takes in part of the sound before it: a vowel, or the n or ng of
    "young man", quieter than the m itself); the rest is an HH, shaped by its neighbours. A t, d, k or g it heard
    is a B up to its release where the lips made it (``_lip_release``). And
    the lips stay shut through the quiet right after a closure (``_held_shut``).
    """
    level = frame_levels(audio)
    floor = float(np.percentile(level, FLOOR_PERCENTILE)) if len(level) else np.inf
    out = []
    for p in phones:
        if p.label == "SIL":
            out += _loud_stretches(p, audio, level)
        elif p.label in LIPS:
            out += _at_release(p)
        elif p.label in TONGUE_STOPS and (release := _lip_release(audio, p, floor)) is not None:
            out += _at_release(Phone("B", p.start, release)) + [Phone("HH", release, p.end)] * (p.end > release)
        else:
            out.append(p)
    named: list[Phone] = []
    for i, p in enumerate(out):
        if p.label != "SIL" or i + 1 == len(out) or out[i + 1].label == "SIL":
            named.append(p)
            continue
        shares = _burst_shares(audio, p.end)
        lips = shares is not None and shares[0] >= LIP_BURST_LOW and shares[1] < LIP_BURST_HF
        if i > 0 and out[i - 1].label != "SIL" and p.end - p.start < GAP_S:
            if shares is None:
                named.append(p)
            else:
                closure = Phone("B" if lips else "T", p.start, p.end)
                length = max(GAP_CLOSURE_S, p.end - p.start - GAP_LEAD_S)
                named += _at_release(closure, length, "T") if lips else [closure]
        elif lips:
            cut = max(p.start, p.end - ONSET_S)
            named += [Phone("SIL", p.start, cut)] * (cut > p.start) + [Phone("B", cut, p.end)]
        else:
            named.append(p)
    return tuple(_held_shut(named, level))


def lip_closures(phones: tuple[Phone, ...], audio: np.ndarray) -> tuple[Phone, ...]:
    """Phones whose stops are all named (aligned to the words spoken): each m, b or p shut over its last
    ALIGNED_CLOSURE_S and through the quiet after it, as in ``stop_closures``. audio: (n,) float32, the window."""
    level = frame_levels(audio)
    out = [q for p in phones for q in (_at_release(p, ALIGNED_CLOSURE_S, level=level) if p.label in LIPS else [p])]
    return tuple(_held_shut(out, level))


def frame_levels(audio: np.ndarray) -> np.ndarray:
    """(n // 160,) dB of the window's 10-ms frames."""
    frame = round(FRAME_S * RATE)
    return 10 * np.log10(np.mean(audio[: len(audio) // frame * frame].reshape(-1, frame) ** 2, axis=1) + 1e-12)


def _held_shut(phones: list[Phone], level: np.ndarray) -> list[Phone]:
    """Lips closed for an m, b or p stay closed through the quiet that follows it before the next sound (the
    p of "pumpkin"): quiet of at least HELD_S at the start of the phone after becomes a P."""
    quiet = float(level.max()) - HELD_QUIET_DB if len(level) else 0.0
    out: list[Phone] = []
    for q in phones:
        if out and out[-1].label in LIPS and q.label not in LIPS:
            a, b = round(q.start / FRAME_S), min(round(q.end / FRAME_S), len(level))
            j = a
            while j < b and level[j] < quiet:
                j += 1
            if (j - a) * FRAME_S >= HELD_S:
                end = q.end if j == b else j * FRAME_S
                out.append(Phone("P", q.start, end))
                if end < q.end:
                    out.append(Phone(q.label, end, q.end))
                continue
        out.append(q)
    return out


def _at_release(
    closure: Phone, length: float = CLOSURE_S, before: str = "HH", level: np.ndarray | None = None
) -> list[Phone]:
    """An m, b or p cut to the last ``length`` seconds before its release (the end of its segment), the phone
    ``before`` over the rest; with the window's 10-ms levels (dB), the quiet just before that last part is shut
    too (a stop's closure is silent for as long as it lasts), in pieces no longer than one closure."""
    if closure.end - closure.start <= length:
        return [closure]
    start = closure.end - length
    lead = start
    if level is not None and len(level):
        quiet = float(level.max()) - HELD_QUIET_DB
        j, first = min(round(start / FRAME_S), len(level)), round(closure.start / FRAME_S)
        while j > first and level[j - 1] < quiet:
            j -= 1
        lead = max(closure.start, min(start, j * FRAME_S))
    shut = in_pieces(Phone(closure.label, lead, start), CLOSURE_S) + [Phone(closure.label, start, closure.end)]
    return [Phone(before, closure.start, lead)] * (lead > closure.start) + shut


def in_pieces(phone: Phone, longest: float) -> list[Phone]:
    """``phone`` cut into equal pieces no longer than ``longest`` seconds (none where it has no length)."""
    n = int(np.ceil((phone.end - phone.start) / longest - 1e-9))
    if n == 1:
        return [phone]
    cuts = np.linspace(phone.start, phone.end, n + 1)
    return [Phone(phone.label, float(a), float(b)) for a, b in zip(cuts[:-1], cuts[1:])]


def _loud_stretches(pause: Phone, audio: np.ndarray, level: np.ndarray) -> list[Phone]:
    """A long SIL with its loud stretches (see ``stop_closures``) named AH or M, in order, covering it.
    level: (n,) dB of the window's 10-ms frames."""
    a, b = round(pause.start / FRAME_S), min(round(pause.end / FRAME_S), len(level))
    if pause.end - pause.start < GAP_S or b <= a:
        return [pause]
    loud = level[a:b] > max(LOUD_FLOOR_DB, float(level.max()) - LOUD_BELOW_PEAK_DB)
    labels = np.full(b - a, "SIL", dtype=object)
    for is_loud, i, j in _runs(loud):
        if is_loud and (j - i) * FRAME_S >= LOUD_RUN_S:
            labels[i:j] = np.where(_murmur(audio, a + i, a + j), "M", "AH")
    for label, i, j in _runs(labels):  # (murmurs too short or unsteady for a closure are part of the sound)
        if label == "M" and ((j - i) * FRAME_S < MURMUR_S or np.ptp(level[a + i : a + j]) > MURMUR_STEADY_DB):
            labels[i:j] = "AH"
    times = np.clip((a + np.arange(b - a + 1)) * FRAME_S, pause.start, pause.end)
    times[-1] = pause.end
    return [Phone(label, float(times[i]), float(times[j])) for label, i, j in _runs(labels)]


def _runs(values: np.ndarray) -> list[tuple]:
    """(value, start, end) of each run of equal values of a non-empty (n,) array, in order."""
    cuts = [0, *(np.flatnonzero(values[1:] != values[:-1]) + 1).tolist(), len(values)]
    return [(values[i], i, j) for i, j in zip(cuts[:-1], cuts[1:])]


def _murmur(audio: np.ndarray, a: int, b: int) -> np.ndarray:
    """(b - a,) bool: 10-ms frames a .. b of the window whose spectrum is a voice behind closed lips."""
    frame, half = round(FRAME_S * RATE), MURMUR_N // 2
    centres = np.arange(a, b) * frame + frame // 2
    inside = (centres >= half) & (centres + half <= len(audio))
    out = np.zeros(b - a, bool)
    if inside.any():
        low, mid, high = _shares(audio[centres[inside, None] + np.arange(-half, half)], *_MURMUR_BANDS).T
        out[inside] = (low >= MURMUR_LOW) & (mid < MURMUR_MID) & (high < MURMUR_HF)
    return out


def _burst_shares(audio: np.ndarray, near: float) -> tuple[float, float] | None:
    """The release burst of a stop closure ending about ``near`` seconds in (the sharpest rise of the level
    within 30 ms of it): the shares of its energy under 1.5 kHz and above 3 kHz, or None at the edge."""
    at = _release(audio, near - 0.03, near + 0.03, BURST_N)
    if at is None:
        return None
    low, high = _shares(audio[at : at + BURST_N], (-1, 1500), (3000, np.inf))
    return float(low), float(high)


def _lip_release(audio: np.ndarray, stop: Phone, floor: float) -> float | None:
    """Where a t, d, k or g the recogniser heard is released (seconds), when the lips made it: its burst, clear of
    the window's floor (LIP_BURST_CLEAR_DB; ``floor``: dB, the FLOOR_PERCENTILE of its 10-ms levels), is low-pitched (as
    ``_burst_shares`` reads a closure's) and the vowel after it begins with its second formant low (LIP_ONSET).
    None otherwise, or at the window's edge."""
    after = round(VOWEL_ONSET_S[1] * RATE)
    at = _release(audio, stop.start - 0.01, stop.end + 0.01, max(BURST_N, after))
    if at is None:
        return None
    burst = audio[at : at + BURST_N]
    if 10 * np.log10(np.mean(burst**2) + 1e-12) < floor + LIP_BURST_CLEAR_DB:
        return None
    low, high = _shares(burst, (-1, 1500), (3000, np.inf))
    if low < LIP_BURST_LOW or high >= LIP_BURST_HF:
        return None
    f2_low, f2_high = _shares(audio[at + round(VOWEL_ONSET_S[0] * RATE) : at + after], (900, 1500), (1500, 2500))
    if np.log10((f2_low + 1e-6) / (f2_high + 1e-6)) < LIP_ONSET:
        return None
    return at / RATE


def _release(audio: np.ndarray, start: float, end: float, reach: int) -> int | None:
    """The sample of the sharpest rise of the level (5-ms windows, 2.5-ms steps) from ``start`` to ``end``
    seconds: a stop's release burst. None where the search or the ``reach`` samples after it leave the window."""
    step, win = round(0.0025 * RATE), round(0.005 * RATE)
    lo, hi = round(start * RATE), round(end * RATE)
    if lo < win or hi + reach > len(audio) or hi - lo < 3 * step:
        return None
    starts = np.arange(lo, hi, step)
    level = np.array([10 * np.log10(np.mean(audio[t - win // 2 : t + win // 2] ** 2) + 1e-12) for t in starts])
    return int(starts[1 + int(np.argmax(level[2:] - level[:-2]))])


def _shares(x: np.ndarray, *bands: tuple[float, float]) -> np.ndarray:
    """The shares of the energy of x's last axis (Hann-windowed) strictly between each band's (lo, hi) Hz
    (lo -1 takes in the mean). x: (..., n) -> (..., len(bands))."""
    n = x.shape[-1]
    power = np.abs(np.fft.rfft(x * np.hanning(n), axis=-1)) ** 2
    freqs = np.fft.rfftfreq(n, 1 / RATE)
    total = np.maximum(power.sum(axis=-1), 1e-12)
    return np.stack([power[..., (freqs > lo) & (freqs < hi)].sum(axis=-1) / total for lo, hi in bands], axis=-1)
