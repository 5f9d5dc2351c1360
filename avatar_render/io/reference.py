"""The reference: an image, or a video (its first frame as the identity image, and the video streamed
for dubbing: ``open_reference``)."""

from __future__ import annotations

import threading
import warnings
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.files.read import regular_file
from avatar_render.io.video_source import SourceTimeline, VideoReference, probe_source

VIDEO_SUFFIXES = frozenset({".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi"})
MIN_SIDE = 16  # smallest width or height accepted, in pixels
_STRIP_ROWS = 512  # rows converted to numpy at a time, so no extra full-size temporaries pile up
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError)
# Image.MAX_IMAGE_PIXELS is process-wide; it is swapped for ``max_pixels`` only while a header is read.
_PIL_LIMIT_LOCK = threading.Lock()
_CORRUPT = "The reference image {} is corrupt or truncated; re-export it."
_NOT_MEDIA = "The reference {} is not an image or video file that can be read."
_HEIC_BRANDS = (b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx")  # an ISO file's major brand, of HEIF/HEVC stills


def _not_media(path: Path) -> str:
    """What to say of a reference nothing here can read: a phone's HEIC photo is named as such, with what to do."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        head = b""
    if head[4:8] == b"ftyp" and head[8:12] in _HEIC_BRANDS:
        return (f"The reference {shown(path)} is a HEIC photo, which cannot be read here; save it as JPEG or PNG "
                "(most photo apps export it so) and render again.")
    return _NOT_MEDIA.format(shown(path))


def load_reference(path: str | Path, *, max_pixels: int = 150_000_000) -> np.ndarray:
    """(H, W, 3) uint8 RGB identity image from an image (PNG/JPEG/WebP/BMP/TIFF...) or a video (first frame).

    The image keeps its full resolution (so boxes given in reference pixels stay valid); its pixel
    count is checked from the header before anything is decoded. Transparency is composited over white.
    """
    path = regular_file(path, what="reference", give="an image or video file", empty_ok=False)
    if path.suffix.lower() in VIDEO_SUFFIXES:
        return _load_video_frame(path, max_pixels)
    try:
        image = _open_image(path, max_pixels)
    except UnidentifiedImageError:
        return _load_video_frame(path, max_pixels, from_image_fallback=True)
    with image:
        return _decode_image(image, path)


def open_reference(path: str | Path, *, fps: Fraction, timing: str,
                   max_pixels: int = 150_000_000) -> tuple[np.ndarray, VideoReference | None]:
    """The identity image (an image, or a video's first frame, upright) and, for a video of more than one
    frame, the video itself streamed: frames decoded on demand, played under output frame rate ``fps``
    by ``timing`` (``reference.timing``)."""
    path = regular_file(path, what="reference", give="an image or video file", empty_ok=False)
    if path.suffix.lower() not in VIDEO_SUFFIXES and _is_image(path):
        return load_reference(path, max_pixels=max_pixels), None
    first = _load_video_frame(path, max_pixels, from_image_fallback=path.suffix.lower() not in VIDEO_SUFFIXES)
    info = probe_source(path, max_pixels=max_pixels)
    if info.num_frames < 2:
        return first, None
    return first, VideoReference(timeline=SourceTimeline(info=info, fps=fps, timing=timing))


def _is_image(path: Path) -> bool:
    """Whether Pillow knows the file (header only); anything else is tried as a video."""
    try:
        with _PIL_LIMIT_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            _quiet_exif()
            previous = Image.MAX_IMAGE_PIXELS
            Image.MAX_IMAGE_PIXELS = None
            try:
                with Image.open(path):
                    return True
            finally:
                Image.MAX_IMAGE_PIXELS = previous
    except UnidentifiedImageError:
        return False
    except _DECODE_ERRORS:
        return True  # an image, a broken one: load_reference says so


def _quiet_exif() -> None:
    """Inside ``warnings.catch_warnings()``: Pillow's warnings of a photo's broken EXIF data go unshown (the photo
    is read without it, as any viewer does; nothing the user must act on)."""
    warnings.filterwarnings("ignore", message=r"(Possibly )?[Cc]orrupt EXIF", category=UserWarning)


def image_within(path: Path, max_pixels: int) -> bool:
    """Whether ``path`` is a regular file, an image Pillow knows of at most ``max_pixels``, by its header alone
    (a pipe or a device is never opened: it could block)."""
    try:
        _open_image(regular_file(path, what="reference", give="an image"), max_pixels).close()
    except (AvatarRenderError, UnidentifiedImageError, OSError):
        return False
    return True


def _open_image(path: Path, max_pixels: int) -> Image.Image:
    """Open lazily (header only) and check the size before any pixel is decoded."""
    with _PIL_LIMIT_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        _quiet_exif()
        previous = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = max_pixels
        try:
            image = Image.open(path)
        except Image.DecompressionBombError:
            raise AvatarRenderError(
                f"The reference image {shown(path)} is too large (over {max_pixels:,} pixels); downscale it first."
            ) from None
        except UnidentifiedImageError:
            raise
        except _DECODE_ERRORS:
            raise AvatarRenderError(_CORRUPT.format(shown(path))) from None
        finally:
            Image.MAX_IMAGE_PIXELS = previous
    try:
        _check_size(path, *image.size, max_pixels)
    except AvatarRenderError:
        image.close()
        raise
    return image


def _check_size(path: Path, width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise AvatarRenderError(
            f"The reference {shown(path)} is {width}x{height} pixels, over the limit of {max_pixels:,}; "
            "downscale it first."
        )
    if min(width, height) < MIN_SIDE:
        raise AvatarRenderError(
            f"The reference {shown(path)} is only {width}x{height} pixels; it must be at least {MIN_SIDE}x{MIN_SIDE}."
        )


def _decode_image(image: Image.Image, path: Path) -> np.ndarray:
    try:
        image.load()
        with _PIL_LIMIT_LOCK, warnings.catch_warnings():
            _quiet_exif()
            ImageOps.exif_transpose(image, in_place=True)
        image = _canonical_mode(image)
        return _to_rgb_array(image)
    except MemoryError:
        raise AvatarRenderError(
            f"There is not enough memory to decode the reference {shown(path)}; downscale it first."
        ) from None
    except _DECODE_ERRORS:
        raise AvatarRenderError(_CORRUPT.format(shown(path))) from None


def _canonical_mode(image: Image.Image) -> Image.Image:
    """The image in RGB, RGBA, L, LA, I;16 or I (other modes converted by Pillow)."""
    mode = image.mode
    if mode in ("RGB", "RGBA", "L", "LA", "I;16", "I"):
        return image
    if mode in ("I;16B", "I;16L", "I;16N"):
        return image.convert("I")
    if mode == "F":  # float: 0..1 when the maximum says so, else 0..255
        factor = 255.0 if image.getextrema()[1] <= 1.0 else 1.0
        return image.point(lambda v: v * factor).convert("L")
    if mode in ("P", "PA"):
        transparent = mode == "PA" or "transparency" in image.info or image.palette.mode == "RGBA"
        return image.convert("RGBA" if transparent else "RGB")
    if mode == "1":
        return image.convert("L")
    if mode in ("La", "RGBa"):
        return image.convert("LA" if mode == "La" else "RGBA")
    return image.convert("RGB")  # CMYK, YCbCr, LAB, HSV, RGBX, ...


def _to_rgb_array(image: Image.Image) -> np.ndarray:
    """(H, W, 3) uint8 from a canonical-mode image, converted a strip of rows at a time."""
    width, height = image.size
    out = np.empty((height, width, 3), np.uint8)  # (H, W, 3)
    for top in range(0, height, _STRIP_ROWS):
        bottom = min(top + _STRIP_ROWS, height)
        strip = np.asarray(image.crop((0, top, width, bottom)))  # (h, W) or (h, W, C)
        out[top:bottom] = _strip_to_rgb(strip, image.mode)
    return out


def _strip_to_rgb(strip: np.ndarray, mode: str) -> np.ndarray:
    if mode in ("I;16", "I"):  # 16-bit gray (mode I from PNG/TIFF holds 0..65535)
        strip = (np.clip(strip, 0, 65535).astype(np.uint32) * 255 + 32767) // 65535
        strip = strip.astype(np.uint8)
    if strip.ndim == 2:
        return strip[:, :, None]  # broadcasts to 3 channels
    if mode in ("LA", "RGBA"):  # composite over white
        alpha = strip[:, :, -1:].astype(np.uint16)  # (h, W, 1)
        color = strip[:, :, :-1].astype(np.uint16)
        return ((color * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8)
    return strip


def _load_video_frame(path: Path, max_pixels: int, *, from_image_fallback: bool = False) -> np.ndarray:
    """First decodable frame of the first video stream, upright, as (H, W, 3) uint8 RGB."""
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, ValueError):
        if from_image_fallback:
            raise AvatarRenderError(_not_media(path)) from None
        raise AvatarRenderError(
            f"The reference video {shown(path)} cannot be opened; it is corrupt or not a video."
        ) from None
    with container:
        if not container.streams.video:
            raise AvatarRenderError(f"The reference {shown(path)} has no video stream to take the face from.")
        stream = container.streams.video[0]
        if stream.codec_context is None:  # FFmpeg knows the container but has no decoder for it (e.g. SVG)
            raise AvatarRenderError(
                f"The reference {shown(path)} is in a format nothing here can decode "
                f"(FFmpeg's {container.format.name}); convert it to PNG, JPEG or an H.264 video."
            )
        if stream.codec_context.width and stream.codec_context.height:
            _check_size(path, stream.codec_context.width, stream.codec_context.height, max_pixels)
        try:
            for frame in container.decode(stream):
                _check_size(path, frame.width, frame.height, max_pixels)
                rgb = frame.to_ndarray(format="rgb24")  # (H, W, 3)
                # ``rotation`` is the display matrix's counter-clockwise angle, as phones record it.
                turns = round((frame.rotation or 0) / 90) % 4
                return np.ascontiguousarray(np.rot90(rgb, turns)) if turns else rgb
        except (av.FFmpegError, OSError, ValueError):
            pass
    if from_image_fallback:
        raise AvatarRenderError(_not_media(path))
    raise AvatarRenderError(f"The reference video {shown(path)} has no frame that can be decoded.")
