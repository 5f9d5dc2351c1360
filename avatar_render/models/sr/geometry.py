"""From the generation size to the output size: scale to cover the output frame, crop the overflow
evenly (a few pixels when the two aspect ratios differ by a rounding), never stretch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Cover:
    src: tuple[int, int]  # (width, height) of the frames going in
    dst: tuple[int, int]  # (width, height) of the frames coming out

    @property
    def scale(self) -> float:
        return max(self.dst[0] / self.src[0], self.dst[1] / self.src[1])

    @property
    def resized(self) -> tuple[int, int]:
        """(width, height) after scaling, before the crop."""
        s = self.scale
        return max(self.dst[0], round(self.src[0] * s)), max(self.dst[1], round(self.src[1] * s))

    @property
    def offset(self) -> tuple[int, int]:
        """(x, y) of the crop in the resized frame."""
        (rw, rh), (w, h) = self.resized, self.dst
        return (rw - w) // 2, (rh - h) // 2

    def point(self, x: float, y: float) -> tuple[float, float]:
        """A point in source pixels (continuous, pixel edges) -> output pixels."""
        (rw, rh), (ox, oy) = self.resized, self.offset
        return x * rw / self.src[0] - ox, y * rh / self.src[1] - oy

    def apply(self, frames: torch.Tensor, *, mode: str = "bilinear") -> torch.Tensor:
        """[N, C, h, w] -> [N, C, H, W] (float)."""
        (rw, rh), (ox, oy), (w, h) = self.resized, self.offset, self.dst
        if (frames.shape[-1], frames.shape[-2]) != (rw, rh):
            kw = {"align_corners": False} if mode in ("bilinear", "bicubic") else {}
            frames = F.interpolate(frames, size=(rh, rw), mode=mode, **kw)
        return frames[..., oy : oy + h, ox : ox + w]
