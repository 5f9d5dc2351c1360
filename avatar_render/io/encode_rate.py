"""The encoder alone: how fast a render's writer could go if the frames cost nothing to make.

The frames of a finished render are decoded back from its file, a chunk at a time, and given to the
render's own encoder (``io.encoder``: the RGB to 4:2:0 conversion and x264 with the render's settings,
fresh encoders at each GOP start); only the encoder's calls are timed. The frames are those of the file
(within the H.264 coding's loss of the ones the render drew), the audio is left out (AAC costs about
a hundredth of x264 here): a bound on the render's speed, that the render's own rate is set beside.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from avatar_render.io.encoder import ChunkEncoder
from avatar_render.io.spec import WriterSpec


@dataclass(frozen=True)
class EncodeRate:
    frames: int
    seconds: float  # wall seconds in the encoder's calls
    fps: Fraction  # the video's frame rate
    cpu_seconds: float  # CPU seconds of the process (x264's threads included) in the encoder's calls

    @property
    def frames_per_second(self) -> float:
        return self.frames / max(self.seconds, 1e-9)

    @property
    def realtime_factor(self) -> float:
        """Video seconds encoded per wall second."""
        return self.frames_per_second / float(self.fps)


def encode_rate(video: Path, *, crf: int, preset: str, gop_seconds: float, chunk_frames: int) -> EncodeRate:
    """Time the encoder on the frames of ``video`` (an MP4 a render wrote), in chunks of ``chunk_frames``
    frames, a GOP opened at the first chunk ``gop_seconds`` or more after the last one."""
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        fps = Fraction(stream.average_rate or stream.guessed_rate or 25).limit_denominator(1001)
        spec = WriterSpec(path=None, width=stream.codec_context.width, height=stream.codec_context.height, fps=fps,
                          crf=crf, preset=preset, gop_seconds=gop_seconds)
        encoder = ChunkEncoder(spec)
        gop_frames, gop_start = math.ceil(gop_seconds * fps), None
        no_audio = np.zeros((spec.audio_channels, 0), np.float32)
        seconds, cpu, chunk = 0.0, 0.0, []
        frames = container.decode(stream)
        while True:
            for frame in frames:
                chunk.append(frame.to_ndarray(format="rgb24"))
                if len(chunk) == chunk_frames:
                    break
            if not chunk:
                break
            opens = gop_start is None or encoder.frames - gop_start >= gop_frames
            gop_start = encoder.frames if opens else gop_start
            rgb = np.stack(chunk)  # (T, H, W, 3) uint8
            chunk = []
            start, start_cpu = time.perf_counter(), time.process_time()
            encoder.encode(rgb, no_audio, opens_gop=opens)
            seconds, cpu = seconds + time.perf_counter() - start, cpu + time.process_time() - start_cpu
        start, start_cpu = time.perf_counter(), time.process_time()
        encoder.finish(at_gop_start=False)
        seconds, cpu = seconds + time.perf_counter() - start, cpu + time.process_time() - start_cpu
    return EncodeRate(frames=encoder.frames, seconds=seconds, fps=fps, cpu_seconds=cpu)
