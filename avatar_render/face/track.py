"""Where a patch moved: translation against a template by phase correlation (the head's motion in
``inspect``, the face box on the low-res frames of the SR guard)."""

from __future__ import annotations

import numpy as np

TRACK_GROW = 1.2  # the tracked patch is the face box grown by this factor
_LOWPASS = 0.12  # Gaussian weight on the cross-power spectrum, sigma in cycles per pixel


class PhaseCorrelator:
    """Translation of a patch against a fixed template by phase correlation, to about 0.05 px.

    The normalised cross-power spectrum is weighted by a Gaussian low-pass, which turns the
    correlation peak into a smooth bump whose parabolic fit gives the sub-pixel position.
    """

    def __init__(self, template: np.ndarray) -> None:
        """template: (h, w) float32."""
        h, w = template.shape
        self.shape = (h, w)
        self.window = np.outer(np.hanning(h), np.hanning(w)).astype(np.float32)
        fy, fx = np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :]
        self.lowpass = np.exp(-(fx**2 + fy**2) / (2 * _LOWPASS**2))
        self.ref = np.conj(np.fft.rfft2(self._prepare(template)))

    def _prepare(self, p: np.ndarray) -> np.ndarray:
        return (p - p.mean()) * self.window

    def shift(self, image: np.ndarray) -> tuple[float, float, float]:
        """(dx, dy, peak): how far the content of ``image`` (same shape as the template) moved, in pixels
        (positive = right, down), and the peak height (1 = identical up to the shift, ~0 = unrelated)."""
        cross = np.fft.rfft2(self._prepare(image)) * self.ref
        size = np.abs(cross)
        cross /= size + 1e-12 * float(size.max()) + 1e-30
        corr = np.fft.irfft2(cross * self.lowpass, s=self.shape)
        h, w = self.shape
        py, px = np.unravel_index(int(np.argmax(corr)), corr.shape)
        dy = py + _vertex(corr[(py - 1) % h, px], corr[py, px], corr[(py + 1) % h, px])
        dx = px + _vertex(corr[py, (px - 1) % w], corr[py, px], corr[py, (px + 1) % w])
        peak = float(corr[py, px] / max(self.lowpass.sum() * 2 / (h * w), 1e-12))
        return float(dx - w if dx >= w / 2 else dx), float(dy - h if dy >= h / 2 else dy), min(peak, 1.0)


def _vertex(left: float, mid: float, right: float) -> float:
    """Offset of the top of the parabola through three neighbouring samples, in [-0.5, 0.5]."""
    den = left - 2 * mid + right
    return 0.0 if den >= 0 else float(np.clip(0.5 * (left - right) / den, -0.5, 0.5))
