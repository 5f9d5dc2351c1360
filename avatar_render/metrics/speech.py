"""Mouth movement against speech energy: does the mouth move when, and only when, there is speech?

Mouth activity at frame t is the mean absolute luma difference between the mouth region (moved with
the head) and the same region of the reference, whose mouth is at rest. The speech level at frame t is
the RMS of the audio during that frame, in dB, floored 40 dB below the loud passages.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import numpy as np

from avatar_render.face.patches import luma, mouth_region, patch
from avatar_render.io.audio import AudioReader
from avatar_render.metrics.regions import Reference
from avatar_render.metrics.series import Track, moving_average, pearson

AUDIO_RATE = 16_000
LEVEL_RANGE_DB = 40.0  # speech levels are clipped this far below the loud passages (99th percentile)
SILENCE_DB = 30.0  # a frame this far below the loud passages is silent
SILENCE_GUARD_S = 0.12  # silence must last this long on either side of a frame to count
MIN_SILENCE_S = 0.25  # less sustained silence than this gives no silence figure
REST_SEARCH_S = 10.0  # without a reference image, the mouth's rest is looked for this far in
MOTION = "mouth-region motion against its rest"
MAX_LAG_S = 0.4  # audio-video offsets searched on either side
_BLOCK = 500  # frames of audio read at a time


def iter_frame_levels(path: str | Path, *, fps: Fraction) -> Iterator[float]:
    """RMS of the audio (mono, 16 kHz) during each video frame, frame after frame, then zeros forever
    once the audio ends. Read a block at a time, in bounded memory; close() the iterator when done."""
    with AudioReader(path, fps=fps, model_rate=AUDIO_RATE) as audio:
        for a in itertools.count(0, _BLOCK):
            b = a + _BLOCK
            samples = audio.model_audio(a, b).astype(np.float64)  # (n,)
            # Frame i covers samples [round(i / fps * rate), round((i + 1) / fps * rate)) of the audio.
            edges = _edges(a, b, fps)
            sq = np.concatenate([[0.0], np.cumsum(samples**2)])
            yield from np.sqrt((sq[edges[1:]] - sq[edges[:-1]]) / np.maximum(edges[1:] - edges[:-1], 1)).tolist()
            audio.release(b)


def _edges(a: int, b: int, fps: Fraction) -> np.ndarray:
    """Sample offsets of frames a..b from the first sample of frame a, as the audio reader rounds them."""
    start = math.floor(Fraction(a) / fps * AUDIO_RATE + Fraction(1, 2))
    return np.array([math.floor(Fraction(i) / fps * AUDIO_RATE + Fraction(1, 2)) - start for i in range(a, b + 1)],
                    np.int64)


@dataclass(frozen=True)
class MouthSyncResult:
    correlation: float  # Pearson correlation of mouth activity and speech level, same frame
    best_lag_frames: int  # offset within +-MAX_LAG_S with the highest correlation; > 0: the mouth follows the audio
    best_lag_correlation: float
    silence_motion: float | None  # mouth activity above rest in silence / in speech (0 = still in silence)
    silence_s: float  # seconds of sustained silence found
    speech_s: float
    audio: str
    measure: str = MOTION  # what the mouth's series is


class MouthActivity:
    """Per frame: how far the mouth region is from its rest appearance.

    With a reference image, its mouth is the rest. With the first frame as the reference, the mouth
    may be open there, so the rest is taken from the quietest moment of the first ``REST_SEARCH_S``
    seconds; the mouth crops of those frames are held (a few kilobytes each) until it is chosen.
    """

    def __init__(self, reference: Reference, *, rest_from_reference: bool, fps: float) -> None:
        self.box = mouth_region(reference.layout)
        self.rest: np.ndarray | None = patch(luma(reference.image), self.box) if rest_from_reference else None
        self.values = Track()
        self._held: list[np.ndarray] = []
        self._levels: list[float] = []
        self._search = max(1, round(REST_SEARCH_S * fps))
        self._smooth = max(1, round(SILENCE_GUARD_S * fps)) * 2 + 1

    def update(self, gray: np.ndarray, shift: tuple[float, float], level: float | None) -> None:
        """level: the audio RMS during this frame (None without audio: the first frame is the rest)."""
        crop = patch(gray, self.box, shift=shift)
        if self.rest is None and level is None:
            self.rest = crop
        if self.rest is not None:
            self.values.append(float(np.abs(crop - self.rest).mean()))
            return
        self._held.append(crop)
        self._levels.append(float(level))
        if len(self._held) >= self._search:
            self.finish()

    def finish(self) -> None:
        """Choose the rest among the held frames, if not done yet, and measure them."""
        if self.rest is not None or not self._held:
            return
        quiet = moving_average(np.array(self._levels), self._smooth)
        self.rest = self._held[int(np.argmin(quiet))]
        for crop in self._held:
            self.values.append(float(np.abs(crop - self.rest).mean()))
        self._held, self._levels = [], []


def speech_level_db(rms: np.ndarray) -> tuple[np.ndarray, float]:
    """(T,) RMS -> (T,) level in dB clipped LEVEL_RANGE_DB below the loud passages, and that top level."""
    db = 20 * np.log10(rms + 1e-9)
    top = float(np.percentile(db, 99)) if len(db) else 0.0
    return np.clip(db, top - LEVEL_RANGE_DB, None), top


def mouth_sync(activity: np.ndarray, rms: np.ndarray, *, fps: float, audio: str,
               measure: str = MOTION) -> MouthSyncResult | None:
    """activity, rms: (T,) per frame. None when the audio holds no speech."""
    n = min(len(activity), len(rms))
    activity, rms = activity[:n], rms[:n]
    level, top = speech_level_db(rms)
    if n < 3 or top < -80:
        return None
    silent = level < top - SILENCE_DB
    guard = max(1, round(SILENCE_GUARD_S * fps))
    padded = np.pad(silent, guard, constant_values=True)
    sustained = np.lib.stride_tricks.sliding_window_view(padded, 2 * guard + 1).all(axis=1)  # (n,)
    speech = ~silent
    silence_motion = None
    if sustained.sum() >= MIN_SILENCE_S * fps and speech.sum() >= MIN_SILENCE_S * fps:
        rest = float(np.percentile(activity, 5))
        moving = float(activity[speech].mean()) - rest
        silence_motion = max(0.0, float(activity[sustained].mean()) - rest) / moving if moving > 1e-6 else 0.0
    max_lag = min(round(MAX_LAG_S * fps), n // 3)
    lags = {lag: pearson(activity[max(lag, 0) : n + min(lag, 0)], level[max(-lag, 0) : n - max(lag, 0)])
            for lag in range(-max_lag, max_lag + 1)}
    best = max(lags, key=lambda k: lags[k])
    return MouthSyncResult(
        correlation=lags[0], best_lag_frames=int(best), best_lag_correlation=lags[best],
        silence_motion=silence_motion, silence_s=float(sustained.sum() / fps), speech_s=float(speech.sum() / fps),
        audio=audio, measure=measure,
    )
