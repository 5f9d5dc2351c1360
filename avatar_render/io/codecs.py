"""The encoders behind the MP4 writer (x264 with zero latency, FFmpeg's AAC) and the wording of file
errors."""

from __future__ import annotations

import errno
import math
from fractions import Fraction
from pathlib import Path

import av

from avatar_render.files.names import os_reason, shown
from avatar_render.io.spec import WriterSpec


def open_video_encoder(spec: WriterSpec) -> av.VideoCodecContext:
    codec = av.CodecContext.create("libx264", "w")
    codec.width, codec.height = spec.width, spec.height
    codec.pix_fmt = "yuv420p"
    codec.time_base = 1 / spec.fps
    codec.framerate = spec.fps
    keyint = 2 * math.ceil(spec.gop_seconds * spec.fps)  # a backstop for chunks longer than that
    # zerolatency: no B-frames, no lookahead, slice threads instead of frame threads, so each
    # frame's packet comes out of encode() at once. The writer forces an IDR frame at each GOP start.
    # ipratio=3 (default 1.4): the IDR frame at a GOP start is coded about 9.5 QP finer than the P frames.
    # With the default it differs from the frame before it by its own coding noise over the whole picture,
    # a visible pulse at every GOP start (6x the usual frame-to-frame change on the example; 1.7x with
    # this); the P frames that follow refer to a better picture, so the file is no larger (docs/preview.md).
    params = (
        f"keyint={keyint}:scenecut=0:forced-idr=1:ipratio=3:colorprim=bt709:transfer=bt709:colormatrix=bt709"
    )
    codec.options = {
        "preset": spec.preset,
        "tune": "zerolatency",
        "crf": str(spec.crf),
        "x264-params": params,
        "flags": "+global_header",  # SPS/PPS go to extradata (for avcC), not into the stream
    }
    if spec.crf > 0:  # lossless needs the High 4:4:4 profile, which x264 picks itself
        codec.options["profile"] = "high"
    codec.open()
    return codec


def open_audio_encoder(spec: WriterSpec) -> av.AudioCodecContext:
    codec = av.CodecContext.create("aac", "w")
    codec.sample_rate = spec.audio_rate
    codec.layout = "mono" if spec.audio_channels == 1 else "stereo"
    codec.format = "fltp"
    codec.bit_rate = spec.audio_bitrate
    codec.time_base = Fraction(1, spec.audio_rate)
    codec.options = {"flags": "+global_header"}
    codec.open()
    return codec


def create_error(path: Path, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError) and not Path(path).parent.is_dir():
        return f"Could not create {shown(path)}: the folder '{Path(path).parent}' does not exist."
    if isinstance(exc, FileNotFoundError):
        return f"Could not open {shown(path)}: it does not exist."
    if isinstance(exc, PermissionError):
        return f"Could not create {shown(path)}: permission denied."
    if isinstance(exc, FileExistsError):
        return f"Could not create {shown(path)}: something is already there, and the render writes only files it makes."
    if exc.errno == errno.ELOOP:
        return f"Could not open {shown(path)}: it is a symbolic link, and the render never writes through one."
    return f"Could not create {shown(path)}: {os_reason(exc)}."


def write_error(path: Path, exc: OSError) -> str:
    return f"Could not write {shown(path)}: {os_reason(exc)}."
