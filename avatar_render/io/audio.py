"""Decode an audio track once, front to back, into two synchronized views in bounded memory.

The model view is mono float32 at the model's rate (for audio features); the output view keeps
the input's rate (when AAC can encode it) and channels (downmixed to stereo above two) for the
AAC track of the output video. Time 0 is the first decoded sample; container timestamps are
not used, so gaps in timestamps do not insert silence.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from avatar_render.errors import AvatarRenderError, InputError
from avatar_render.files.names import shown
from avatar_render.files.read import regular_file
from avatar_render.io.audio_stream import StreamedAudio

AAC_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000)
_FALLBACK_RATE = 48000
_RELEASE_MARGIN = Fraction(1)  # seconds kept behind the point the caller releases
_MIN_CAPACITY = 1 << 14
MIN_RATE, MAX_RATE = 4000, 768_000  # input sample rates read, in Hz
_FLOAT_FORMATS = frozenset({"flt", "fltp", "dbl", "dblp"})  # the only ones that can hold NaN or infinity
_INT_SCALE = {"u8": 128, "s16": 1 << 15, "s32": 1 << 31, "s64": 1 << 63}  # full scale of integer formats
# An MP4's edit list says where its track ends: the decoder hands out the encoder's padding after that (AAC: up to
# a frame, 2048 samples with SBR). Decoded sound at most this much longer than the track is cut there; more is kept
# (a header that undercounts, as a fragmented file's may, loses no sound).
_PADDING_SAMPLES = 4096
# FFmpeg's downmix adds channels up (5.1 to stereo: front + 0.71 x centre + 0.71 x surround, as `ffmpeg -ac 2`
# makes it): loud sound in every channel goes past full scale, and a player's decoder clips it. A mixed-down sample
# over _KNEE is bent towards _CEILING instead, never past it (1 dB under full scale: the AAC encoding of a peak rings
# over it by a dB or so); sound under _KNEE is untouched.
_KNEE, _CEILING = 0.7, 0.89


@dataclass(frozen=True)
class AudioInfo:
    path: Path
    codec: str  # decoder's canonical name, e.g. "mp3"
    sample_rate: int  # input rate
    channels: int  # input channels
    estimated_seconds: float | None  # from container metadata, None if unknown; for ETA only
    output_rate: int
    output_channels: int  # 1 or 2


def output_format(sample_rate: int, channels: int) -> tuple[int, int]:
    """(rate, channels) of the output track for an input of ``sample_rate`` and ``channels``."""
    return (sample_rate if sample_rate in AAC_RATES else _FALLBACK_RATE), min(channels, 2)


class _Window:
    """Samples [start, end) of one view, kept contiguous in a (channels, capacity) array."""

    def __init__(self, channels: int) -> None:
        self._data = np.zeros((channels, _MIN_CAPACITY), np.float32)
        self._head = 0  # column of sample `start` in _data
        self.start = 0  # absolute index of the first kept sample
        self.end = 0  # absolute index one past the last kept sample

    def __len__(self) -> int:
        return self.end - self.start

    def append(self, block: np.ndarray) -> None:
        """Add (C, n) samples at the end."""
        n, size = block.shape[1], len(self)
        if self._head + size + n > self._data.shape[1]:
            capacity = max(_MIN_CAPACITY, 2 * (size + n))
            current = self._data.shape[1]
            reuse = capacity <= current < 4 * capacity  # shift in place unless it would waste too much
            data = self._data if reuse else np.empty((self._data.shape[0], capacity), np.float32)
            data[:, :size] = self._data[:, self._head : self._head + size]
            self._data, self._head = data, 0
        tail = self._head + size
        self._data[:, tail : tail + n] = block
        self.end += n

    def resize(self, end: int) -> None:
        """Cut after ``end`` or pad with zeros up to it."""
        if end > self.end:
            self.append(np.zeros((self._data.shape[0], end - self.end), np.float32))
        else:
            self.end = max(end, self.start)

    def drop_before(self, index: int) -> None:
        k = min(max(index - self.start, 0), len(self))
        self._head += k
        self.start += k

    def read(self, a: int, b: int) -> np.ndarray:
        """Samples [a, b) as a new (C, b - a) array; zeros before 0 and past ``end``."""
        lo, hi = max(a, 0), min(b, self.end)
        if lo < hi and lo < self.start:
            raise ValueError(f"samples before index {self.start} were already released")
        kept = self._data[:, self._head + lo - self.start : self._head + hi - self.start] if lo < hi else None
        if kept is not None and (a, b) == (lo, hi):
            return kept.copy()
        out = np.zeros((self._data.shape[0], max(b - a, 0)), np.float32)
        if kept is not None:
            out[:, lo - a : hi - a] = kept
        return out


def _sample_at(t: Fraction, rate: int) -> int:
    """round(t * rate), halves rounded up, in exact arithmetic."""
    return math.floor(t * rate + Fraction(1, 2))


class AudioReader:
    """Streams the first audio track of ``path``; see the module docstring.

    ``probe`` decodes ahead; ``model_audio`` and ``output_audio`` read buffered samples (decoding
    more when needed); ``release`` lets go of samples the caller is done with. Memory is bounded by
    how far ahead the caller reads plus what it has not released, never by the file's length.
    """

    def __init__(
        self, path: str | Path | StreamedAudio, *, fps: Fraction, model_rate: int = 16000, lookahead_s: float = 0.5
    ) -> None:
        stream = path if isinstance(path, StreamedAudio) else None
        path = Path(stream.name if stream else path)
        if fps <= 0 or model_rate <= 0 or lookahead_s < 0:
            raise ValueError("fps and model_rate must be positive and lookahead_s not negative")
        self.fps = Fraction(fps)
        self.model_rate = model_rate
        self._lookahead = Fraction(lookahead_s)
        self.total_frames: int | None = None
        self._streamed = stream
        self._container = stream if stream is not None else _open(path)
        try:
            first = self._first_frame(path) if stream is None else self._first_streamed(stream)
            rate, channels = first.sample_rate, first.layout.nb_channels
            out_rate, out_channels = output_format(rate, channels)
            self.info = AudioInfo(
                path=path,
                codec=stream.codec if stream else self._stream.codec_context.codec.canonical_name,
                sample_rate=rate,
                channels=channels,
                estimated_seconds=None if stream else _estimated_seconds(self._container, self._stream),
                output_rate=out_rate,
                output_channels=out_channels,
            )
            self._model = _Window(1)
            self._output = _Window(out_channels)
            self._source: tuple[str, str, int] | None = None  # (format, layout, rate) the resamplers take
            self._mix_to_mono = False  # the source's channels are in no order the resampler can mix
            self._mixed_down = False  # the source has more channels than the output view (added up by FFmpeg)
            self._model_resampler: av.AudioResampler | None = None
            self._output_resampler: av.AudioResampler | None = None
            self._declared = None if stream else _track_seconds(self._container, self._stream)
            self._done_seconds = Fraction(0)  # input duration of earlier (format, layout, rate) segments
            self._segment_samples = 0  # input samples of the current segment
            self._eof = False
            self._push(first)  # (checks the rate and the samples)
        except BaseException:
            self._container.close()
            raise

    def _first_frame(self, path: Path) -> av.AudioFrame:
        streams = self._container.streams.audio
        if not streams:
            raise AvatarRenderError(f"The audio {shown(path)} has no audio track.")
        self._stream = streams[0]
        if self._stream.codec_context is None:  # the container is known, its codec is not
            raise AvatarRenderError(
                f"The audio {shown(path)} holds an audio track that nothing here can decode; "
                "convert it to WAV, FLAC or MP3."
            )
        self._frames = self._decoded_frames()
        first = next((f for f in self._frames if f.samples > 0), None)
        if first is None:
            raise AvatarRenderError(f"The audio {shown(path)} holds no audio samples.")
        return first

    def _first_streamed(self, stream: StreamedAudio) -> av.AudioFrame:
        self._frames = stream.frames()
        first = next(self._frames, None)
        if first is None:
            raise AvatarRenderError(f"The audio stream on {stream.name} ended before any audio came.")
        return first

    @property
    def stream(self) -> StreamedAudio | None:
        """The stream this reader reads (None for a file)."""
        return self._streamed

    # -- public API ---------------------------------------------------------------------------

    def probe(self, upto_frame: int) -> int:
        """Decode through ``upto_frame / fps + lookahead_s`` or to the end of the file.

        Returns ``upto_frame`` if the audio lasts at least that long, else ``total_frames``.
        """
        t = Fraction(upto_frame) / self.fps + self._lookahead
        self._fill(_sample_at(t, self.model_rate), _sample_at(t, self.info.output_rate))
        if self.total_frames is None:
            return upto_frame
        return min(upto_frame, self.total_frames)

    def model_audio(self, start_frame: int, end_frame: int, *, pad_s: float = 0.0) -> np.ndarray:
        """Mono float32 (n,) at ``model_rate`` for [start/fps - pad_s, end/fps + pad_s).

        The pad is a whole number of samples, round(pad_s * model_rate), on each side; samples
        before time 0 and past the end of the audio are zeros.
        """
        pad = round(pad_s * self.model_rate)
        a = _sample_at(Fraction(start_frame) / self.fps, self.model_rate) - pad
        b = _sample_at(Fraction(end_frame) / self.fps, self.model_rate) + pad
        self._fill(b, 0)
        return self._model.read(a, b)[0]

    def output_audio(self, start_frame: int, end_frame: int) -> np.ndarray:
        """Float32 (C, n) at ``info.output_rate`` for [start/fps, end/fps).

        For the last chunk (``end_frame >= total_frames``) it returns everything up to the real end
        of the audio, so consecutive chunks from frame 0 add up to exactly the whole track.
        """
        rate = self.info.output_rate
        a = _sample_at(Fraction(start_frame) / self.fps, rate)
        b = _sample_at(Fraction(end_frame) / self.fps, rate)
        self._fill(0, b)
        if self._eof:
            b = self._output.end if end_frame >= self.total_frames else min(b, self._output.end)
        return self._output.read(a, b)

    def release(self, before_frame: int) -> None:
        """Forget samples older than ``before_frame / fps`` minus a 1 s margin."""
        t = Fraction(before_frame) / self.fps - _RELEASE_MARGIN
        self._model.drop_before(_sample_at(t, self.model_rate))
        self._output.drop_before(_sample_at(t, self.info.output_rate))

    @property
    def buffered_seconds(self) -> float:
        """Seconds of audio held in memory by the larger of the two views."""
        return max(len(self._model) / self.model_rate, len(self._output) / self.info.output_rate)

    def close(self) -> None:
        self._eof = True
        self._container.close()

    def __enter__(self) -> AudioReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- decoding -----------------------------------------------------------------------------

    def _decoded_frames(self) -> Iterator[av.AudioFrame]:
        """Every decodable frame of the stream; corrupt packets are skipped, a cut file just ends."""
        packets = self._container.demux(self._stream)
        while True:
            try:
                packet = next(packets)
            except StopIteration:
                return
            except av.FFmpegError:
                try:  # the rest of the file is unreadable: drain the decoder and stop
                    yield from self._stream.codec_context.decode(None)
                except av.FFmpegError:
                    pass
                return
            try:
                frames = self._stream.codec_context.decode(packet)
            except av.FFmpegError:
                continue
            yield from frames

    def _fill(self, model_end: int, output_end: int) -> None:
        """Decode until each view holds a sample past the given index, or to the end of the file."""
        while not self._eof and (self._model.end <= model_end or self._output.end <= output_end):
            frame = next(self._frames, None)
            if frame is None:
                self._finish()
            elif frame.samples > 0:
                self._push(frame)

    def _push(self, frame: av.AudioFrame) -> None:
        source = (frame.format.name, frame.layout.name, frame.sample_rate)
        if source != self._source:
            self._flush_resamplers()
            if not MIN_RATE <= frame.sample_rate <= MAX_RATE:
                raise InputError(
                    f"The audio {shown(self.info.path)} has a sample rate of {frame.sample_rate} Hz; rates from "
                    f"{MIN_RATE} to {MAX_RATE} Hz are supported, so resample it first."
                )
            self._source = source
            self._mix_to_mono = not _resamplable(frame)
            self._mixed_down = frame.layout.nb_channels > self.info.output_channels
            self._model_resampler = av.AudioResampler(format="fltp", layout="mono", rate=self.model_rate)
            layout = "mono" if self.info.output_channels == 1 else "stereo"
            self._output_resampler = av.AudioResampler(
                format="fltp", layout=layout, rate=self.info.output_rate
            )
        self._check_finite(frame)
        self._segment_samples += frame.samples
        if self._mix_to_mono:  # the model view gets the mean, the output view the mean in each of its channels
            self._resample(_mean(frame, 1), _mean(frame, self.info.output_channels))
        else:
            self._resample(frame, frame)

    def _check_finite(self, frame: av.AudioFrame) -> None:
        if frame.format.name not in _FLOAT_FORMATS:
            return
        data = _channels(frame)  # (C, n)
        bad = ~np.isfinite(data).all(axis=0)  # (n,)
        if not bad.any():
            return
        index = int(bad.argmax())  # the first sample (of any channel) that is NaN or infinite
        kind = "a NaN" if np.isnan(data[:, index]).any() else "an infinite"
        at = self._done_seconds + Fraction(self._segment_samples + index, frame.sample_rate)
        raise InputError(
            f"The audio {shown(self.info.path)} has {kind} sample at {float(at):.3f} s (the first sample that is not a "
            "finite number); re-export it with finite samples only."
        )

    def _resample(self, model_frame: av.AudioFrame | None, output_frame: av.AudioFrame | None) -> None:
        """Each view's frame through its resampler (None flushes them)."""
        for window, resampler, frame in ((self._model, self._model_resampler, model_frame),
                                         (self._output, self._output_resampler, output_frame)):
            for out in resampler.resample(frame):
                if out is not None:  # a pass-through resampler echoes the flush request
                    block = out.to_ndarray()
                    window.append(_softened(block) if window is self._output and self._mixed_down else block)

    def _flush_resamplers(self) -> None:
        if self._source is None:
            return
        self._resample(None, None)
        self._done_seconds += Fraction(self._segment_samples, self._source[2])
        self._segment_samples = 0

    def _finish(self) -> None:
        self._flush_resamplers()
        self._eof = True
        seconds = self._done_seconds
        if self._declared is not None and 0 < seconds - self._declared <= Fraction(_PADDING_SAMPLES, self._source[2]):
            seconds = self._declared  # (the encoder's padding, past the end the file gives)
        # The resamplers' output can be off by a few samples; fix both views to the exact length.
        self._model.resize(_sample_at(seconds, self.model_rate))
        self._output.resize(_sample_at(seconds, self.info.output_rate))
        self.total_frames = math.ceil(seconds * self.fps)


def _open(path: Path) -> av.container.InputContainer:
    regular_file(path, what="audio", give="an audio or video file", empty_ok=False)
    try:
        return av.open(str(path), "r")
    except (av.FFmpegError, OSError, ValueError) as error:
        raise AvatarRenderError(f"The audio {shown(path)} is not a readable audio or video file.") from error


def _softened(block: np.ndarray) -> np.ndarray:
    """(C, n) float32 samples with those over ``_KNEE`` (either sign) bent under ``_CEILING``, in place."""
    over = np.abs(block) > _KNEE
    if over.any():
        room = _CEILING - _KNEE
        block[over] = np.sign(block[over]) * (_KNEE + room * np.tanh((np.abs(block[over]) - _KNEE) / room))
    return block


def _resamplable(frame: av.AudioFrame) -> bool:
    """Whether FFmpeg's resampler can mix ``frame``'s channels down (it cannot when their order is unknown, as
    for 9 channels)."""
    try:
        av.AudioResampler(format="fltp", layout="mono", rate=frame.sample_rate).resample(frame)
    except av.FFmpegError:
        return False
    return True


def _channels(frame: av.AudioFrame) -> np.ndarray:
    """(C, n) samples of ``frame`` in its own sample type."""
    data = frame.to_ndarray()  # (C, n) planar or (1, n * C) packed
    return data if frame.format.is_planar else data.reshape(-1, frame.layout.nb_channels).T


def _mean(frame: av.AudioFrame, channels: int) -> av.AudioFrame:
    """The mean of ``frame``'s channels (in no known order) as a float frame of 1 or 2 equal channels."""
    data = _channels(frame)  # (C, n)
    name = frame.format.name.rstrip("p")
    if name == "u8":
        data = data.astype(np.float64) - 128
    mean = (data.mean(axis=0, dtype=np.float64) / _INT_SCALE.get(name, 1)).astype(np.float32)  # (n,)
    layout = "mono" if channels == 1 else "stereo"
    out = av.AudioFrame.from_ndarray(np.repeat(mean[None], channels, axis=0), format="fltp", layout=layout)
    out.sample_rate = frame.sample_rate
    return out


def _estimated_seconds(container: av.container.InputContainer, stream: av.AudioStream) -> float | None:
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / av.time_base
    return None


def _track_seconds(container: av.container.InputContainer, stream: av.AudioStream) -> Fraction | None:
    """The length an MP4 (or QuickTime) file gives its audio track, from its edit list; None for other formats."""
    if not container.format.name.startswith("mov") or not stream.duration or not stream.time_base:
        return None
    return Fraction(stream.duration) * stream.time_base


def estimated_seconds(path: str | Path) -> float | None:
    """The audio's length from its container's metadata (None if unknown), for plans and ETAs only:
    nothing is decoded."""
    with _open(Path(path)) as container:
        streams = container.streams.audio
        return _estimated_seconds(container, streams[0]) if streams else None
