"""Write a reference video for dubbing tests and benchmarks: examples/face.png panned and zoomed over time
(a moving camera on a still presenter), H.264 in MP4, made with PyAV only.

    python -m tests.reference_video take.mp4 --seconds 5 --size 1280x720 --fps 30
    python -m tests.reference_video take.mp4 --rotate 90        # stored sideways with a display matrix
"""

from __future__ import annotations

import argparse
import math
from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
from PIL import Image

FACE = Path(__file__).resolve().parents[1] / "examples" / "face.png"


def camera_frame(face: np.ndarray, t: float, width: int, height: int) -> np.ndarray:
    """The face image seen through a camera that pans and zooms slowly: (height, width, 3) uint8."""
    h, w = face.shape[:2]
    zoom = 1.0 + 0.12 * math.sin(2 * math.pi * t / 4.0)
    dx = 0.05 * w * math.sin(2 * math.pi * t / 3.0)
    dy = 0.03 * h * math.sin(2 * math.pi * t / 5.0 + 1.0)
    # Around the head of examples/face.png (upper left of the portrait), shown about 2.5 face heights tall.
    cx, cy = 0.44 * w, 0.30 * h
    scale = zoom * max(width / (0.75 * w), height / (0.6 * h))
    m = np.array([[scale, 0, width / 2 - scale * (cx + dx)], [0, scale, height / 2 - scale * (cy + dy)]], np.float32)
    return cv2.warpAffine(face, m, (width, height), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)


def make_video(path: Path, *, seconds: float = 3.0, width: int = 160, height: int = 160, fps: float = 25.0,
               rotate: int = 0, crf: int = 23, face: Path = FACE) -> Path:
    """Write the video; ``rotate`` (0/90/180/270) stores it turned, with a display matrix that turns it back."""
    image = np.asarray(Image.open(face).convert("RGB"))
    rate = Fraction(fps).limit_denominator(1001)
    turns = (rotate // 90) % 4
    stored = (height, width) if turns % 2 else (width, height)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=rate)
        stream.width, stream.height = stored
        stream.pix_fmt = "yuv420p"
        stream.options = {"crf": str(crf), "preset": "veryfast", "g": str(max(1, round(float(rate))))}
        for i in range(max(1, round(seconds * float(rate)))):
            rgb = camera_frame(image, i / float(rate), width, height)
            # Stored turned clockwise by ``rotate``; the display matrix says turn it back counter-clockwise.
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(np.rot90(rgb, -turns)), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    if turns:
        set_display_rotation(path, turns * 90)
    return path


def set_display_rotation(path: Path, degrees: int) -> None:
    """Write the display matrix of the MP4's first track header (``tkhd``), as a phone records a video held
    sideways: players (and FFmpeg) turn the stored frames ``degrees`` counter-clockwise to show them."""
    data = bytearray(Path(path).read_bytes())
    at = data.find(b"tkhd")
    assert at > 0, "an MP4 with a track header"
    version = data[at + 4]
    matrix = at + 4 + (52 if version == 1 else 40)
    c, s = round(math.cos(math.radians(degrees))), round(math.sin(math.radians(degrees)))
    one = 1 << 16
    values = [c * one, -s * one, 0, s * one, c * one, 0, 0, 0, 1 << 30]  # (a b u; c d v; x y w), 16.16 and 2.30
    data[matrix : matrix + 36] = b"".join(v.to_bytes(4, "big", signed=True) for v in values)
    Path(path).write_bytes(bytes(data))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output", type=Path)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size", default="1280x720", help="WIDTHxHEIGHT as displayed")
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--rotate", type=int, default=0, choices=(0, 90, 180, 270))
    args = ap.parse_args()
    width, height = (int(v) for v in args.size.lower().split("x"))
    make_video(args.output, seconds=args.seconds, width=width, height=height, fps=args.fps, rotate=args.rotate)
    print(args.output)


if __name__ == "__main__":
    main()
