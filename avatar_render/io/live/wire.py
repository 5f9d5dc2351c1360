"""Connections to push servers: FLV over RTMP (PyAV), MPEG-TS over SRT (the ffmpeg command, since PyAV's
wheels have no libsrt). Both get already encoded packets; nothing is encoded again."""

from __future__ import annotations

import io
import shutil
import subprocess
import threading
from dataclasses import dataclass
from fractions import Fraction
from typing import BinaryIO

import av

from avatar_render.errors import AvatarRenderError
from avatar_render.io.fmp4 import Fmp4Muxer, Tracks
from avatar_render.io.live.targets import LiveTarget

WIRE_CLOCK = 90_000  # ticks per second of the packets' times (MPEG-TS's clock; FLV rounds to ms)
_OPEN_TIMEOUT_S = 10.0  # connecting
_IO_TIMEOUT_S = 5.0  # a write that takes longer is a lost connection


@dataclass(frozen=True)
class WirePacket:
    video: bool
    data: bytes  # H.264 in AVCC form, or an AAC frame
    pts: int  # in 1 / WIRE_CLOCK
    duration: int
    key: bool


class Connection:
    """An open stream to a server; ``send`` raises ConnectionError when the connection is lost."""

    def __init__(self, output: av.container.OutputContainer, tracks: Tracks) -> None:
        self._out = output
        # The streams are copied from the file's own init segment, read back by FFmpeg: the codec
        # parameters (avcC, AudioSpecificConfig) exactly as the file carries them, and no encoder.
        with av.open(io.BytesIO(Fmp4Muxer(None, tracks).init_segment()), format="mp4") as init:
            self._video = output.add_stream_from_template(init.streams.video[0])
            self._audio = output.add_stream_from_template(init.streams.audio[0])
        try:
            output.start_encoding()  # connects and sends the stream's header
        except (OSError, av.error.FFmpegError) as exc:
            self.close()
            raise ConnectionError(_reason(exc)) from None

    def send(self, packet: WirePacket) -> None:
        p = av.Packet(packet.data)
        p.pts = p.dts = packet.pts
        p.duration = packet.duration
        p.time_base = Fraction(1, WIRE_CLOCK)
        p.is_keyframe = packet.key
        p.stream = self._video if packet.video else self._audio
        try:
            self._out.mux_one(p)
        except (OSError, av.error.FFmpegError) as exc:
            raise ConnectionError(_reason(exc)) from None

    def close(self) -> None:
        """The end of the stream (FLV's end-of-sequence, the trailer), then the connection closed. Never raises."""
        try:
            self._out.close()
        except (OSError, av.error.FFmpegError, ValueError):
            pass


class _FfmpegPipe(Connection):
    """MPEG-TS written into an ``ffmpeg`` process that copies it to the SRT server."""

    def __init__(self, target: LiveTarget, tracks: Tracks, ffmpeg: str) -> None:
        # caller mode; linger: the socket's close waits for what is still in flight (live mode drops it at once)
        extra = [o for o in ("mode=caller", "linger=5") if o.split("=")[0] + "=" not in target.url]
        url = target.url + ("&" if "?" in target.url else "?") + "&".join(extra) if extra else target.url
        self._proc = subprocess.Popen(
            [ffmpeg, "-hide_banner", "-nostdin", "-loglevel", "error", "-probesize", "32768",
             "-analyzeduration", "0", "-f", "mpegts", "-i", "pipe:0", "-c", "copy", "-f", "mpegts", url],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._stderr: list[bytes] = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True, name="srt-ffmpeg-log")
        self._reader.start()
        pipe: BinaryIO = self._proc.stdin
        try:
            output = av.open(pipe, "w", format="mpegts", options={"flush_packets": "1"})
        except (OSError, av.error.FFmpegError) as exc:
            self._stop()
            raise ConnectionError(_reason(exc)) from None
        super().__init__(output, tracks)

    def _read_stderr(self) -> None:
        for line in self._proc.stderr:
            self._stderr = (self._stderr + [line])[-5:]

    def send(self, packet: WirePacket) -> None:
        if self._proc.poll() is not None:
            raise ConnectionError(self._why())
        try:
            super().send(packet)
        except ConnectionError:
            raise ConnectionError(self._why()) from None

    def close(self) -> None:
        super().close()
        self._stop()

    def _stop(self) -> None:
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=1)

    def _why(self) -> str:
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        text = b"".join(self._stderr).decode(errors="replace").strip().splitlines()
        return text[-1].split(": ", 1)[-1].strip().rstrip(".") if text else "the ffmpeg process that sends it ended"


def connect(target: LiveTarget, tracks: Tracks) -> Connection:
    """Open ``target`` (rtmp or srt); ConnectionError with the reason when the server cannot be reached
    or refuses; AvatarRenderError when this machine cannot send to it at all."""
    if target.kind == "rtmp":
        try:
            output = av.open(target.url, "w", format="flv", timeout=(_OPEN_TIMEOUT_S, _IO_TIMEOUT_S))
        except (OSError, av.error.FFmpegError) as exc:
            raise ConnectionError(_reason(exc)) from None
        return Connection(output, tracks)
    assert target.kind == "srt"
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise AvatarRenderError("Sending to srt:// needs the ffmpeg command (e.g. apt-get install ffmpeg), which is not on the PATH.")
    return _FfmpegPipe(target, tracks, ffmpeg)


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc)
    text = text.split("] ", 1)[-1].strip().rstrip(".")
    return text[:1].lower() + text[1:] if text else type(exc).__name__
