"""Face measures from dense landmarks found in each frame of a video: lip gap and width, eye opening,
head pose against the reference, and how much the rest of the face stays the reference (SSIM).

The landmarks come from ``face.landmarks.LandmarkModel`` run on the frames themselves (tracked from
frame to frame), never from the renderer's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.face import mesh as fm
from avatar_render.face.detect import FaceDetector
from avatar_render.face.landmarks import LandmarkModel

_MIN_POINTS = 12  # points of the still region found in a frame to refine its head pose from


@dataclass(frozen=True)
class FaceReading:
    lip_gap: float  # inner lip distance, in the reference's eye distances
    mouth_width: float  # corner to corner, in the reference's eye distances
    eye_opening: float  # lid distance / eye width, both eyes
    head: np.ndarray  # (2, 3) similarity taking the reference's rigid landmarks onto this frame's
    mesh: fm.FaceMesh


class FaceTracker:
    """Landmarks frame after frame: found from a face box in the first frame (or where the reference has its
    face), then followed."""

    def __init__(
        self,
        model: LandmarkModel,
        reference: fm.FaceMesh,
        *,
        image: np.ndarray | None = None,
        still: np.ndarray | None = None,
    ) -> None:
        """With the reference ``image`` and a ``still`` mask of it, the head pose is refined from the pixels:
        textured points of the still region followed from the reference into the frame (pyramidal
        Lucas-Kanade), and the similarity that fits them. On renders with a known head motion it is off by
        about 0.1 pixel, where the landmarks' pose is off by one to three."""
        self.model = model
        self.reference = reference
        self._grey: np.ndarray | None = None  # (H, W) uint8
        self._points: np.ndarray | None = None  # (n, 1, 2) float32 pixel centres in the reference
        if image is not None and still is not None and still.any():
            self._grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
            # (kept two pixels inside the region: a point on its edge is half on what moves)
            inside = cv2.erode(still.astype(np.uint8), np.ones((5, 5), np.uint8))
            points = cv2.goodFeaturesToTrack(self._grey, 400, 0.005, 3, mask=inside)
            if points is not None and len(points) >= _MIN_POINTS:
                self._points = points.astype(np.float32)
        self.scale = reference.eye_distance
        self._last: fm.FaceMesh | None = None
        self._detector = FaceDetector()

    def read(self, frame: np.ndarray) -> FaceReading:
        mesh = self.model.track(frame, self._last) if self._last is not None else None
        if mesh is None:
            layout = self._detector.detect(frame)
            mesh = self.model.from_box(frame, layout.face) if layout is not None else None
        if mesh is None:  # (the cascade misses some faces behind drawn spectacle frames: the reference's place)
            mesh = self.model.track(frame, self.reference)
        if mesh is None:
            raise AvatarRenderError("No face found in a frame of the video; the face measures need one in every frame.")
        self._last = mesh
        head, _ = cv2.estimateAffinePartial2D(self.reference.at(fm.RIGID), mesh.at(fm.RIGID), method=cv2.LMEDS)
        if self._points is not None:
            head = self._refine(cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY), head)
        return FaceReading(
            lip_gap=mesh.lip_gap() / self.scale,
            mouth_width=mesh.mouth_width() / self.scale,
            eye_opening=mesh.eye_opening(),
            head=head,
            mesh=mesh,
        )

    def _refine(self, grey: np.ndarray, head: np.ndarray) -> np.ndarray:
        """The (2, 3) similarity taking the still region's points to where they are found in the frame (grey:
        (H, W) uint8), searched from where ``head`` puts them; ``head`` itself when too few are found.

        A similarity, as the landmarks' pose and the preview's head motion: an affine fit of the region's
        pixels (ECC) also bends to its edges, where the mouth and the lids move; on the example's render it
        was off by 0.36 pixel on average and up to 0.9, this by 0.1 and up to 0.2."""
        assert self._grey is not None and self._points is not None
        start = cv2.transform(self._points, head.astype(np.float64)).astype(np.float32)
        found, status, _ = cv2.calcOpticalFlowPyrLK(
            self._grey,
            grey,
            self._points,
            start.copy(),
            winSize=(13, 13),
            maxLevel=2,
            criteria=(cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 50, 1e-3),
            flags=cv2.OPTFLOW_USE_INITIAL_FLOW,
        )
        ok = status.ravel() == 1
        if ok.sum() < _MIN_POINTS:
            return head
        fine, _ = cv2.estimateAffinePartial2D(self._points[ok], found[ok], method=cv2.LMEDS)
        return head if fine is None else fine


def ssim_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Structural similarity of two (H, W) float32 grey images, per pixel (Gaussian window, sigma 1.5)."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    blur = lambda x: cv2.GaussianBlur(x, (11, 11), 1.5)  # noqa: E731
    ma, mb = blur(a), blur(b)
    va, vb, cov = blur(a * a) - ma * ma, blur(b * b) - mb * mb, blur(a * b) - ma * mb
    return ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))


def still_mask(mesh: fm.FaceMesh, shape: tuple[int, int]) -> np.ndarray:
    """(H, W) bool: the head and its surroundings without the mouth and jaw and without the eyes, which move.

    The mouth and jaw region is the face below a line 0.15 eye distances above the nose tip (the oval's lower
    part), grown by a quarter; each eye is its lid contours' box, grown to include the brow's travel."""
    h, w = shape
    keep = np.zeros((h, w), np.uint8)
    oval = mesh.at(fm.FACE_OVAL)
    centre = oval.mean(axis=0)
    cv2.fillPoly(keep, [np.round(centre + (oval - centre) * 1.25).astype(np.int32)], 1)
    move = np.zeros((h, w), np.uint8)
    _, ey = mesh.axes()
    # The lips carry the skin up to the nose with them: the mouth region starts a little above its tip.
    nose = float((mesh.points[1] - centre) @ ey) - 0.15 * mesh.eye_distance
    # The oval grown by a quarter (the chin's travel when the jaw drops), cut at that line where its edges cross
    # it: its own points are too far apart on the sides to stand for the line (they put it below the nose tip).
    grown = centre + (oval - centre) * 1.25
    depth = (grown - centre) @ ey - nose
    lower = [q for q, t in zip(grown, depth) if t > 0]
    for a, b, ta, tb in zip(grown, np.roll(grown, -1, axis=0), depth, np.roll(depth, -1)):
        if (ta > 0) != (tb > 0):
            lower.append(a + (b - a) * (ta / (ta - tb)))
    if lower:
        d = mesh.eye_distance
        pts = np.array(
            lower + [mesh.points[61] - (0.35 * d, 0.1 * d), mesh.points[291] + (0.35 * d, -0.1 * d)], np.float32
        )
        cv2.fillPoly(move, [np.round(cv2.convexHull(pts)).astype(np.int32)], 1)
    for upper, low in fm.EYES:
        pts = mesh.at(upper + low)
        c, size = pts.mean(axis=0), pts.max(axis=0) - pts.min(axis=0)
        lo, hi = c - size * (0.8, 1.6), c + size * (0.8, 1.4)
        cv2.rectangle(move, tuple(np.round(lo).astype(int)), tuple(np.round(hi).astype(int)), 1, -1)
    return (keep > 0) & (move == 0)


def undo_head(frame: np.ndarray, head: np.ndarray) -> np.ndarray:
    """The frame warped back by its head similarity (reference geometry); bicubic, so that the measure adds
    less blur of its own than a bilinear resampling would."""
    h, w = frame.shape[:2]
    return cv2.warpAffine(
        frame, cv2.invertAffineTransform(head), (w, h), flags=cv2.INTER_CUBIC, borderMode=cv2.BORDER_REPLICATE
    )


def lip_aperture(gray: np.ndarray, mesh: fm.FaceMesh, lip_luma: float, *, contrast: float = 40.0) -> float:
    """How far apart the lips are, read from the pixels between them (pixels): in the middle 40 % of the
    mouth, the length of the line from the outer upper to the outer lower lip contour (landmarks found in
    the frame) whose grey level differs from the lips' own (``lip_luma``) by ``contrast`` or more (teeth,
    the dark of the mouth), the median over columns. Such pixels joined to either end of the line are not
    counted: they lie outside the lips (skin beyond a contour the landmark model placed a pixel off), and
    they made lips pressed together read about a pixel. gray: (H, W) float32."""
    ex, ey = mesh.axes()
    c = (mesh.points[61] + mesh.points[291]) / 2
    half = mesh.mouth_width() / 2
    up, low = mesh.at(fm.LIPS_OUTER_UPPER), mesh.at(fm.LIPS_OUTER_LOWER)
    su, sl = (up - c) @ ex, (low - c) @ ex
    tu, tl = (up - c) @ ey, (low - c) @ ey
    step = 0.5  # pixels along each column
    runs = []
    for s in np.linspace(-0.4 * half, 0.4 * half, 9):
        t0, t1 = float(np.interp(s, su, tu)), float(np.interp(s, sl, tl))
        if t1 <= t0:
            runs.append(0.0)
            continue
        ts = np.arange(t0, t1, step)
        x = (c[0] + s * ex[0] + ts * ey[0] - 0.5).astype(np.float32)[None]
        y = (c[1] + s * ex[1] + ts * ey[1] - 0.5).astype(np.float32)[None]
        values = cv2.remap(gray, x, y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)[0]
        off = np.abs(values - lip_luma) >= contrast
        lips = np.flatnonzero(~off)
        runs.append(float(np.sum(off[lips[0] : lips[-1] + 1]) if len(lips) else len(off)) * step)
    return float(np.median(runs))
