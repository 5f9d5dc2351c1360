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


@dataclass(frozen=True)
class FaceReading:
    lip_gap: float  # inner lip distance, in the reference's eye distances
    mouth_width: float  # corner to corner, in the reference's eye distances
    eye_opening: float  # lid distance / eye width, both eyes
    head: np.ndarray  # (2, 3) similarity taking the reference's rigid landmarks onto this frame's
    mesh: fm.FaceMesh


class FaceTracker:
    """Landmarks frame after frame: found from a face box in the first frame, then followed."""

    def __init__(
        self,
        model: LandmarkModel,
        reference: fm.FaceMesh,
        *,
        image: np.ndarray | None = None,
        still: np.ndarray | None = None,
    ) -> None:
        """With the reference ``image`` and a ``still`` mask of it, the head pose is refined by aligning the
        frame's pixels to the reference's there (ECC), a tenth of a pixel where landmarks give about one."""
        self.model = model
        self.reference = reference
        self._grey = None if image is None else cv2.cvtColor(image, cv2.COLOR_RGB2GRAY).astype(np.float32)
        self._still = None if still is None else still.astype(np.uint8)
        self._box: tuple[int, int, int, int] | None = None
        if self._grey is not None and self._still is not None and self._still.any():
            # ECC over the still region's box only (with a margin for the head's travel): its cost is per pixel.
            x, y, w, h = cv2.boundingRect(self._still)
            m = round(0.1 * max(w, h))
            x0, y0 = max(0, x - m), max(0, y - m)
            x1, y1 = min(self._grey.shape[1], x + w + m), min(self._grey.shape[0], y + h + m)
            self._box = (x0, y0, x1, y1)
        self.scale = reference.eye_distance
        self._last: fm.FaceMesh | None = None
        self._head: np.ndarray | None = None  # the previous frame's refined pose
        self._detector = FaceDetector()

    def read(self, frame: np.ndarray) -> FaceReading:
        mesh = self.model.track(frame, self._last) if self._last is not None else None
        if mesh is None:
            layout = self._detector.detect(frame)
            mesh = self.model.from_box(frame, layout.face) if layout is not None else None
        if mesh is None:
            raise AvatarRenderError("No face found in a frame of the video; the face measures need one in every frame.")
        self._last = mesh
        head, _ = cv2.estimateAffinePartial2D(self.reference.at(fm.RIGID), mesh.at(fm.RIGID), method=cv2.LMEDS)
        if self._grey is not None:
            grey = cv2.cvtColor(frame, cv2.COLOR_RGB2GRAY).astype(np.float32)
            # From the landmarks' estimate and from the previous frame's pose (the landmarks' eye corners and
            # brows move in a blink, and the pose read from them with them): the better-fitting refinement.
            best = max(
                (self._refine(grey, start) for start in (head, self._head) if start is not None),
                key=lambda r: r[0],
                default=(-1.0, None),
            )
            if best[1] is not None:
                head = best[1]
            self._head = head
        return FaceReading(
            lip_gap=mesh.lip_gap() / self.scale,
            mouth_width=mesh.mouth_width() / self.scale,
            eye_opening=mesh.eye_opening(),
            head=head,
            mesh=mesh,
        )


    def _refine(self, grey: np.ndarray, head: np.ndarray) -> tuple[float, np.ndarray | None]:
        """ECC alignment of the frame's still region to the reference's, from ``head``: (correlation, the
        refined (2, 3) pose), or (-1, None) when it does not converge or runs away from its start."""
        assert self._grey is not None and self._still is not None
        x0, y0, x1, y1 = self._box or (0, 0, grey.shape[1], grey.shape[0])
        # Both cropped at (x0, y0) (the mask marks the frame's pixels to use): the map between the crops
        # is the head's conjugated by that shift.
        shift = np.array([[1, 0, x0], [0, 1, y0], [0, 0, 1]], np.float64)
        back = np.linalg.inv(shift)
        try:
            rho, fine = cv2.findTransformECC(
                self._grey[y0:y1, x0:x1],
                grey[y0:y1, x0:x1],
                (back @ np.vstack([head, (0, 0, 1)]) @ shift)[:2].astype(np.float32),
                cv2.MOTION_AFFINE,
                (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 60, 1e-5),
                self._still[y0:y1, x0:x1],
                5,
            )
        except cv2.error:
            return -1.0, None
        fine = (shift @ np.vstack([fine.astype(np.float64), (0, 0, 1)]) @ back)[:2]
        # (ECC can run away on a frame; a refinement is only taken near where it started)
        if np.abs(fine[:, :2] - head[:, :2]).max() < 0.03 and np.abs(fine[:, 2] - head[:, 2]).max() < 8:
            return float(rho), fine
        return -1.0, None


def ssim_map(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Structural similarity of two (H, W) float32 grey images, per pixel (Gaussian window, sigma 1.5)."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    blur = lambda x: cv2.GaussianBlur(x, (11, 11), 1.5)  # noqa: E731
    ma, mb = blur(a), blur(b)
    va, vb, cov = blur(a * a) - ma * ma, blur(b * b) - mb * mb, blur(a * b) - ma * mb
    return ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))


def still_mask(mesh: fm.FaceMesh, shape: tuple[int, int]) -> np.ndarray:
    """(H, W) bool: the head and its surroundings without the mouth and jaw and without the eyes, which move.

    The mouth and jaw region is the face below the nose tip (the oval's lower part), grown by a quarter; each
    eye is its lid contours' box, grown to include the brow's travel."""
    h, w = shape
    keep = np.zeros((h, w), np.uint8)
    oval = mesh.at(fm.FACE_OVAL)
    centre = oval.mean(axis=0)
    cv2.fillPoly(keep, [np.round(centre + (oval - centre) * 1.25).astype(np.int32)], 1)
    move = np.zeros((h, w), np.uint8)
    _, ey = mesh.axes()
    # The lips carry the skin up to the nose with them: the mouth region starts a little above its tip.
    nose = float((mesh.points[1] - centre) @ ey) - 0.15 * mesh.eye_distance
    # (grown by a quarter: the chin's travel when the jaw drops)
    lower = [p for p in centre + (oval - centre) * 1.25 if (p - centre) @ ey > nose]
    if lower:
        d = mesh.eye_distance
        pts = np.array(
            lower + [mesh.points[61] - (0.35 * d, 0.1 * d), mesh.points[291] + (0.35 * d, -0.1 * d)], np.float32
        )
        cv2.fillPoly(move, [np.round(cv2.convexHull(pts)).astype(np.int32)], 1)
    for upper, low in ((fm.LEFT_EYE_UPPER, fm.LEFT_EYE_LOWER), (fm.RIGHT_EYE_UPPER, fm.RIGHT_EYE_LOWER)):
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
