"""load_reference and fit_to_frame."""

from __future__ import annotations

import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import av
import numpy as np
import pytest
from PIL import Image

from avatar_render.errors import AvatarRenderError
from avatar_render.face.fit import Fit, fit_to_frame
from avatar_render.io.reference import load_reference
from tests.media import speech_like, write_audio

ROOT = Path(__file__).resolve().parents[1]


def gradient(width: int = 40, height: int = 30) -> np.ndarray:
    """(H, W, 3) uint8 smooth colour ramp, so lossy codecs keep it close."""
    y, x = np.mgrid[0:height, 0:width]
    channels = [x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), np.full_like(x, 128)]
    return np.stack(channels, -1).astype(np.uint8)


def flat_png(
    path: Path, width: int, height: int, rgb: tuple[int, int, int] = (90, 120, 150), *, pixels: bool = True
) -> Path:
    """An RGB PNG of one colour written row by row (cheap at any size); without pixels only the header is real."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    body = b""
    if pixels:
        row, comp = b"\x00" + bytes(rgb) * width, zlib.compressobj(1)
        body = b"".join(comp.compress(row) for _ in range(height)) + comp.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


def write_video(path: Path, colors: list[tuple[int, int, int]], size: int = 64) -> Path:
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for i, color in enumerate(colors):
            frame = av.VideoFrame.from_ndarray(np.full((size, size, 3), color, np.uint8), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return path


@pytest.mark.parametrize(
    "fmt,suffix,tolerance",
    [("PNG", ".png", 0), ("BMP", ".bmp", 0), ("TIFF", ".tif", 0), ("JPEG", ".jpg", 12), ("WEBP", ".webp", 12)],
)
def test_formats_round_trip(tmp_path: Path, fmt: str, suffix: str, tolerance: int) -> None:
    image = gradient()
    path = tmp_path / f"face{suffix}"
    Image.fromarray(image).save(path, fmt, **({"quality": 95} if fmt in ("JPEG", "WEBP") else {}))
    out = load_reference(str(path))
    assert out.shape == (30, 40, 3) and out.dtype == np.uint8
    error = np.abs(out.astype(int) - image)
    assert error.mean() <= tolerance / 4 and error.max() <= tolerance * 3


def test_rgba_is_composited_over_white(tmp_path: Path) -> None:
    rgba = np.zeros((20, 20, 4), np.uint8)
    rgba[:, :10] = (200, 10, 20, 255)  # opaque red
    rgba[:, 10:] = (0, 0, 0, 0)  # fully transparent black
    rgba[0, 19] = (0, 0, 0, 128)  # half-transparent black
    Image.fromarray(rgba, "RGBA").save(tmp_path / "a.png")
    out = load_reference(tmp_path / "a.png")
    assert out.shape == (20, 20, 3)
    assert tuple(out[5, 2]) == (200, 10, 20)
    assert tuple(out[5, 15]) == (255, 255, 255)
    assert np.all(np.abs(out[0, 19].astype(int) - 127) <= 1)


def test_gray_la_and_16_bit(tmp_path: Path) -> None:
    gray = np.tile(np.arange(0, 250, 10, dtype=np.uint8), (20, 1))  # (20, 25)
    Image.fromarray(gray, "L").save(tmp_path / "g.png")
    out = load_reference(tmp_path / "g.png")
    assert out.shape == (20, 25, 3) and np.array_equal(out[..., 0], gray) and np.array_equal(out[..., 1], out[..., 2])

    la = Image.merge("LA", [Image.new("L", (20, 20), 0), Image.new("L", (20, 20), 0)])  # black, transparent
    la.save(tmp_path / "la.png")
    assert np.all(load_reference(tmp_path / "la.png") == 255)

    deep = np.zeros((20, 20), np.uint16)
    deep[:, 5:10], deep[:, 10:] = 32896, 65535  # 0, ~half, full scale
    Image.fromarray(deep).save(tmp_path / "16.png")
    assert Image.open(tmp_path / "16.png").mode.startswith("I")
    out = load_reference(tmp_path / "16.png")
    assert tuple(out[3, 0]) == (0, 0, 0) and tuple(out[3, 7]) == (128, 128, 128)
    assert tuple(out[3, 15]) == (255, 255, 255)


def test_palette_with_and_without_transparency(tmp_path: Path) -> None:
    index = np.zeros((20, 20), np.uint8)
    index[:, 10:] = 1
    image = Image.fromarray(index, "P")
    image.putpalette([10, 200, 30, 0, 0, 0] + [0] * 762)
    image.save(tmp_path / "p.png")
    out = load_reference(tmp_path / "p.png")
    assert tuple(out[0, 0]) == (10, 200, 30) and tuple(out[0, 15]) == (0, 0, 0)
    image.save(tmp_path / "pt.png", transparency=1)
    out = load_reference(tmp_path / "pt.png")
    assert tuple(out[0, 0]) == (10, 200, 30) and tuple(out[0, 15]) == (255, 255, 255)
    image.save(tmp_path / "pt.gif", transparency=1)
    assert tuple(load_reference(tmp_path / "pt.gif")[0, 15]) == (255, 255, 255)


def test_cmyk_jpeg(tmp_path: Path) -> None:
    Image.new("CMYK", (24, 24), (0, 255, 255, 0)).save(tmp_path / "c.jpg", quality=95)
    out = load_reference(tmp_path / "c.jpg")
    assert out.shape == (24, 24, 3) and out[10, 10, 0] > 200 and out[10, 10, 1:].max() < 60


def test_exif_orientation_is_applied(tmp_path: Path) -> None:
    stored = np.full((20, 40, 3), 255, np.uint8)  # (H, W, 3): wide as stored
    stored[:6, :6] = (255, 0, 0)  # red patch in the stored top-left corner
    exif = Image.Exif()
    exif[0x0112] = 6  # display = stored rotated 90 degrees clockwise
    Image.fromarray(stored).save(tmp_path / "rot.jpg", exif=exif, quality=95)
    out = load_reference(tmp_path / "rot.jpg")
    assert out.shape == (40, 20, 3)  # tall once upright
    assert out[2, 17, 0] > 200 and out[2, 17, 1] < 80  # stored top-left -> displayed top-right


@pytest.mark.parametrize("size", [(16, 16), (17, 31), (333, 18)])
def test_odd_sizes(tmp_path: Path, size: tuple[int, int]) -> None:
    Image.fromarray(gradient(*size)).save(tmp_path / "odd.png")
    out = load_reference(tmp_path / "odd.png")
    assert out.shape == (size[1], size[0], 3) and out.flags.c_contiguous and out.flags.writeable


def test_video_first_frame(tmp_path: Path) -> None:
    path = write_video(tmp_path / "clip.mp4", [(220, 30, 30), (30, 220, 30), (30, 30, 220)])
    out = load_reference(path)
    assert out.shape == (64, 64, 3) and out.dtype == np.uint8
    assert out[32, 32, 0] > 180 and out[32, 32, 1] < 80 and out[32, 32, 2] < 80
    # Content, not suffix, decides: a video under an unknown suffix is still read.
    disguised = tmp_path / "clip.dat"
    disguised.write_bytes(path.read_bytes())
    assert load_reference(disguised).shape == (64, 64, 3)


def no_video_stream(path: Path) -> str:
    return rf"^The reference '{re.escape(str(path))}' has no video stream to take the face from\.$"


def test_media_without_video(tmp_path: Path) -> None:
    wav = write_audio(tmp_path / "talk.wav", speech_like(0.5, 16000), 16000)
    with pytest.raises(AvatarRenderError, match=no_video_stream(wav)):
        load_reference(wav)
    mp4 = tmp_path / "x.mp4"
    with av.open(str(mp4), "w") as container:
        stream = container.add_stream("aac", rate=16000, layout="mono")
        samples = speech_like(0.5, 16000)
        frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
        frame.sample_rate = 16000
        container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    with pytest.raises(AvatarRenderError, match=no_video_stream(mp4)):
        load_reference(mp4)


def one_sentence(error: pytest.ExceptionInfo[AvatarRenderError]) -> str:
    text = str(error.value)
    assert text.endswith(".") and "\n" not in text and "Traceback" not in text
    assert error.value.__suppress_context__ or error.value.__cause__ is None
    return text


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(AvatarRenderError, match="does not exist") as error:
        load_reference(tmp_path / "missing.png")
    one_sentence(error)
    with pytest.raises(AvatarRenderError, match="folder") as error:
        load_reference(tmp_path)
    one_sentence(error)
    (tmp_path / "notes.png").write_text("this is not an image\n" * 20)
    with pytest.raises(AvatarRenderError, match="not an image or video") as error:
        load_reference(tmp_path / "notes.png")
    one_sentence(error)
    Image.fromarray(gradient(64, 64)).save(tmp_path / "whole.png")
    data = (tmp_path / "whole.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    with pytest.raises(AvatarRenderError, match="corrupt or truncated") as error:
        load_reference(tmp_path / "cut.png")
    one_sentence(error)
    Image.new("RGB", (1, 1)).save(tmp_path / "dot.png")
    with pytest.raises(AvatarRenderError, match=r"only 1x1 pixels; it must be at least 16x16") as error:
        load_reference(tmp_path / "dot.png")
    one_sentence(error)
    Image.new("RGB", (300, 15)).save(tmp_path / "strip.png")
    with pytest.raises(AvatarRenderError, match="at least 16x16"):
        load_reference(tmp_path / "strip.png")
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(AvatarRenderError, match=r"is empty \(0 bytes\); give an image or video file"):
        load_reference(tmp_path / "empty.jpg")


def test_huge_header_is_refused_before_decoding(tmp_path: Path) -> None:
    for width, height in ((100_000, 100_000), (20_000, 10_000)):  # past Pillow's own bomb limit, and between
        path = flat_png(tmp_path / f"huge{width}.png", width, height, pixels=False)
        with pytest.raises(AvatarRenderError, match="too large|over the limit") as error:
            load_reference(path)
        one_sentence(error)
    with pytest.raises(AvatarRenderError, match="40x40 pixels, over the limit of 1,000;"):
        load_reference(flat_png(tmp_path / "small.png", 40, 40), max_pixels=1000)
    assert Image.MAX_IMAGE_PIXELS == int(1024 * 1024 * 1024 // 4 // 3)  # Pillow's default is restored


def _extra_peak_mb(setup: str, code: str) -> float:
    """Peak resident memory that ``code`` adds after ``setup``, measured in a fresh interpreter (MiB)."""
    probe = (
        "import resource\n"
        f"{setup}\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"{code}\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return float(result.stdout.split()[-1])


@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux only")
def test_large_image_memory(tmp_path: Path) -> None:
    setup = "from avatar_render.io.reference import load_reference\nfrom avatar_render.errors import AvatarRenderError"
    big = flat_png(tmp_path / "big.png", 12_000, 12_000)  # 144 Mpx, 432 MB as RGB
    refused = _extra_peak_mb(
        setup,
        f"try:\n    load_reference({str(big)!r}, max_pixels=100_000_000)\nexcept AvatarRenderError:\n    pass\n"
        "else:\n    raise SystemExit('not refused')",
    )
    assert refused < 50  # nothing decoded
    mid = flat_png(tmp_path / "mid.png", 6000, 6000)  # 36 Mpx
    accepted = _extra_peak_mb(
        setup,
        f"image = load_reference({str(mid)!r})\n"
        "assert image.shape == (6000, 6000, 3) and tuple(image[-1, -1]) == (90, 120, 150)",
    )
    assert accepted < 36 * 8  # the decoded image and the array, under 8 bytes per pixel together


def test_fit_to_frame_shapes_and_mapping() -> None:
    image = np.zeros((300, 400, 3), np.uint8)
    out, fit = fit_to_frame(image, 200, 200)
    assert out.shape == (200, 200, 3) and out.dtype == np.uint8
    assert fit == Fit(scale=pytest.approx(200 / 300), offset_x=pytest.approx(50 * 200 / 300), offset_y=0)
    out, fit = fit_to_frame(image, 1280, 720)
    assert out.shape == (720, 1280, 3) and fit.scale == pytest.approx(3.2, rel=1e-3)
    out, fit = fit_to_frame(image, 400, 300)
    assert out.shape == (300, 400, 3) and fit == Fit(1.0, 0.0, 0.0)
    out, fit = fit_to_frame(np.zeros((37, 23, 3), np.uint8), 64, 48)
    assert out.shape == (48, 64, 3)


def test_fit_to_frame_keeps_pixels_where_fit_says() -> None:
    image = np.zeros((400, 600, 3), np.uint8)
    image[100:140, 420:460] = 255  # a white square at reference x 420..460, y 100..140
    out, fit = fit_to_frame(image, 256, 256, focus=(400, 80, 80, 80))
    x0, y0 = 420 * fit.scale - fit.offset_x, 100 * fit.scale - fit.offset_y
    side = 40 * fit.scale
    inside = out[round(y0 + 2) : round(y0 + side - 2), round(x0 + 2) : round(x0 + side - 2)]
    assert inside.size and inside.min() > 200
    assert out[: max(round(y0) - 2, 0)].max() < 50 if y0 > 3 else True


@pytest.mark.parametrize(
    "shape,frame,focus",
    [
        ((1000, 600), (512, 512), (200, 100, 200, 220)),  # tall portrait: square crop slides vertically
        ((600, 1000), (512, 512), (700, 100, 200, 220)),  # wide: face near the right edge
        ((600, 1000), (512, 512), (0, 0, 150, 150)),  # face in the corner: clamped to the image
        ((512, 512), (1280, 720), (170, 60, 110, 130)),  # 16:9 from a square
        ((720, 1280), (720, 1280), (900, 200, 160, 200)),  # portrait frame from a landscape image
    ],
)
def test_fit_to_frame_focus(
    shape: tuple[int, int], frame: tuple[int, int], focus: tuple[float, float, float, float]
) -> None:
    image = np.zeros((*shape, 3), np.uint8)
    width, height = frame
    out, fit = fit_to_frame(image, width, height, focus=focus)
    assert out.shape == (height, width, 3)
    x, y, w, h = focus
    left, top = x * fit.scale - fit.offset_x, y * fit.scale - fit.offset_y
    right, bottom = left + w * fit.scale, top + h * fit.scale
    assert -0.5 <= left and right <= width + 0.5 and -0.5 <= top and bottom <= height + 0.5  # box inside
    # Crop stays within the image.
    assert fit.offset_x >= -1e-6 and fit.offset_y >= -1e-6
    assert fit.offset_x + width <= shape[1] * fit.scale + 0.5 and fit.offset_y + height <= shape[0] * fit.scale + 0.5
    # Where clamping allows, the face centre sits at the horizontal middle and a little above the vertical middle.
    cx, cy = (left + right) / 2, (top + bottom) / 2
    can_centre_x = fit.offset_x > 0.5 and fit.offset_x + width < shape[1] * fit.scale - 0.5
    if can_centre_x:
        assert abs(cx - width / 2) <= 1.5
    can_move_y = fit.offset_y > 0.5 and fit.offset_y + height < shape[0] * fit.scale - 0.5
    if can_move_y:
        assert abs(cy - 0.45 * height) <= 1.5


def test_fit_to_frame_portrait_face_above_centre() -> None:
    image = np.zeros((1000, 600, 3), np.uint8)
    out, fit = fit_to_frame(image, 512, 512, focus=(200, 300, 200, 200))
    cy = (400 * fit.scale) - fit.offset_y
    assert out.shape == (512, 512, 3) and 0.40 * 512 < cy < 0.5 * 512


def test_fit_to_frame_comes_closer_to_a_small_face() -> None:
    """A face under MIN_FACE of the frame (a full-length or group photo) is cropped closer, to MIN_FACE, the crop
    enlarged at most MAX_ZOOM times; the face stays inside, the crop inside the image."""
    from avatar_render.face.fit import MAX_ZOOM, MIN_FACE

    image = np.zeros((2000, 3000, 3), np.uint8)
    focus = (2300.0, 950.0, 90.0, 90.0)
    out, fit = fit_to_frame(image, 512, 512, focus=focus)
    assert out.shape == (512, 512, 3)
    assert 90 * fit.scale == pytest.approx(MIN_FACE * 512, rel=0.01)
    left, top = 2300 * fit.scale - fit.offset_x, 950 * fit.scale - fit.offset_y
    assert 0 <= left and left + 90 * fit.scale <= 512 and 0 <= top and top + 90 * fit.scale <= 512
    assert fit.offset_x + 512 <= 3000 * fit.scale + 0.5 and fit.offset_y + 512 <= 2000 * fit.scale + 0.5
    _, fit = fit_to_frame(np.zeros((600, 600, 3), np.uint8), 512, 512, focus=(300.0, 300.0, 10.0, 10.0))
    assert fit.scale == pytest.approx(MAX_ZOOM, rel=0.01)  # a 10-px face: enlarged twice, not to 61 px
    _, fit = fit_to_frame(image, 512, 512, focus=(2300.0, 950.0, 400.0, 400.0))
    assert fit.scale == pytest.approx(512 / 2000)  # a face large enough: the whole height, as before

