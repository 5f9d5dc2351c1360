"""Preview motion: speech energy -> mouth opening, seeded blinks and head sway, as per-frame parameters.

A frame's motion is a row of ``PARAMS``; continuity across chunks comes from ``MotionCarry``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

PARAMS = ("mouth", "eyes", "dx", "dy", "roll", "zoom")  # mouth/eyes in [0, 1]; dx, dy in face widths; roll in degrees
MOUTH, EYES, DX, DY, ROLL, ZOOM = range(len(PARAMS))

SILENCE_DB = -50.0  # below this (dBFS) the mouth stays shut
RANGE_DB = 30.0  # dynamic range mapped onto mouth opening, below the running peak
PEAK_FALL_DB_S = 4.0  # how fast the running peak forgets a loud passage
BLINK_S = (0.07, 0.04, 0.12)  # closing, closed, opening


@dataclass(frozen=True)
class MotionCarry:
    mouth: float = 0.0  # smoothed mouth opening at the last frame
    peak_db: float = -20.0  # running speech peak
    next_blink: int = -1  # frame of the next blink start; -1 = not drawn yet
    last_blink: int = -10**9  # start frame of the latest blink
    blinks: int = 0  # blinks drawn so far (seeds the next interval)


def frame_energy_db(audio: np.ndarray, *, rate: int, fps: Fraction, num_frames: int, pad_s: float) -> np.ndarray:
    """RMS level in dBFS of a 1.5-frame window around each frame centre. audio: (n,) -> (num_frames,)."""
    sq = np.concatenate([[0.0], np.cumsum(audio.astype(np.float64) ** 2)])
    centres = (np.arange(num_frames) + 0.5) / float(fps) + pad_s
    half = 0.75 / float(fps)
    lo = np.clip(np.round((centres - half) * rate).astype(np.int64), 0, len(audio))
    hi = np.clip(np.round((centres + half) * rate).astype(np.int64), 0, len(audio))
    mean_sq = (sq[hi] - sq[lo]) / np.maximum(hi - lo, 1)
    return (10.0 * np.log10(mean_sq + 1e-12)).astype(np.float32)


def per_frame(alpha_25: float, fps: Fraction) -> float:
    """A one-pole coefficient tuned at 25 fps, adjusted to another frame rate."""
    return 1.0 - (1.0 - alpha_25) ** (25.0 / float(fps))


def mouth_track(energy_db: np.ndarray, carry: MotionCarry, *, fps: Fraction, gain: float) -> tuple[np.ndarray, MotionCarry]:
    attack, release = per_frame(0.65, fps), per_frame(0.4, fps)
    fall = PEAK_FALL_DB_S / float(fps)
    out = np.empty(len(energy_db), np.float32)
    m, peak = carry.mouth, carry.peak_db
    for i, db in enumerate(energy_db.tolist()):
        peak = max(db, peak - fall, SILENCE_DB + RANGE_DB)
        target = 0.0 if db < SILENCE_DB else min(1.0, max(0.0, (db - peak + RANGE_DB) / RANGE_DB)) ** 1.5 * gain
        m += (attack if target > m else release) * (target - m)
        out[i] = m
    return out, MotionCarry(mouth=m, peak_db=peak, next_blink=carry.next_blink, last_blink=carry.last_blink, blinks=carry.blinks)


def blink_track(start: int, num_frames: int, carry: MotionCarry, *, fps: Fraction, interval_s: float, seed: int) -> tuple[np.ndarray, MotionCarry]:
    out = np.zeros(num_frames, np.float32)
    if interval_s <= 0:
        return out, carry
    rate = float(fps)
    next_blink, last_blink, blinks = carry.next_blink, carry.last_blink, carry.blinks
    if next_blink < 0:
        next_blink = _blink_gap(seed, 0, interval_s, rate) // 2
    for i in range(num_frames):
        f = start + i
        if f >= next_blink:
            last_blink, blinks = next_blink, blinks + 1
            next_blink = last_blink + _blink_gap(seed, blinks, interval_s, rate)
        out[i] = _blink_shape((f - last_blink) / rate)
    return out, MotionCarry(mouth=carry.mouth, peak_db=carry.peak_db, next_blink=next_blink, last_blink=last_blink, blinks=blinks)


def _blink_gap(seed: int, n: int, interval_s: float, rate: float) -> int:
    u = np.random.default_rng([seed, 0xB11, n]).uniform(0.4, 1.6)
    return max(int(round(u * interval_s * rate)), int(sum(BLINK_S) * rate) + 2)


def _blink_shape(u: float) -> float:
    close, hold, reopen = BLINK_S
    if u < 0 or u >= close + hold + reopen:
        return 0.0
    if u < close:
        return u / close
    if u < close + hold:
        return 1.0
    return 1.0 - (u - close - hold) / reopen


def head_track(start: int, num_frames: int, *, fps: Fraction, amount: float, seed: int, mouth: np.ndarray) -> np.ndarray:
    """(num_frames, 4) dx, dy, roll, zoom: slow seeded sway, a slight nod with speech; a function of absolute time."""
    t = (start + np.arange(num_frames)) / float(fps)
    rng = np.random.default_rng([seed, 0x4EAD])
    phases = rng.uniform(0, 2 * math.pi, size=(4, 2))
    freqs = np.array([[0.11, 0.27], [0.09, 0.23], [0.07, 0.19], [0.05, 0.13]])  # Hz
    waves = np.sin(2 * math.pi * freqs[None] * t[:, None, None] + phases[None])  # (T, 4, 2)
    sway = 0.65 * waves[..., 0] + 0.35 * waves[..., 1]
    scale = np.array([0.018, 0.010, 1.6, 0.008], np.float32) * amount
    out = (sway * scale).astype(np.float32)
    out[:, 1] += 0.006 * amount * mouth  # nod down a little while speaking
    return out
