"""The preview's measuring instruments and its encoder path: the lip aperture read from a frame's pixels
follows the rendered opening, and the BT.709 conversion matches FFmpeg's."""

from __future__ import annotations

from pathlib import Path

import av
import cv2
import numpy as np
import pytest

from avatar_render.config import load_config
from avatar_render.face import mesh as fm
from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.face.patches import luma
from avatar_render.io.encoder import to_yuv420p
from avatar_render.io.reference import load_reference
from avatar_render.job.setup import request_input
from avatar_render.metrics.face_track import lip_aperture
from avatar_render.preview.engine import build_preview
from avatar_render.preview.render import render_frame

ROOT = Path(__file__).resolve().parents[1]
FACE = ROOT / "examples" / "face.png"


@pytest.mark.skipif(find_model() is None, reason="face landmark model not installed (scripts/fetch_face_model.py)")
def test_lip_aperture_follows_the_rendered_opening():
    cfg = load_config(None, ("video.width=512", "video.height=512"))
    rig = build_preview(cfg).prepare(request_input(cfg, load_reference(FACE), FACE)).rig
    model = LandmarkModel(find_model())
    lips = np.zeros(rig.image.shape[:2], np.uint8)
    m = rig.mesh
    contours = ((fm.LIPS_OUTER_UPPER, fm.LIPS_OUTER_LOWER, 1), (fm.LIPS_INNER_UPPER, fm.LIPS_INNER_LOWER, 0))
    for upper, lower, value in contours:  # the lips between their outer and inner contours
        cv2.fillPoly(lips, [np.round(np.concatenate([m.at(upper), m.at(lower)[::-1]])).astype(np.int32)], value)
    lip_luma = float(np.median(luma(rig.image)[lips > 0]))
    readings = []
    for open_ in (-1.0, 0.0, 0.3, 0.6, 1.0):
        frame = render_frame(rig, np.array([open_, 0, 0, 0, 0, 0, 0], np.float32))
        readings.append(lip_aperture(luma(frame), model.track(frame, m), lip_luma))
    closed, rest, *opened = readings
    assert closed <= 0.5  # lips pressed together: no teeth, no dark between them
    assert rest > 2  # the smiling reference shows its teeth
    assert rest < opened[0] < opened[1] < opened[2]
    # Lips pressed together read shut whatever the head's pose: the skin just beyond a lip contour the landmark
    # model placed a pixel off is not counted (it made a few poses read 1.5 px).
    rng = np.random.default_rng(0)
    for _ in range(8):
        dx, dy, roll = rng.uniform(-0.01, 0.01), rng.uniform(-0.006, 0.006), rng.uniform(-1, 1)
        frame = render_frame(rig, np.array([-1.0, 0, 0, dx, dy, roll, 0], np.float32))
        assert lip_aperture(luma(frame), model.track(frame, m), lip_luma) == 0.0


def test_rgb_to_yuv_matches_ffmpegs_bt709_conversion():
    rgb = np.ascontiguousarray(cv2.resize(load_reference(FACE), (320, 240), interpolation=cv2.INTER_AREA))
    ours = to_yuv420p(rgb).to_ndarray().astype(int)  # (H * 3 / 2, W): Y, then Cb and Cr
    ffmpeg = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(
        format="yuv420p", dst_colorspace="ITU709", dst_color_range="MPEG"
    ).to_ndarray().astype(int)
    assert ours.shape == ffmpeg.shape == (360, 320)
    assert np.abs(ours[:240] - ffmpeg[:240]).max() <= 1  # luma: rounding only
    # chroma: the same within the two resamplers' different filters (mostly at sharp colour edges)
    assert np.abs(ours[240:] - ffmpeg[240:]).mean() < 0.5
    assert 16 <= ours[:240].min() and ours[:240].max() <= 235


def test_rgb_to_yuv_in_kept_buffers_is_the_fresh_conversion():
    """One thread's kept buffers, for frames of two sizes in turn, give the bytes of a conversion afresh."""
    from avatar_render.io.encoder import YuvScratch

    face = load_reference(FACE)
    pictures = [np.ascontiguousarray(cv2.resize(face, size, interpolation=cv2.INTER_AREA))
                for size in ((320, 240), (256, 256), (320, 240))]
    scratch = YuvScratch()
    for rgb in pictures:
        assert np.array_equal(to_yuv420p(rgb, scratch).to_ndarray(), to_yuv420p(rgb).to_ndarray())
