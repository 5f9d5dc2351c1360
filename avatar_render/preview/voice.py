"""How high a voice is: the median pitch of one window of speech.

The phone recogniser's English acoustic model hears fewer of a high voice's m, b and p (most women's, a child's:
a shorter vocal tract than most of its model's speakers): on a voice made from CMU ARCTIC's slt speaker it missed 45
of 106, an m heard as an n, a b as a d or a v, where it misses a few of the men's voices' (docs/preview.md, "High
voices").
Such a window is heard again with every frequency lowered (``phones.PhoneRecognizer``), as vocal tract length
normalisation does; the pitch decides which windows.
"""

from __future__ import annotations

import numpy as np

_LOUD = 0.3  # frames whose RMS is at least this share of the window's 90th percentile are voice, not pauses
_HOP_S = 0.01
_PITCH_S = 0.04  # two periods of a 50-Hz voice
_PITCH_HZ = (60.0, 400.0)
_CLEAR = 0.5  # a frame is voiced when its normalised autocorrelation at the period is at least this
_MIN_FRAMES = 10


def _loud_frames(audio: np.ndarray, n: int, hop: int) -> np.ndarray:
    """(k, n) float64 frames every ``hop`` samples of the window's loud stretches (empty when it has none)."""
    count = (len(audio) - n) // hop + 1
    if count < 1:
        return np.zeros((0, n))
    idx = np.arange(count)[:, None] * hop + np.arange(n)[None]
    frames = audio[idx].astype(np.float64)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    return frames[rms >= _LOUD * max(float(np.percentile(rms, 90)), 1e-6)]


def pitch_hz(audio: np.ndarray, rate: int) -> float | None:
    """Median pitch (Hz) of the window's voiced 40-ms frames, None when fewer than ten are. audio: (n,) float32 at
    ``rate`` Hz."""
    n = round(_PITCH_S * rate)
    frames = _loud_frames(audio, n, round(_HOP_S * rate))
    if len(frames) < _MIN_FRAMES:
        return None
    frames -= frames.mean(axis=1, keepdims=True)
    power = np.abs(np.fft.rfft(frames, 2 * n)) ** 2
    ac = np.fft.irfft(power)[:, :n]
    ac /= np.maximum(ac[:, :1], 1e-12)
    lo, hi = int(rate / _PITCH_HZ[1]), int(rate / _PITCH_HZ[0])
    seg = ac[:, lo:hi]
    best = seg.max(axis=1)
    # the shortest lag nearly as alike as the best: the period, not a multiple of it
    lag = lo + np.argmax(seg >= 0.9 * best[:, None], axis=1)
    voiced = best >= _CLEAR
    if voiced.sum() < _MIN_FRAMES:
        return None
    return float(np.median(rate / lag[voiced]))
