"""The face guard of the one-step SR, without training: what the SR may change and what it may not.

* The face is tracked on the low-res frames: the reference's face patch is found in each frame by
  phase correlation (as ``inspect`` tracks the head) and the shift smoothed over time (the state
  carried across chunks).
* The mouth region (lips and the jaw's travel, from the reference layout moved with the face) is
  blended toward the fidelity path, the frames the A2V model made without re-synthesis (the low-res
  frame upscaled, or the 2x decode): inside the region the output *is* the fidelity path, so lip sync
  is never re-synthesised; the blend fades out over a margin around it.
* Colour is matched to the low-res frame: the output's low frequencies are replaced by the
  upscaled low-res frame's (the SR adds detail, not a colour cast).
* Identity: the face crop of each chunk's output and of the fidelity path are compared with the
  reference's face (the HOG descriptor ``inspect`` uses, ``face.identity``); when the SR's similarity falls more than
  ``identity_drop`` below the fidelity path's, the chunk is published from the fidelity path instead.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from avatar_render.face.identity import face_descriptor
from avatar_render.face.layout import Box, FaceLayout
from avatar_render.face.patches import luma, mouth_region, patch
from avatar_render.face.track import TRACK_GROW, PhaseCorrelator
from avatar_render.models.sr.geometry import Cover

log = logging.getLogger("avatar_render.sr")
_MIN_PEAK = 0.1  # a weaker phase-correlation peak than this is no match: the face stays where it was
_IDENTITY_EVERY = 4  # frames between two identity samples of a chunk


@dataclass(frozen=True)
class GuardSettings:
    mouth: float = 1.0  # 0..1: how much of the mouth region comes from the fidelity path
    colour: float = 1.0  # 0..1: how much of the low-res frame's low frequencies replace the SR's
    identity_drop: float = 0.05  # fall back when the SR's face similarity is this much below the fidelity path's
    smoothing: float = 0.5  # weight of the newest frame in the smoothed face shift


@dataclass(frozen=True)
class TrackState:
    """The smoothed face shift against the reference at the last frame, in low-res pixels."""

    dx: float = 0.0
    dy: float = 0.0


@dataclass(frozen=True)
class GuardResult:
    frames: torch.Tensor  # [T, 3, H, W] in [0, 1]
    similarity: float  # the SR output's face against the reference (1 = same)
    fidelity_similarity: float  # the fidelity path's
    fell_back: bool


class FaceGuard:
    def __init__(self, *, reference: np.ndarray, layout: FaceLayout, cover: Cover, settings: GuardSettings) -> None:
        self.layout, self.cover, self.settings = layout, cover, settings
        grey = luma(reference)
        self.tracker = PhaseCorrelator(patch(grey, layout.face, grow=TRACK_GROW))
        self.reference = face_descriptor(patch(grey, layout.face))

    def track(self, lowres: np.ndarray, state: TrackState) -> tuple[np.ndarray, TrackState]:
        """(T, h, w, 3) uint8 -> ((T, 2) smoothed face shift per frame in low-res pixels, state)."""
        dx, dy = state.dx, state.dy
        out = np.zeros((len(lowres), 2))
        a = self.settings.smoothing
        for i, frame in enumerate(lowres):
            sx, sy, peak = self.tracker.shift(patch(luma(frame), self.layout.face, shift=(dx, dy), grow=TRACK_GROW))
            if peak >= _MIN_PEAK:  # the patch was cut where the face was: its shift adds to that
                dx, dy = dx + a * sx, dy + a * sy
            out[i] = dx, dy
        return out, TrackState(float(dx), float(dy))

    def boxes(self, box: Box, shifts: np.ndarray) -> np.ndarray:
        """A low-res box moved by each shift -> (T, 4) [x0, y0, x1, y1] in output pixels."""
        out = np.zeros((len(shifts), 4))
        for i, (dx, dy) in enumerate(shifts):
            out[i, :2] = self.cover.point(box.x + dx, box.y + dy)
            out[i, 2:] = self.cover.point(box.x + box.w + dx, box.y + box.h + dy)
        return out

    def mouth_mask(self, shifts: np.ndarray, device: torch.device) -> torch.Tensor:
        """[T, 1, H, W]: 1 inside the mouth region, fading to 0 over a margin of a third of its height."""
        W, H = self.cover.dst
        boxes = torch.tensor(self.boxes(mouth_region(self.layout), shifts), dtype=torch.float32, device=device)
        feather = ((boxes[:, 3] - boxes[:, 1]) / 3).clamp_min(1.0)[:, None]  # [T, 1]
        xs = torch.arange(W, device=device, dtype=torch.float32)[None] + 0.5
        ys = torch.arange(H, device=device, dtype=torch.float32)[None] + 0.5

        def ramp(c: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
            return (torch.minimum(c - (lo[:, None] - feather), (hi[:, None] + feather) - c) / feather).clamp(0, 1)

        mx = ramp(xs, boxes[:, 0], boxes[:, 2])  # [T, W]
        my = ramp(ys, boxes[:, 1], boxes[:, 3])  # [T, H]
        return (my[:, :, None] * mx[:, None, :])[:, None]

    def similarity(self, frames: torch.Tensor, shifts: np.ndarray) -> float:
        """Mean face similarity to the reference over a sample of [T, 3, H, W] frames in [0, 1]."""
        W, H = self.cover.dst
        boxes = self.boxes(self.layout.face, shifts)
        values = []
        for i in range(0, frames.shape[0], _IDENTITY_EVERY):
            x0, y0, x1, y1 = boxes[i]
            x0, y0 = max(0, math.floor(x0)), max(0, math.floor(y0))
            x1, y1 = min(W, math.ceil(x1)), min(H, math.ceil(y1))
            if x1 - x0 < 8 or y1 - y0 < 8:
                continue
            crop = (frames[i, :, y0:y1, x0:x1].clamp(0, 1) * 255 + 0.5).to(torch.uint8).permute(1, 2, 0).cpu().numpy()
            values.append(float(face_descriptor(cv2.cvtColor(crop, cv2.COLOR_RGB2GRAY).astype(np.float32))
                                @ self.reference))
        return float(np.mean(values)) if values else float("nan")

    def apply(self, sr: torch.Tensor, fidelity: torch.Tensor, lowres_up: torch.Tensor,
              shifts: np.ndarray) -> GuardResult:
        """sr, fidelity, lowres_up: [T, 3, H, W] in [0, 1] (the SR output, the fidelity path, the low-res
        frames upscaled); shifts: (T, 2) the face's, from ``track``."""
        s = self.settings
        out = sr
        if s.colour > 0:
            k = 2 * max(1, round(2 * self.cover.scale)) + 1
            out = out + s.colour * (lowpass(lowres_up, k) - lowpass(out, k))
        if s.mouth > 0:
            out = torch.lerp(out, fidelity, s.mouth * self.mouth_mask(shifts, out.device))
        out = out.clamp(0, 1)
        sim, fid_sim = self.similarity(out, shifts), self.similarity(fidelity, shifts)
        fell_back = bool(sim < fid_sim - s.identity_drop)  # (NaN, no face crop: no decision, no fallback)
        return GuardResult(frames=fidelity if fell_back else out, similarity=sim, fidelity_similarity=fid_sim,
                           fell_back=fell_back)


def lowpass(x: torch.Tensor, k: int) -> torch.Tensor:
    """A k x k box filter applied twice (a triangle filter), edges averaged over what exists. [N, C, H, W].
    Each box is a row pass and a column pass (2k additions a pixel, not k^2)."""
    for _ in range(2):
        for kernel, pad in (((k, 1), (k // 2, 0)), ((1, k), (0, k // 2))):
            x = F.avg_pool2d(x, kernel, stride=1, padding=pad, count_include_pad=False)
    return x
