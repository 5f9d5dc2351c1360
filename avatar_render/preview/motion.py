"""Preview motion: mouth shapes scaled by loudness, seeded blinks, head sway with nods on emphasis, as
per-frame parameters.

A frame's motion is a row of ``PARAMS``; what one chunk hands to the next is ``MotionCarry``. Blinks
and nods are functions of events (blink starts, emphasis peaks) that the carry remembers for a few
seconds, so an I chunk regenerating a seam reproduces them exactly; only the mouth is regenerated.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

PARAMS = (
    "open",
    "width",
    "blink",
    "dx",
    "dy",
    "roll",
    "zoom",
)  # open, width in [-1, 1] (see shapes); blink in [0, 1]; dx, dy in face widths; roll in degrees
OPEN, WIDTH, BLINK, DX, DY, ROLL, ZOOM = range(len(PARAMS))
MOUTH = slice(OPEN, WIDTH + 1)
HEAD = slice(DX, ZOOM + 1)

SILENCE_DB = -50.0  # below this (dBFS) the mouth rests
# A quiet recording is heard as if its speech peaked here: its levels are lifted by how far its loudest speech so far
# lies under this (dBFS, 60-ms windows; the example's peak at -12). A window holds speech when its loudest frame lies
# SPEECH_RANGE_DB or more above its quiet ones (5th percentile): steady noise, or hum, has no such range.
QUIET_PEAK_DB = -20.0
SPEECH_RANGE_DB = 25.0
DC_LIMIT = 1e-3  # an offset this far from zero (-60 dBFS) is taken out before the levels are read
RANGE_DB = 30.0  # dynamic range below the running peak mapped onto the opening
PEAK_FALL_DB_S = 4.0  # how fast the running peak forgets a loud passage
QUIET_GAIN, LOUD_GAIN = 0.0, 1.0  # opening at the bottom and at the top of that range
LEVEL_POWER = 1.7  # how much faster than the level in dB the opening grows
OPEN_FLOOR = 0.4  # opening of the narrowest open sound (as a fraction of the widest's)
BLINK_S = (0.07, 0.08, 0.12)  # closing, closed, opening
EMPHASIS_DB = 6.0  # a rise this far above the slow level is an emphasis
SLOW_LEVEL_S = 0.4  # time constant of the slow level
NOD_S = 0.5  # length of a nod
NOD_GAP_S = 0.3  # shortest time between two nods
PAUSE_CLOSE = 1.0  # how far the lips close in a pause (1: they meet)
CLOSURE_SATURATE = 1.5  # a lip closure that co-articulation leaves 1 / this done is made complete
PAUSE_HOLD_S = 2.0  # they stay so for this long after speech stops
PAUSE_FADE_S = 1.5  # then go back to the reference's mouth over this long


@dataclass(frozen=True)
class MotionCarry:
    mouth_ahead: tuple[tuple[float, float], ...] = ()  # the last chunk's mouth for the next frames (a T=0 seam)
    peak_db: float = -20.0  # running speech peak
    next_blink: int = -1  # frame of the next blink start; -1 = not drawn yet
    blink_starts: tuple[int, ...] = ()  # the latest blink starts, oldest first
    blinks: int = 0  # blinks drawn so far (seeds the next interval)
    level_db: float = SILENCE_DB  # slow speech level at the last frame
    nods: tuple[tuple[int, float], ...] = ()  # recent emphasis (frame, strength), oldest first
    last_speech: int = -1  # the latest frame of speech so far; -1: none yet
    speech_db: float | None = None  # the loudest speech heard so far (dBFS, before any lift); None: none yet


def without_offset(audio: np.ndarray, *, rate: int) -> np.ndarray:
    """The (n,) window at ``rate`` Hz less its DC offset where it has one: the median of its 10-ms means, when that
    lies more than DC_LIMIT from zero (speech's own means scatter either side of zero; an offset sits in every one).
    The zeros a window is padded with before the recording's start and past its end are silence, not the recording:
    they stay zeros and are not counted (an offset taken from them would be a loud step at the recording's edge)."""
    nonzero = np.flatnonzero(audio)
    if not len(nonzero):
        return audio
    lo, hi = int(nonzero[0]), int(nonzero[-1]) + 1
    hop = max(1, rate // 100)
    if hi - lo < hop:
        return audio
    offset = float(np.median(audio[lo : lo + (hi - lo) // hop * hop].reshape(-1, hop).mean(axis=1)))
    if abs(offset) <= DC_LIMIT:
        return audio
    out = audio.astype(np.float32)  # (a copy)
    out[lo:hi] -= np.float32(offset)
    return out


def frame_energy_db(
    audio: np.ndarray, *, rate: int, fps: Fraction, first: int, num_frames: int, pad_s: float, window_start: int
) -> np.ndarray:
    """RMS level in dBFS of a 1.5-frame window around the centres of frames first .. first + num_frames, from
    audio (n,) that starts at frame ``window_start`` minus ``pad_s`` seconds. -> (num_frames,) float32."""
    sq = np.concatenate([[0.0], np.cumsum(audio.astype(np.float64) ** 2)])
    centres = (first - window_start + np.arange(num_frames) + 0.5) / float(fps) + pad_s
    half = 0.75 / float(fps)
    lo = np.clip(np.round((centres - half) * rate).astype(np.int64), 0, len(audio))
    hi = np.clip(np.round((centres + half) * rate).astype(np.int64), 0, len(audio))
    mean_sq = (sq[hi] - sq[lo]) / np.maximum(hi - lo, 1)
    return (10.0 * np.log10(mean_sq + 1e-12)).astype(np.float32)


def lifted(energy_db: np.ndarray, speech_db: float | None) -> tuple[np.ndarray, float | None]:
    """A window's frame levels (n,) dB lifted for a quiet recording, and the loudest speech heard so far after it:
    by how far that lies under QUIET_PEAK_DB (never lowered: a recording at a usual level is heard as it is)."""
    if len(energy_db) and float(energy_db.max() - np.percentile(energy_db, 5)) >= SPEECH_RANGE_DB:
        loudest = float(energy_db.max())
        speech_db = loudest if speech_db is None else max(speech_db, loudest)
    lift = 0.0 if speech_db is None else max(0.0, QUIET_PEAK_DB - speech_db)
    return (energy_db + np.float32(lift) if lift > 0 else energy_db), speech_db


def loudness_targets(energy_db: np.ndarray) -> np.ndarray:
    """Without phones: an open-ish mouth wherever there is sound. (n,) -> (n, 2) (open, width)."""
    out = np.zeros((len(energy_db), 2), np.float32)
    out[:, 0] = np.where(energy_db > SILENCE_DB, 0.6, 0.0)
    return out


def running_peak(energy_db: np.ndarray, peak_db: float, *, fps: Fraction) -> np.ndarray:
    """The running speech peak after each frame, starting from ``peak_db``. (n,) -> (n,)."""
    fall = PEAK_FALL_DB_S / float(fps)
    out = np.empty(len(energy_db), np.float32)
    peak = peak_db
    for i, db in enumerate(energy_db.tolist()):
        peak = max(db, peak - fall, SILENCE_DB + RANGE_DB)
        out[i] = peak
    return out


def speaking(energy_db: np.ndarray, peak_db: np.ndarray) -> np.ndarray:
    """How much each frame is speech rather than a pause, (n,) float32 in [0, 1]: 0 at the bottom of the
    loudness range below the running peak (or under SILENCE_DB), 1 from 6 dB above it."""
    floor = np.maximum(peak_db - RANGE_DB, SILENCE_DB)
    v = np.clip((energy_db - floor) / 6.0, 0.0, 1.0)
    return np.convolve(np.pad(v, 1, mode="edge"), [0.25, 0.5, 0.25], mode="valid").astype(np.float32)


def pause_track(
    first: int, speech: np.ndarray, last_speech: int, *, start: int, end: int, fps: Fraction
) -> tuple[np.ndarray, int]:
    """How far the lips have relaxed shut at frames first .. first + len(speech), (n,) float32 in [0, 1]: a
    speaker closes the mouth in a pause, and only after a long silence goes back to the reference's own
    mouth (which the video also starts with). speech: ``speaking()`` of those frames; last_speech: the
    last frame of speech before frame ``start`` (-1: none yet). Returns the track and the last frame of
    speech before frame ``end`` (the carry for the next chunk)."""
    rate = float(fps)
    hold, fade = PAUSE_HOLD_S * rate, PAUSE_FADE_S * rate
    out = np.zeros(len(speech), np.float32)
    last, carried = last_speech, last_speech
    for i, v in enumerate(speech.tolist()):
        f = first + i
        if f >= start and v > 0.5:
            last = f
        if f == end - 1:
            carried = last
        if last < 0:
            continue
        u = min(max((f - last - hold) / fade, 0.0), 1.0)
        out[i] = 1.0 - u * u * (3 - 2 * u)
    return out, carried


def shape_mouth(
    targets: np.ndarray, energy_db: np.ndarray, peak_db: np.ndarray, *, gain: float, pause: np.ndarray | None = None
) -> np.ndarray:
    """Targets (n, 2) scaled by loudness: louder speech opens wider; closures stay closed. In pauses the
    lips close (``pause``: how far, see ``pause_track``; without it they rest at the reference's mouth)."""
    level = np.clip((energy_db - (peak_db - RANGE_DB)) / RANGE_DB, 0.0, 1.0)
    level = np.convolve(np.pad(level, 1, mode="edge"), [0.25, 0.5, 0.25], mode="valid")  # no one-frame flicker
    voiced = speaking(energy_db, peak_db)
    rest = np.zeros(len(targets), np.float32) if pause is None else -PAUSE_CLOSE * pause
    o, w = targets[:, 0], targets[:, 1]
    out = np.empty_like(targets)
    # How far the jaw drops follows the loudness (the syllable's energy); the sound's own openness (a wide
    # "ah", a narrow "ee", a consonant) shapes it. Closures saturate: a lip closure that co-articulation
    # leaves 1 / CLOSURE_SATURATE done is made complete.
    openness = np.minimum(OPEN_FLOOR + (1 - OPEN_FLOOR) * o / 0.9, 1.0)
    loud = QUIET_GAIN + (LOUD_GAIN - QUIET_GAIN) * level**LEVEL_POWER
    shaped = np.where(o > 0, openness * loud * gain, np.maximum(o * CLOSURE_SATURATE, -1.0))
    out[:, 0] = shaped * voiced + rest * (1 - voiced)
    out[:, 1] = w * voiced
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def blink_track(
    start: int, num_frames: int, carry: MotionCarry, *, fps: Fraction, interval_s: float, seed: int, advance: bool
) -> tuple[np.ndarray, MotionCarry]:
    """Eyelid closure per frame. With ``advance``, new blinks are drawn (an N chunk); without, only the
    remembered ones are replayed (an I chunk, within frames already drawn)."""
    out = np.zeros(num_frames, np.float32)
    if interval_s <= 0:
        return out, carry
    rate = float(fps)
    next_blink, starts, blinks = carry.next_blink, list(carry.blink_starts), carry.blinks
    if next_blink < 0:
        next_blink = _blink_gap(seed, 0, interval_s, rate) // 2
    for i in range(num_frames):
        f = start + i
        if advance and f >= next_blink:
            starts, blinks = starts + [next_blink], blinks + 1
            next_blink = next_blink + _blink_gap(seed, blinks, interval_s, rate)
        last = max((s for s in starts if s <= f), default=None)
        out[i] = 0.0 if last is None else _blink_shape((f - last) / rate)
    if not advance:
        return out, carry
    # An I chunk reaches back at most half a chunk before the next one: keep what can still show there.
    starts = [s for s in starts if s >= start - num_frames - round((sum(BLINK_S) + 0.5) * rate)]
    return out, dataclasses.replace(carry, next_blink=next_blink, blink_starts=tuple(starts), blinks=blinks)


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


def emphasis(start: int, energy_db: np.ndarray, carry: MotionCarry, *, fps: Fraction) -> MotionCarry:
    """Find the emphasis peaks of an N chunk's frames (a rise above the slow level) and remember them."""
    rate = float(fps)
    alpha = 1.0 - math.exp(-1.0 / (SLOW_LEVEL_S * rate))
    level, nods = carry.level_db, list(carry.nods)
    gap = round(NOD_GAP_S * rate)
    for i, db in enumerate(np.maximum(energy_db, SILENCE_DB).tolist()):
        f = start + i
        rise = db - level
        if rise > EMPHASIS_DB and db > SILENCE_DB + 10 and (not nods or f - nods[-1][0] >= gap):
            nods.append((f, min(1.0, (rise - EMPHASIS_DB) / 12.0 + 0.3)))
        level += alpha * (db - level)
    nods = [n for n in nods if n[0] >= start - len(energy_db) - round((NOD_S + 0.5) * rate)]  # (as blink starts)
    return dataclasses.replace(carry, level_db=float(level), nods=tuple(nods))


def head_track(
    start: int, num_frames: int, carry: MotionCarry, *, fps: Fraction, amount: float, seed: int
) -> np.ndarray:
    """(num_frames, 4) dx, dy, roll, zoom: slow seeded sway (a function of absolute time) and a small nod
    after each remembered emphasis."""
    rate = float(fps)
    frames = start + np.arange(num_frames)
    t = frames / rate
    rng = np.random.default_rng([seed, 0x4EAD])
    phases = rng.uniform(0, 2 * math.pi, size=(4, 2))
    freqs = np.array([[0.11, 0.27], [0.09, 0.23], [0.07, 0.19], [0.05, 0.13]])  # Hz
    waves = np.sin(2 * math.pi * freqs[None] * t[:, None, None] + phases[None])  # (T, 4, 2)
    sway = 0.65 * waves[..., 0] + 0.35 * waves[..., 1]
    scale = np.array([0.014, 0.008, 1.4, 0.006], np.float32) * amount
    out = (sway * scale).astype(np.float32)
    nod = np.zeros(num_frames)
    for f, strength in carry.nods:
        u = (frames - f) / (NOD_S * rate)
        nod += strength * np.where((u >= 0) & (u < 1), np.sin(math.pi * u) ** 2, 0.0)
    out[:, 1] += (0.012 * amount * nod).astype(np.float32)  # down and back up
    out[:, 2] += (-0.4 * amount * nod * math.cos(seed)).astype(np.float32)  # with a slight tilt
    return out
