"""Small helpers on per-frame series of scalars: growable storage, per-second summaries, trends."""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np


class Track:
    """A growable per-frame series of float32 values (4 bytes a frame, never a frame's pixels)."""

    def __init__(self) -> None:
        self._values = array("f")

    def append(self, value: float) -> None:
        self._values.append(float(value))

    def __len__(self) -> int:
        return len(self._values)

    def numpy(self) -> np.ndarray:
        return np.frombuffer(self._values, dtype=np.float32).astype(np.float64) if self._values else np.zeros(0)


def per_second(values: np.ndarray, fps: float, *, reduce=np.nanmean) -> np.ndarray:
    """(T,) per-frame values -> (ceil(T / fps),) one value per second of video (NaN where all are NaN)."""
    n = len(values)
    if n == 0:
        return np.zeros(0)
    edges = np.round(np.arange(0, int(np.ceil(n / fps)) + 1) * fps).astype(int)
    edges[-1] = n
    out = np.full(len(edges) - 1, np.nan)
    for i, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        chunk = values[a:b]
        if b > a and np.isfinite(chunk).any():
            out[i] = reduce(chunk)
    return out


def trend_per_minute(values: np.ndarray, fps: float) -> float:
    """Least-squares slope of a per-frame series, in units per minute of video (0 for < 2 finite values)."""
    t = np.arange(len(values)) / fps / 60.0
    ok = np.isfinite(values)
    if ok.sum() < 2 or np.ptp(t[ok]) == 0:
        return 0.0
    return float(np.polyfit(t[ok], values[ok], 1)[0])


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    """Correlation of two equal-length series; 0 when either is constant."""
    a, b = a - a.mean(), b - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 1e-12 else 0.0


def moving_average(values: np.ndarray, width: int) -> np.ndarray:
    """Centred moving average of odd ``width`` (edges averaged over what exists)."""
    if width <= 1 or len(values) == 0:
        return values.astype(np.float64)
    kernel = np.ones(width)
    num = np.convolve(values, kernel, mode="same")
    den = np.convolve(np.ones(len(values)), kernel, mode="same")
    return num / den


def running_median(values: np.ndarray, width: int, *, block: int = 8192) -> np.ndarray:
    """Centred running median of odd ``width``, computed a block at a time (bounded temporaries)."""
    half = width // 2
    padded = np.pad(values.astype(np.float64), half, mode="edge")
    out = np.empty(len(values))
    for a in range(0, len(values), block):
        b = min(a + block, len(values))
        windows = np.lib.stride_tricks.sliding_window_view(padded[a : b + 2 * half], width)  # (b - a, width)
        out[a:b] = np.median(windows, axis=1)
    return out


@dataclass(frozen=True)
class OverTime:
    """A metric over the video: overall mean, worst value, per-second values and the linear trend."""

    mean: float
    worst: float
    worst_s: float  # when the worst second starts
    per_second: tuple[float, ...]
    trend_per_min: float

    @staticmethod
    def of(values: np.ndarray, fps: float, *, worst_is_max: bool = True) -> OverTime:
        seconds = per_second(values, fps)
        finite = np.where(np.isfinite(seconds), seconds, -np.inf if worst_is_max else np.inf)
        i = int(np.argmax(finite) if worst_is_max else np.argmin(finite)) if len(seconds) else 0
        return OverTime(
            mean=float(np.nanmean(values)) if np.isfinite(values).any() else float("nan"),
            worst=float(seconds[i]) if len(seconds) else float("nan"),
            worst_s=float(i),
            per_second=tuple(round(float(v), 4) for v in seconds),
            trend_per_min=trend_per_minute(values, fps),
        )
