"""How high a voice is (``preview.voice``), and a high voice's m, b and p heard by the phone recogniser with its
frequencies lowered."""

from __future__ import annotations

import numpy as np
import pytest

from avatar_render.pipeline.module import Placement
from avatar_render.preview import phones
from avatar_render.preview.phones import HIGH_VOICE_WARP, RATE, Phone, PhoneRecognizer
from avatar_render.preview.voice import pitch_hz


def vowel(pitch: float, formants: tuple[float, ...], seconds: float = 2.0, seed: int = 0) -> np.ndarray:
    """(n,) float32: a pulse train at ``pitch`` Hz (a little jitter) through a resonator at each formant, with a
    pause of a quarter of a second every half second (speech, not one held note)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    source = np.zeros(n)
    t = 0.0
    while t < n:
        source[int(t)] = 1.0
        t += RATE / pitch * (1 + 0.01 * rng.standard_normal())
    x = source
    for f, bw in zip(formants, (80.0, 110.0, 160.0)):
        r = np.exp(-np.pi * bw / RATE)
        a1, a2 = 2 * r * np.cos(2 * np.pi * f / RATE), -r * r
        y = np.zeros(n)
        for i in range(n):  # y[i] = x[i] + a1 y[i-1] + a2 y[i-2]
            y[i] = x[i] + a1 * y[i - 1] + a2 * y[i - 2] if i >= 2 else x[i]
        x = y
    x *= (np.arange(n) % (RATE // 2) < 0.25 * RATE)  # speech and pauses
    x += 1e-4 * rng.standard_normal(n)
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


MAN = (115.0, (500.0, 1450.0, 2500.0))
LOW_VOICE = (85.0, (450.0, 1300.0, 2400.0))
HIGHER_MAN = (140.0, (520.0, 1500.0, 2550.0))
WOMAN = (210.0, (600.0, 2150.0, 3000.0))
CHILD = (290.0, (700.0, 2400.0, 3300.0))


@pytest.mark.parametrize("pitch, formants", [LOW_VOICE, MAN, HIGHER_MAN, WOMAN, CHILD])
def test_the_pitch_of_a_voice(pitch, formants):
    assert pitch_hz(vowel(pitch, formants), RATE) == pytest.approx(pitch, rel=0.05)


def test_silence_and_a_too_short_window_have_no_pitch():
    quiet = (1e-4 * np.random.default_rng(0).standard_normal(2 * RATE)).astype(np.float32)
    assert pitch_hz(np.zeros(2 * RATE, np.float32), RATE) is None and pitch_hz(quiet[:300], RATE) is None


class _Decoder:
    """Stands in for PocketSphinx: an AA over the window but a B at 1.1-1.2 s (in the window's time) when it is heard
    lowered (longer), and the length of each window it was given."""

    def __init__(self, length: int) -> None:
        self.length = length
        self.heard: list[int] = []

    def segments(self, pcm: np.ndarray) -> list[tuple[str, int, int]]:
        self.heard.append(len(pcm))
        n = len(pcm) // 160
        if len(pcm) == self.length:
            return [("AA", 0, n - 1)]
        a, b = round(110 / HIGH_VOICE_WARP), round(120 / HIGH_VOICE_WARP)
        return [("AA", 0, a - 1), ("B", a, b - 1), ("AA", b, n - 1)]


@pytest.mark.parametrize("voice, lowered", [(MAN, False), (HIGHER_MAN, False), (WOMAN, True), (CHILD, True)])
def test_a_high_voices_lip_sounds_are_heard_with_its_frequencies_lowered(voice, lowered):
    x = vowel(*voice, seconds=2.64)
    rec = PhoneRecognizer()
    rec._decoder = decoder = _Decoder(len(x))
    rec.placement = Placement.CPU  # (loaded: the stand-in decoder is used)
    heard = rec.recognize(x)
    assert phones.high_voice(x) is lowered
    assert decoder.heard == ([len(x), int(len(x) / HIGH_VOICE_WARP)] if lowered else [len(x)])
    assert heard[0].start == 0.0 and heard[-1].end == pytest.approx(len(x) / RATE, abs=0.011)
    # (the pauses of the stand-in speech are named closures whatever is heard; the B lies inside its sound, shut up
    # to its release)
    lips = [p.end for p in heard if p.label in phones.LIPS and p.start < 1.2 and p.end > 1.1]
    assert lips == ([pytest.approx(1.2, abs=0.011)] if lowered else [])


def test_lip_sounds_heard_lowered_go_in_over_what_was_heard_there():
    first = (Phone("SIL", 0.0, 0.2), Phone("AE", 0.2, 0.5), Phone("N", 0.5, 0.6), Phone("IY", 0.6, 1.0))
    got = phones.with_lips(first, (Phone("M", 0.48, 0.6), Phone("B", 0.95, 1.1)))
    assert got == (Phone("SIL", 0.0, 0.2), Phone("AE", 0.2, 0.48), Phone("M", 0.48, 0.6), Phone("IY", 0.6, 0.95),
                   Phone("B", 0.95, 1.0))
    assert phones.with_lips(first, ()) == first


def test_lowering_moves_a_tone_down_and_keeps_its_level():
    t = np.arange(RATE) / RATE
    tone = (0.5 * np.sin(2 * np.pi * 2000 * t)).astype(np.float32)
    low = phones.lowered(tone, HIGH_VOICE_WARP)
    assert len(low) == int(RATE / HIGH_VOICE_WARP)
    spectrum = np.abs(np.fft.rfft(low * np.hanning(len(low))))
    peak = np.fft.rfftfreq(len(low), 1 / RATE)[np.argmax(spectrum)]
    assert peak == pytest.approx(2000 * HIGH_VOICE_WARP, abs=3)
    assert np.sqrt(np.mean(low**2)) == pytest.approx(np.sqrt(np.mean(tone**2)), rel=0.02)
    assert phones.lowered(tone, 1.0) is tone
