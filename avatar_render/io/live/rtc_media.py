"""The render's encoded media as WebRTC sends it: H.264 access units in Annex B form, with the SPS and
PPS before every IDR frame (a viewer may start at any keyframe), and Opus in place of AAC.

The video is the file's own encode, not encoded again: x264 with ``tune=zerolatency`` (no B-frames,
progressive), which browsers decode in WebRTC whatever profile the SDP named (docs/live.md). The AAC is
decoded once and encoded once as Opus (48 kHz, 20-ms packets) for every viewer, since WebRTC has no AAC;
the watch page's viewers get the render's input audio encoded as Opus once instead (``OpusFromPcm``).
"""

from __future__ import annotations

import struct
from fractions import Fraction

import av
import numpy as np

from avatar_render.io.fmp4 import AAC_FRAME, Tracks

VIDEO_CLOCK = 90_000  # RTP's clock for video
OPUS_RATE = 48000
OPUS_FRAME = 960  # samples per Opus packet: 20 ms
_START = b"\x00\x00\x00\x01"
_IDR = 5


def annexb(avcc: bytes, extradata: bytes) -> tuple[bytes, bool]:
    """A length-prefixed access unit -> its Annex B form, and whether it holds an IDR slice; an IDR
    access unit gets ``extradata`` (the Annex B SPS and PPS) in front."""
    out, idr, i = [], False, 0
    while i + 4 <= len(avcc):
        (size,) = struct.unpack_from(">I", avcc, i)
        nal = avcc[i + 4: i + 4 + size]
        idr = idr or (bool(nal) and nal[0] & 0x1F == _IDR)
        out += [_START, nal]
        i += 4 + size
    body = b"".join(out)
    return (extradata + body if idr else body), idr


class OpusFromAac:
    """AAC frames in (the stream's, in order), 20-ms Opus packets out. The AAC decoder's output keeps the
    encoder's priming (1024 samples), as the stream's audio clock counts it."""

    def __init__(self, tracks: Tracks) -> None:
        self._decoder = av.CodecContext.create("aac", "r")
        self._decoder.extradata = tracks.aac_extradata
        self._resampler = av.AudioResampler(format="s16", layout="stereo", rate=OPUS_RATE, frame_size=OPUS_FRAME)
        self._encoder = _opus_encoder()
        self._rate = tracks.audio_rate
        self._fed = 0

    def feed(self, aac: bytes) -> list[bytes]:
        packet = av.Packet(aac)
        packet.pts = self._fed
        packet.time_base = Fraction(1, self._rate)
        self._fed += AAC_FRAME
        out: list[bytes] = []
        for frame in self._decoder.decode(packet):
            for resampled in self._resampler.resample(frame):
                out += [bytes(p) for p in self._encoder.encode(resampled)]
        return out


class OpusFromPcm:
    """The render's input audio ((C, n) float32 at ``rate``) in, 20-ms Opus packets out: the audio leaves
    with its chunk's frames (the AAC encoder would hold up to two of its frames back till the next chunk)."""

    def __init__(self, rate: int, channels: int) -> None:
        self._rate, self._layout = rate, "mono" if channels == 1 else "stereo"
        self._resampler = av.AudioResampler(format="s16", layout="stereo", rate=OPUS_RATE, frame_size=OPUS_FRAME)
        self._encoder = _opus_encoder()

    def feed(self, pcm: np.ndarray) -> list[bytes]:
        if not pcm.shape[1]:
            return []
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, np.float32), format="fltp", layout=self._layout)
        frame.sample_rate = self._rate
        return [bytes(p) for resampled in self._resampler.resample(frame) for p in self._encoder.encode(resampled)]


def _opus_encoder() -> av.AudioCodecContext:
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate = OPUS_RATE
    encoder.layout = "stereo"
    encoder.format = "s16"
    encoder.bit_rate = 96_000
    encoder.time_base = Fraction(1, OPUS_RATE)
    encoder.options = {"application": "audio", "frame_duration": "20"}
    encoder.open()
    return encoder


def packet(data: bytes, pts: int, clock: int) -> av.Packet:
    """An encoded packet as aiortc takes it (``Encoder.pack``): its time in 1 / ``clock``."""
    out = av.Packet(data)
    out.pts = pts
    out.time_base = Fraction(1, clock)
    return out
