"""Dubbing a video reference with the preview backend: the output is the source video's frames, fitted
like a photo (the crop follows the face, smoothed), with only the mouth and jaw moved to the new audio.

Init scans the video once (streamed, a frame at a time) for the face: a detection every few frames,
interpolated and smoothed over time into one crop position per source frame (a few numbers a frame).
Each output frame is then the source frame at its time (``SourceTimeline``), cropped there, its
landmarks found, and its lower face warped from the source's own mouth opening to the audio's: the
source's mouth motion is taken out (its measured opening closed by the jaw) and the new one put in, by
one piecewise-affine warp of the mesh. Pixels outside the moving triangles are the source's.
Everything a frame shows is a function of its source frame's index alone, so a resumed render is
the same; fitted frames and their landmarks are kept in a bounded cache (``reference.cache_mb``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.face import mesh as fm
from avatar_render.face.detect import FaceDetector
from avatar_render.face.fit import Fit, fit_to_frame
from avatar_render.face.landmarks import LandmarkModel
from avatar_render.face.layout import Box
from avatar_render.files.names import shown
from avatar_render.io.video_source import SourceFrames, VideoReference
from avatar_render.pipeline.types import Frames, RequestInput
from avatar_render.preview.motion import OPEN, WIDTH
from avatar_render.preview.rig import contour_t, face_coords, mesh_vertices
from avatar_render.preview.shapes import JAW_DROP, LIP_RAISE, MouthShape
from avatar_render.preview.warp import Rect, backward_map, delaunay, polygon_mask

DETECT_PER_S = 10.0  # face positions measured per second of source video (interpolated between)
# The second detector looks at a sampled frame in tiles of half its side and more (faces of a tenth of the frame and
# larger: a take's): 7 looks at a 480x270 frame, not a reference's 35 (12 ms against 54 ms for each sampled frame, ten
# a second, where the take shows no face)
_MISSED_TILES_DOWN = 2
SMOOTH_S = 0.3  # the crop follows the face through a Gaussian of this sigma, seconds
MIN_FACE_SHARE = 0.5  # fewer sampled frames with a face than this: refused
_DETECT_SIDE = 480  # frames are searched for the face at most this large
_SEAM_OPEN = 0.15  # below this audio opening, the seam of a shut source mouth is painted over with its lips


@dataclass(frozen=True, eq=False)
class FaceTrack:
    """The crop focus of every source frame (source pixels), or None: no face anywhere (centre crop)."""

    boxes: np.ndarray | None  # (N, 4) float32 x, y, w, h, smoothed
    found: int  # sampled frames with a face
    sampled: int

    def focus(self, index: int) -> tuple[float, float, float, float] | None:
        if self.boxes is None:
            return None
        x, y, w, h = (float(v) for v in self.boxes[index])
        return x, y, w, h


class FrameCache:
    """Source frames fitted to the output and their landmarks, by source index; least recently used out
    first beyond ``limit`` bytes. A pure function of the index is cached, so it never changes a frame."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._items: OrderedDict[int, tuple[np.ndarray, fm.FaceMesh | None]] = OrderedDict()

    def get(self, index: int):
        item = self._items.get(index)
        if item is not None:
            self._items.move_to_end(index)
        return item

    def put(self, index: int, item: tuple[np.ndarray, fm.FaceMesh | None]) -> None:
        size = item[0].nbytes
        if size > self.limit:
            return
        self._items[index] = item
        self.bytes += size
        while self.bytes > self.limit:
            _, (old, _) = self._items.popitem(last=False)
            self.bytes -= old.nbytes


@dataclass(frozen=True, eq=False)
class DubRig:
    """What the per-frame warp reuses: the mesh's topology (triangles over landmarks and ring vertices)."""

    triangles: np.ndarray  # (T, 3) int32


@dataclass(eq=False)
class DubSource:
    """The video being dubbed, as the decode stage reads it: its timeline, track, decoder and cache.
    (Mutable only in the decoder's position and the cache, neither of which changes what a frame shows.)"""

    video: VideoReference
    track: FaceTrack
    rig: DubRig | None  # None: no face, the frames pass through
    width: int
    height: int
    landmarks: LandmarkModel | None
    reader: SourceFrames
    cache: FrameCache


def scan_faces(video: VideoReference, detector: FaceDetector, landmarks: LandmarkModel | None,
               face_box: list[int] | None) -> FaceTrack:
    """One streamed pass over the video: the face's box every few frames (found by the detector, then
    followed by the landmark model while it holds on), interpolated and smoothed."""
    info = video.info
    n = info.num_frames
    if face_box:
        return FaceTrack(boxes=np.tile(np.asarray(face_box, np.float32), (n, 1)), found=n, sampled=n)
    step = max(1, round(info.fps / DETECT_PER_S))
    samples = list(range(0, n, step))
    if samples[-1] != n - 1:
        samples.append(n - 1)
    found = np.full((len(samples), 4), np.nan, np.float32)
    unconfirmed = found.copy()  # boxes of the detector's in which the landmark model saw no face
    scale = min(1.0, _DETECT_SIDE / max(info.width, info.height))
    reader = SourceFrames(info)
    mesh: fm.FaceMesh | None = None
    try:
        for k, (_, frame) in enumerate(reader.read(samples)):
            if mesh is not None and landmarks is not None:
                mesh = landmarks.track(frame, mesh)
            if mesh is None:
                small = (frame if scale == 1.0
                         else cv2.resize(frame, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA))
                faces = detector.faces(small)
                kept = faces if landmarks is None else _confirmed(faces, detector, landmarks, frame, small, scale)
                chosen = detector.choose(kept)
                if chosen is None:
                    loose = None if kept else detector.choose(faces)  # (the model saw no face at all)
                    if loose is not None:
                        b = _unscaled(faces[loose], scale)
                        unconfirmed[k] = (b.x, b.y, b.w, b.h)
                    continue
                box = _unscaled(detector.layout(small, kept[chosen]).face, scale)
                mesh = landmarks.from_box(frame, box) if landmarks is not None else None
                if mesh is None:
                    found[k] = (box.x, box.y, box.w, box.h)
                    continue
            b = mesh.layout(detected=True).face
            found[k] = (b.x, b.y, b.w, b.h)
    finally:
        reader.close()
    # A box the model rejects (a hand, a face on a poster) counts only where the model confirms too few frames (a
    # blurred take): then the track is what it would be without the check.
    if (~np.isnan(found[:, 0])).sum() < MIN_FACE_SHARE * len(samples):
        found = np.where(np.isnan(found), unconfirmed, found)
    ok = ~np.isnan(found[:, 0])
    hits = int(ok.sum())
    if hits == 0:
        return FaceTrack(boxes=None, found=0, sampled=len(samples))
    if hits < MIN_FACE_SHARE * len(samples):
        raise AvatarRenderError(
            f"The reference video {shown(info.path)} shows a face in only {hits} of {len(samples)} sampled frames; "
            "give a video where the face is visible most of the time, or place it with face.box=[x,y,w,h].")
    at = np.asarray(samples, np.float64)
    every = np.arange(n, dtype=np.float64)
    boxes = np.stack([np.interp(every, at[ok], found[ok, c]) for c in range(4)], axis=1)  # (N, 4)
    # The size stays that of the median face (the crop's size is fixed); the centre follows, smoothed.
    cx, cy = boxes[:, 0] + boxes[:, 2] / 2, boxes[:, 1] + boxes[:, 3] / 2
    sigma = max(SMOOTH_S * info.fps, 1e-3)
    cx, cy = _smooth(cx, sigma), _smooth(cy, sigma)
    w, h = np.median(boxes[:, 2]), np.median(boxes[:, 3])
    out = np.stack([cx - w / 2, cy - h / 2, np.full(n, w), np.full(n, h)], axis=1).astype(np.float32)
    return FaceTrack(boxes=out, found=hits, sampled=len(samples))


def _confirmed(faces: tuple[Box, ...], detector: FaceDetector, landmarks: LandmarkModel, frame: np.ndarray,
               small: np.ndarray, scale: float) -> tuple[Box, ...]:
    """The boxes (found in ``small``, a copy of ``frame`` scaled by ``scale``) in which the landmark model sees a
    face (``LandmarkModel.finds_face``, on the full frame), and the larger faces the cascade missed that the second
    detector finds in ``small`` and the model confirms (``FaceDetector.missed``), left to right."""
    finds = landmarks.finds_face(frame)

    def is_face(box: Box, roll: float) -> bool:
        return finds(_unscaled(box, scale), roll)

    kept = [b for b in faces if is_face(b, 0.0)]
    missed = detector.missed(small, kept, is_face, tiles_down=_MISSED_TILES_DOWN)
    return tuple(sorted(kept + missed, key=lambda b: (b.x, b.y)))


def _unscaled(b: Box, scale: float) -> Box:
    """A box found in a copy of a frame scaled by ``scale``, in the frame's pixels."""
    return Box(b.x / scale, b.y / scale, b.w / scale, b.h / scale)


def _smooth(x: np.ndarray, sigma: float) -> np.ndarray:
    """Zero-phase Gaussian smoothing, the ends held."""
    r = int(np.ceil(3 * sigma))
    if r < 1 or len(x) < 2:
        return x
    k = np.exp(-0.5 * (np.arange(-r, r + 1) / sigma) ** 2)
    return np.convolve(np.pad(x, r, mode="edge"), k / k.sum(), mode="valid")


def dub_source(x: RequestInput, *, detector: FaceDetector, landmarks: LandmarkModel | None,
               face_box: list[int] | None, cache_mb: int) -> DubSource:
    """The dub's source: the video scanned for its face, the mesh topology from its first frame."""
    video: VideoReference = x.video
    track = scan_faces(video, detector, landmarks, face_box)
    src = DubSource(video=video, track=track, rig=None, width=x.width, height=x.height, landmarks=landmarks,
                    reader=video.frames(), cache=FrameCache(cache_mb << 20))
    _, mesh = fitted_frame(src, 0)
    if mesh is not None:
        src.rig = DubRig(triangles=mouth_triangles(mesh))
    return src


def fitted_frame(src: DubSource, index: int, frame: np.ndarray | None = None) -> tuple[np.ndarray, fm.FaceMesh | None]:
    """Source frame ``index`` cropped to the output around its tracked face, with its landmarks there."""
    item = src.cache.get(index)
    if item is not None:
        return item
    if frame is None:
        ((_, frame),) = tuple(src.reader.read([index]))
    focus = src.track.focus(index)
    image, fit = fit_moving(frame, src.width, src.height, focus=focus)
    mesh = None
    if focus is not None and src.landmarks is not None:
        mesh = src.landmarks.from_box(image, Box(*focus).scaled(fit))
    src.cache.put(index, (image, mesh))
    return image, mesh


def fit_moving(frame: np.ndarray, width: int, height: int, *,
               focus: tuple[float, float, float, float] | None) -> tuple[np.ndarray, Fit]:
    """``fit_to_frame`` for a crop that moves from frame to frame: the same crop size and placement, but at
    a fractional position (a whole-pixel crop would step a pixel on some frames and not on others: judder)."""
    if focus is None:
        return fit_to_frame(frame, width, height)
    src_h, src_w = frame.shape[:2]
    if src_w * height >= src_h * width:
        crop_h, crop_w = src_h, min(src_w, max(1, round(src_h * width / height)))
    else:
        crop_w, crop_h = src_w, min(src_h, max(1, round(src_w * height / width)))
    fx, fy, fw, fh = focus
    x0 = _place(fx + fw / 2 - 0.5 * crop_w, fx, fw, crop_w, src_w)
    y0 = _place(fy + fh / 2 - 0.45 * crop_h, fy, fh, crop_h, src_h)
    scale = (width / crop_w + height / crop_h) / 2
    size = (max(1, round(src_w * scale)), max(1, round(src_h * scale)))
    small = frame if size == (src_w, src_h) else cv2.resize(
        frame, size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC)
    # (pixel-edge coordinates: output x = source x * scale - offset, the same offset in cv2's centre convention)
    shift = np.array([[1, 0, -x0 * scale], [0, 1, -y0 * scale]], np.float32)
    out = cv2.warpAffine(small, shift, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
    return out, Fit(scale=scale, offset_x=x0 * scale, offset_y=y0 * scale)


def _place(desired: float, start: float, size: float, crop: int, total: int) -> float:
    """Crop origin along one axis, fractional: ``desired``, moved to keep [start, start + size) inside, clamped."""
    lo, hi = 0.0, float(total - crop)
    keep_lo, keep_hi = start + size - crop, start
    if max(lo, keep_lo) <= min(hi, keep_hi):
        lo, hi = max(lo, keep_lo), min(hi, keep_hi)
    return float(min(max(desired, lo), hi))


def render_dub(src: DubSource, start: int, params: np.ndarray) -> Frames:
    """Output frames [start, start + len(params)): each source frame at its time, its mouth moved to the
    row's (open, width). params: (T, len(PARAMS)) float32."""
    indices = src.video.timeline.indices(start, start + len(params))
    # The segment's frames fitted as they are decoded (a chunk's worth at the output size, whatever the
    # cache keeps), so no source-size frame is held longer than its own fitting.
    fitted = {}
    for i in np.unique(indices):
        item = src.cache.get(int(i))
        if item is not None:
            fitted[int(i)] = item
    for i, frame in src.reader.read([int(i) for i in np.unique(indices) if int(i) not in fitted]):
        fitted[i] = fitted_frame(src, i, frame)
    out = np.empty((len(params), src.height, src.width, 3), np.uint8)  # (T, H, W, 3)
    for k, (index, row) in enumerate(zip(indices, params)):
        image, mesh = fitted[int(index)]
        if src.rig is None or mesh is None or mesh.mouth_width() < 8:
            out[k] = image
        else:
            out[k] = redub(image, mesh, src.rig, float(row[OPEN]), float(row[WIDTH]))
    return Frames(start=start, frames=out)


def mouth_triangles(mesh: fm.FaceMesh) -> np.ndarray:
    """Triangles of the mesh with the mouth opened, so none spans from one lip to the other (the landmarks
    between the lip contours left out); the same topology serves every frame of the video."""
    vertices = mesh_vertices(mesh)
    contours = set(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER + fm.LIPS_INNER_UPPER + fm.LIPS_INNER_LOWER)
    outline = mesh.at(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER[::-1]).astype(np.float32)
    drop = np.array([i < fm.NUM_POINTS and i not in contours
                     and cv2.pointPolygonTest(outline, (float(v[0]), float(v[1])), True) > -0.5
                     for i, v in enumerate(vertices)])
    keep = np.flatnonzero(~drop)
    shape = MouthShape.build(mesh, vertices)
    opened = (vertices + shape.jaw * 0.6)[keep]
    _, first = np.unique(np.round(opened, 3), axis=0, return_index=True)
    dup = np.setdiff1d(np.arange(len(opened)), first)
    opened[dup] += 1e-2 * (1 + np.arange(len(dup)))[:, None]
    return keep[delaunay(opened)].astype(np.int32)


def source_opening(mesh: fm.FaceMesh) -> float:
    """How open the source's mouth is, in the preview's ``open`` units (0 = lips together)."""
    travel = (1 + LIP_RAISE) * JAW_DROP * max(mesh.mouth_width(), 1.0)
    return max(0.0, mesh.lip_gap() / travel)


def redub(image: np.ndarray, mesh: fm.FaceMesh, rig: DubRig, open_: float, width: float) -> np.ndarray:
    """The fitted source frame with its mouth moved from its own opening to ``open_`` (and lips to ``width``).
    -> (H, W, 3) uint8; pixels no moving triangle covers are the source's."""
    height, w_img = image.shape[:2]
    vertices = mesh_vertices(mesh)
    shape = MouthShape.build(mesh, vertices)
    own = source_opening(mesh)
    target = max(open_, 0.0)
    delta = target - own
    # The source's mouth shut: its jaw raised by its own opening, what gap is left at each pair of inner lip
    # points sealed (both lips half way, the outer contours with them); then the audio's mouth on top.
    disp = shape.jaw * -own + _residual_seal(vertices + shape.jaw * -own, mesh)
    disp = disp + shape.jaw * target + (shape.spread * width if width > 0 else shape.round * -width)
    moved = vertices + disp
    moving = np.abs(disp).max(axis=1) > 1e-3
    tris = rig.triangles[(rig.triangles < len(vertices)).all(axis=1)]
    touched = tris[moving[tris].any(axis=1)]
    out = image.copy()
    if len(touched) == 0:
        return out
    pts = np.concatenate([vertices[touched.ravel()], moved[touched.ravel()]])
    rect = Rect.around(pts, w_img, height, margin=2.0)
    if rect.empty:
        return out
    d = backward_map(vertices, moved, touched, rect)  # (h, w, 2)
    xs, ys = rect.grid()
    cv2.remap(image, xs + d[..., 0], ys + d[..., 1], cv2.INTER_LINEAR, dst=out[rect.slices],
              borderMode=cv2.BORDER_REPLICATE)
    if delta > 0.02:
        _shade_gap(out, mesh, moved, rect, min(1.0, delta / max(target, 1e-3)))
    elif own > 0.05 and target < _SEAM_OPEN:
        _lip_seam(out, mesh, moved, rect, 1.0 - target / _SEAM_OPEN)
    return out


def _lip_seam(out: np.ndarray, mesh: fm.FaceMesh, moved: np.ndarray, rect: Rect, amount: float) -> None:
    """Where an open source mouth was shut, its teeth and dark interior are squashed into a line between the
    lips: cover that line with the lips' own texture, taken from just beyond it in each lip (the upper half
    of the band from the upper lip, the lower half from the lower; its creases and grain, not a flat colour),
    and let the lips meet in a faint dark line."""
    upper, lower = moved[list(fm.LIPS_INNER_UPPER)], moved[list(fm.LIPS_INNER_LOWER)]
    mid = 0.5 * (upper + lower)
    width = max(mesh.mouth_width(), 1.0)
    band = max(1.0, 0.05 * width)
    xs, ys = rect.grid()
    s, t = face_coords(xs + 0.5, ys + 0.5, mesh)
    d = t - contour_t(s, mid, mesh)  # below the closed line, pixels
    ends, _ = face_coords(mid[[0, -1], 0], mid[[0, -1], 1], mesh)
    r = np.abs(s - 0.5 * (ends[0] + ends[1])) / max(0.5 * float(ends[1] - ends[0]), 1.0)
    along = np.clip((1.05 - r) / 0.2, 0, 1)
    cover = np.clip((2.0 - np.abs(d) / band) / 0.8, 0, 1)  # whole to 1.2 bands from the line, none from 2
    a = (cover * cover * (3 - 2 * cover) * along * amount).astype(np.float32)
    _, ey = mesh.axes()
    push = np.where(d < 0, -2.2, 2.2) * band  # into the lip on the same side, beyond the band
    tex = cv2.remap(out, (xs + push * float(ey[0])).astype(np.float32), (ys + push * float(ey[1])).astype(np.float32),
                    cv2.INTER_LINEAR,
                    borderMode=cv2.BORDER_REPLICATE).astype(np.float32)
    line = np.exp(-((d / max(0.6, 0.012 * width)) ** 2)) * along * amount
    region = out[rect.slices].astype(np.float32)
    region = region + a[..., None] * (tex - region)
    out[rect.slices] = np.clip(region * (1 - 0.06 * line)[..., None] + 0.5, 0, 255).astype(np.uint8)


def _residual_seal(closed: np.ndarray, mesh: fm.FaceMesh) -> np.ndarray:
    """(N, 2) displacements that close what gap is left between the inner lips of ``closed`` (N, 2)."""
    _, ey = mesh.axes()
    out = np.zeros_like(closed)
    for k in range(1, len(fm.LIPS_INNER_UPPER) - 1):
        iu, il = fm.LIPS_INNER_UPPER[k], fm.LIPS_INNER_LOWER[k]
        gap = float((closed[il] - closed[iu]) @ ey)
        if gap <= 0:
            continue
        half = 0.5 * gap * ey
        out[iu], out[il] = half, -half
        out[fm.LIPS_OUTER_UPPER[k]], out[fm.LIPS_OUTER_LOWER[k]] = 0.5 * half, -0.5 * half
    return out


def _shade_gap(out: np.ndarray, mesh: fm.FaceMesh, moved: np.ndarray, rect: Rect, amount: float) -> None:
    """Darken the newly opened part of the mouth (inside the moved inner lips), more where the source was shut."""
    inner = np.concatenate([moved[list(fm.LIPS_INNER_UPPER)], moved[list(fm.LIPS_INNER_LOWER)][::-1]])
    cover = polygon_mask(inner, rect)  # (h, w)
    if not cover.any():
        return
    lips = mesh.at(fm.LIPS_OUTER_LOWER[1:-1])
    h, w = out.shape[:2]
    xs = np.clip(lips[:, 0].astype(int), 0, w - 1)
    ys = np.clip(lips[:, 1].astype(int), 0, h - 1)
    dark = np.median(out[ys, xs].astype(np.float32), axis=0) * np.float32(0.25)
    feather = max(1, int(0.02 * mesh.mouth_width()) | 1)
    a = cv2.GaussianBlur(cover, (2 * feather + 1, 2 * feather + 1), 0)[..., None] * np.float32(0.85 * amount)
    region = out[rect.slices].astype(np.float32)
    out[rect.slices] = np.clip(region + a * (dark - region) + 0.5, 0, 255).astype(np.uint8)
