"""What the MP4 writer and its encoders produce: frame size and rate, quality, the audio track."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Optional

from avatar_render.config import PRESETS
from avatar_render.errors import AvatarRenderError
from avatar_render.io.audio import AAC_RATES


@dataclass(frozen=True)
class WriterSpec:
    path: Optional[Path]  # the fragmented MP4 (the record); None: no file, live sinks only
    width: int
    height: int
    fps: Fraction
    crf: int = 20
    preset: str = "veryfast"
    audio_rate: int = 48000
    audio_channels: int = 2
    audio_bitrate: int = 128_000
    queue_chunks: int = 4  # bounded queue length; put() blocks when full
    gop_seconds: float = 10.0  # shortest GOP: a GOP starts at the first chunk start this long after the last

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", None if self.path is None else Path(self.path))
        if not isinstance(self.fps, Fraction):
            object.__setattr__(self, "fps", Fraction(self.fps).limit_denominator(1001))
        if self.width <= 0 or self.height <= 0 or self.width % 2 or self.height % 2:
            raise AvatarRenderError(f"Video size {self.width}x{self.height} must be positive and even.")
        if not 0 < self.fps <= 1000 or self.fps.numerator >= 2**31:
            raise AvatarRenderError(f"Frame rate {self.fps} must be a positive fraction up to 1000 fps.")
        if not 0 <= self.crf <= 51:
            raise AvatarRenderError(f"CRF {self.crf} must be between 0 and 51.")
        if self.preset not in PRESETS:
            raise AvatarRenderError(f"Preset '{self.preset}' is not one of {', '.join(PRESETS)}.")
        if self.audio_rate not in AAC_RATES:
            raise AvatarRenderError(f"Audio rate {self.audio_rate} Hz is not an AAC rate; use 16000, 44100 or 48000.")
        if self.audio_channels not in (1, 2):
            raise AvatarRenderError(f"Audio must have 1 or 2 channels, not {self.audio_channels}.")
        if not 0 < self.gop_seconds <= 3600:
            raise AvatarRenderError(f"GOP length {self.gop_seconds} s must be positive and at most an hour.")
        if self.audio_bitrate <= 0 or self.queue_chunks < 1:
            raise AvatarRenderError("Audio bitrate and writer queue length must be positive.")
