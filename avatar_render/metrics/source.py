"""``inspect --ref video.mp4``: each output frame against the source frame at the same time.

The source is fitted as the render fitted it (the preview's smoothed face track, or the diffusion
backend's crop of the first frame) and played under the same timing policy. Outside the mouth and jaw
the output should be the source (motion kept); inside, it should differ (mouth changed); against the
source's *first* frame the output should differ as much as the video moves. A ping-pong loop's turns are
read like seams: the frame-to-frame change there against the change of the frames either side.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from avatar_render.backends import BACKENDS
from avatar_render.face import mesh as fm
from avatar_render.face.detect import FaceDetector
from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.io.reference import open_reference
from avatar_render.io.video_source import VideoReference
from avatar_render.metrics.seams import STILL
from avatar_render.metrics.series import Track
from avatar_render.preview.dub import DubSource, FrameCache, fitted_frame, scan_faces

_CACHE = 128 << 20


@dataclass(frozen=True)
class SourceResult:
    timing: str
    source_frames: int
    source_fps: float
    outside_mouth_vs_source: float  # median over frames of the mean absolute luma difference, grey levels
    outside_mouth_vs_first: float  # the same against the source's first frame
    mouth_vs_source: float  # inside the mouth and jaw region, against the source at the same time
    wraps: tuple[int, ...]  # output frames where a ping-pong loop turns
    wrap_ratio: float | None  # worst change at a turn / the change of the frames either side (1.0 = invisible)


def lower_face(mesh: fm.FaceMesh, width: int, height: int) -> np.ndarray:
    """(height, width) bool: the mouth and jaw region (the face outline below the nose, the lips, grown by a
    fifth of the mouth width), where a dub moves pixels."""
    nose = mesh.points[1]
    _, ey = mesh.axes()
    pts = mesh.points[((mesh.points - nose) @ ey) >= 0]
    hull = cv2.convexHull(np.concatenate([pts, mesh.at(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER)]).astype(np.float32))
    mask = np.zeros((height, width), np.uint8)
    cv2.fillConvexPoly(mask, np.round(hull).astype(np.int32), 1)
    grow = max(1, int(0.2 * mesh.mouth_width()))
    return cv2.dilate(mask, np.ones((2 * grow + 1, 2 * grow + 1), np.uint8)) > 0


class SourceComparison:
    """Per output frame: differences to the fitted source frame at its time (and to the first one)."""

    def __init__(self, video: VideoReference, *, width: int, height: int, backend: str,
                 face_box: list[int] | None, face_index: int | None = None, landmarks: str = "auto") -> None:
        self.fps = float(video.timeline.fps)
        path = find_model(landmarks)
        model = LandmarkModel(path) if path is not None else None
        track = scan_faces(video, FaceDetector(index=face_index), model, face_box)
        own = BACKENDS.get(backend)
        if (own is None or not own.rig) and track.boxes is not None:  # the first frame's crop for all
            track = type(track)(boxes=np.repeat(track.boxes[:1], len(track.boxes), axis=0), found=track.found,
                                sampled=track.sampled)
        self.src = DubSource(video=video, track=track, rig=None, width=width, height=height, landmarks=model,
                             reader=video.frames(), cache=FrameCache(_CACHE))
        first, _ = fitted_frame(self.src, 0)
        self.first = cv2.cvtColor(first, cv2.COLOR_RGB2GRAY).astype(np.int16)
        self.outside, self.outside_first, self.inside = Track(), Track(), Track()
        self.index: list[int] = []
        self._at: tuple[int, np.ndarray, fm.FaceMesh | None] | None = None  # (output frame, source image, mesh)

    def frame(self, frame_number: int) -> np.ndarray:
        """(H, W, 3) uint8 RGB: the source frame shown at output frame ``frame_number``, fitted as the render
        fitted it (the metrics compare each output frame with it)."""
        if self._at is None or self._at[0] != frame_number:
            image, mesh = fitted_frame(self.src, self.src.video.timeline.source_index(frame_number))
            self._at = (frame_number, image, mesh)
        return self._at[1]

    def update(self, frame_number: int, gray: np.ndarray) -> None:
        index = self.src.video.timeline.source_index(frame_number)
        image = self.frame(frame_number)
        mesh = self._at[2]
        source = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY).astype(np.int16)
        out = gray.astype(np.int16)
        if source.shape != out.shape:
            return
        mask = lower_face(mesh, out.shape[1], out.shape[0]) if mesh is not None else np.zeros(out.shape, bool)
        diff = np.abs(out - source)
        rest = ~mask
        self.outside.append(float(diff[rest].mean()) if rest.any() else np.nan)
        self.outside_first.append(float(np.abs(out - self.first)[rest].mean()) if rest.any() else np.nan)
        self.inside.append(float(diff[mask].mean()) if mask.any() else np.nan)
        self.index.append(index)

    def result(self, change: np.ndarray) -> SourceResult:
        """change: (T,) the output's frame-to-frame change (NaN at frame 0)."""
        timeline = self.src.video.timeline
        idx = np.asarray(self.index)
        step = np.diff(idx)
        # A turn: the source index stops rising and starts falling, or the other way round.
        sign = np.sign(step)
        nz = np.flatnonzero(sign)
        wraps = tuple(int(nz[k + 1]) + 1 for k in range(len(nz) - 1) if sign[nz[k]] != sign[nz[k + 1]])
        ratio = None
        if wraps:
            # The change at a turn against the change just before and after it (the two nearest frames each
            # side that step as far through the source): a jump shows as a spike; the video's own speed there
            # (which a turn keeps) does not.
            size = np.abs(np.concatenate([[0], step]))[: len(change)]
            reach = max(3, round(0.5 * self.fps))
            ratios = []
            for w in wraps:
                if w >= len(change):
                    continue
                ok = lambda k: 0 < k < len(size) and size[k] == size[w] and np.isfinite(change[k])  # noqa: E731
                before = [k for k in range(w - 1, max(0, w - reach), -1) if ok(k)][:2]
                after = [k for k in range(w + 1, min(len(size), w + reach)) if ok(k)][:2]
                if before and after:
                    near = float(np.mean(change[before + after]))
                    ratios.append((float(change[w]) + STILL) / (near + STILL))
            ratio = max(ratios) if ratios else None
        self.src.reader.close()
        return SourceResult(
            timing=timeline.timing, source_frames=timeline.info.num_frames, source_fps=round(timeline.info.fps, 3),
            outside_mouth_vs_source=float(np.nanmedian(self.outside.numpy())),
            outside_mouth_vs_first=float(np.nanmedian(self.outside_first.numpy())),
            mouth_vs_source=float(np.nanmedian(self.inside.numpy())),
            wraps=wraps, wrap_ratio=ratio,
        )


def video_reference(path: str | Path, *, fps: Fraction, timing: str) -> VideoReference | None:
    """The video reference at ``path`` (None for an image)."""
    return open_reference(path, fps=fps, timing=timing)[1]
