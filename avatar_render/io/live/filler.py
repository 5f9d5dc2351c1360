"""What a push stream sends while it waits for generation under the ``hold`` policy: the last frame
again (a closed GOP of its own: an IDR frame and repeats) and silence, so the server keeps the
connection. Encoded by encoders of their own, never by the render's (whose bytes stay those of the file)."""

from __future__ import annotations

from fractions import Fraction
from typing import Optional

import av
import numpy as np

from avatar_render.io.codecs import open_audio_encoder, open_video_encoder
from avatar_render.io.fmp4 import AAC_FRAME, annexb_to_avcc
from avatar_render.io.spec import WriterSpec


class Filler:
    def __init__(self, spec: WriterSpec, avc_extradata: bytes) -> None:
        self.spec = spec
        self._extradata = avc_extradata
        self._cached: tuple[int, list[tuple[bytes, bool]]] | None = None  # (id of the frame, its GOP)
        self._silence: Optional[bytes] = None

    def video(self, rgb: np.ndarray, frames: int) -> Optional[list[tuple[bytes, bool]]]:
        """``frames`` packets (AVCC, keyframe flag) showing rgb (H, W, 3) uint8: an IDR frame, then
        repeats. None when this encoder's parameter sets differ from the stream's (it cannot be spliced in)."""
        if self._cached is not None and self._cached[0] == id(rgb) and len(self._cached[1]) == frames:
            return self._cached[1]
        encoder = open_video_encoder(self.spec)
        if encoder.extradata != self._extradata:
            return None
        picture = av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        picture = picture.reformat(format="yuv420p", dst_colorspace="ITU709", dst_color_range="MPEG")
        packets: list[av.Packet] = []
        for i in range(frames):
            picture.pts = i
            picture.pict_type = av.video.frame.PictureType.I if i == 0 else av.video.frame.PictureType.NONE
            packets += encoder.encode(picture)
        packets += encoder.encode(None)
        gop = [(annexb_to_avcc(bytes(p)), p.is_keyframe) for p in packets]
        self._cached = (id(rgb), gop)
        return gop

    def silence(self) -> bytes:
        """One AAC frame (AAC_FRAME samples) of silence, as the stream's encoder settings code it."""
        if self._silence is None:
            encoder = open_audio_encoder(self.spec)
            packets: list[av.Packet] = []
            zeros = np.zeros((self.spec.audio_channels, AAC_FRAME), np.float32)
            for i in range(8):
                frame = av.AudioFrame.from_ndarray(zeros, format="fltp", layout=encoder.layout.name)
                frame.sample_rate, frame.pts, frame.time_base = (self.spec.audio_rate, i * AAC_FRAME,
                                                                 Fraction(1, self.spec.audio_rate))
                packets += encoder.encode(frame)
            self._silence = bytes(packets[-1])  # past the encoder's start: a steady frame of silence
        return self._silence
