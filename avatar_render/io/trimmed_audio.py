"""The audio of a render that ends with its video reference (``reference.timing=trim``): the reader's
frames cut at the video's end, so the chunk plan, the output audio and the frame count stop there."""

from __future__ import annotations

import numpy as np

from avatar_render.io.audio import AudioReader


class TrimmedAudio:
    """An ``AudioReader`` that lasts at most ``limit`` frames (the pipeline's ``AudioSource``)."""

    def __init__(self, reader: AudioReader, limit: int) -> None:
        self.reader = reader
        self.limit = limit
        self._reached = False  # the audio is known to last at least ``limit`` frames

    @property
    def info(self):
        return self.reader.info

    @property
    def total_frames(self) -> int | None:
        if self._reached:
            return self.limit
        total = self.reader.total_frames
        return None if total is None else min(total, self.limit)

    def probe(self, upto_frame: int) -> int:
        got = self.reader.probe(min(upto_frame, self.limit))
        if got >= self.limit:
            self._reached = True
        return min(got, self.limit)

    def model_audio(self, start_frame: int, end_frame: int, *, pad_s: float = 0.0) -> np.ndarray:
        return self.reader.model_audio(start_frame, end_frame, pad_s=pad_s)

    def output_audio(self, start_frame: int, end_frame: int) -> np.ndarray:
        """As the reader's, up to the video's end when the audio goes on past it (then exactly to that frame)."""
        return self.reader.output_audio(start_frame, min(end_frame, self.limit))

    def release(self, before_frame: int) -> None:
        self.reader.release(before_frame)

    @property
    def buffered_seconds(self) -> float:
        return self.reader.buffered_seconds
