"""Connections to push servers: FLV over RTMP (PyAV, in a process of its own: ``rtmp_child``), MPEG-TS
over SRT (the ffmpeg command, since PyAV's wheels have no libsrt). Both get already encoded packets;
nothing is encoded again.

Every network step has a time-out. FFmpeg's own does not cover an RTMP server that accepts the
connection and then never answers the handshake, nor one that stops reading (PyAV opens the stream
without an interrupt callback and holds the interpreter while it waits), so the RTMP connection runs
in a child process that this one feeds through a pipe and gives up on: it must say it is connected
within ``OPEN_TIMEOUT_S`` and take each packet within ``IO_TIMEOUT_S``."""

from __future__ import annotations

import io
import os
import select
import shutil
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import BinaryIO, Union

import av

from avatar_render.errors import AvatarRenderError
from avatar_render.io.fmp4 import Fmp4Muxer, Tracks
from avatar_render.io.live.targets import LiveTarget

WIRE_CLOCK = 90_000  # ticks per second of the packets' times (MPEG-TS's clock; FLV rounds to ms)
OPEN_TIMEOUT_S = 10.0  # connecting and shaking hands
IO_TIMEOUT_S = 5.0  # a write that takes longer is a lost connection
_START_S = 10.0  # the child process's own start (imports), on a loaded machine
FRAME = struct.Struct(">??qqI")  # a packet on the child's pipe: video, key, pts, duration, size; then the data
STARTED = b"started\n"  # what the child says once it runs (its imports done) and connects
CONNECTED = b"connected\n"  # what the child says once the server took the stream's header


@dataclass(frozen=True)
class WirePacket:
    video: bool
    data: bytes  # H.264 in AVCC form, or an AAC frame
    pts: int  # in 1 / WIRE_CLOCK
    duration: int
    key: bool


class Connection:
    """An open stream to a server; ``send`` raises ConnectionError when the connection is lost."""

    def __init__(self, output: av.container.OutputContainer, init_segment: bytes) -> None:
        self._out = output
        # The streams are copied from the file's own init segment, read back by FFmpeg: the codec
        # parameters (avcC, AudioSpecificConfig) exactly as the file carries them, and no encoder.
        with av.open(io.BytesIO(init_segment), format="mp4") as init:
            self._video = output.add_stream_from_template(init.streams.video[0])
            self._audio = output.add_stream_from_template(init.streams.audio[0])
        try:
            output.start_encoding()  # connects and sends the stream's header
        except (OSError, av.error.FFmpegError) as exc:
            self.close()
            raise ConnectionError(reason(exc)) from None

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
            raise ConnectionError(reason(exc)) from None

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
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        self._stderr: list[bytes] = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True, name="srt-ffmpeg-log")
        self._reader.start()
        pipe: BinaryIO = self._proc.stdin
        try:
            output = av.open(pipe, "w", format="mpegts", options={"flush_packets": "1"})
        except (OSError, av.error.FFmpegError) as exc:
            self._stop()
            raise ConnectionError(reason(exc)) from None
        super().__init__(output, Fmp4Muxer(None, tracks).init_segment())

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


class RtmpProcess:
    """The RTMP connection, run by ``rtmp_child`` in a process of its own and fed through its standard input."""

    def __init__(self, target: LiveTarget, tracks: Tracks) -> None:
        self._proc = subprocess.Popen([sys.executable, "-m", "avatar_render.io.live.rtmp_child", target.url],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=child_env(), start_new_session=True)
        self._stderr: list[bytes] = []
        self._reader = threading.Thread(target=self._read_stderr, daemon=True, name="rtmp-child-log")
        self._reader.start()
        os.set_blocking(self._proc.stdin.fileno(), False)
        init = Fmp4Muxer(None, tracks).init_segment()
        try:
            self._write(struct.pack(">I", len(init)) + init, timeout=_START_S)
            self._wait_connected()
        except ConnectionError:
            self.close(at_once=True)
            raise

    def _wait_connected(self) -> None:
        self._wait_for(STARTED, _START_S, "the process that sends the stream did not start")
        self._wait_for(CONNECTED, OPEN_TIMEOUT_S, f"the server did not take the stream within {OPEN_TIMEOUT_S:g} s "
                                                  "(it did not answer, or accepted the connection but not the RTMP "
                                                  "handshake)")

    def _wait_for(self, word: bytes, seconds: float, why: str) -> None:
        out, deadline, said = self._proc.stdout.fileno(), time.monotonic() + seconds, b""
        while said != word:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                raise ConnectionError(why)
            more = os.read(out, len(word) - len(said))
            if not more:
                raise ConnectionError(self._why())
            said += more

    def send(self, packet: WirePacket) -> None:
        head = FRAME.pack(packet.video, packet.key, packet.pts, packet.duration, len(packet.data))
        self._write(head + packet.data, timeout=IO_TIMEOUT_S)

    def _write(self, data: bytes, *, timeout: float) -> None:
        """All of ``data`` into the child's pipe, or ConnectionError when it took none of it for ``timeout``
        seconds (the server stopped reading) or has ended."""
        fd, view = self._proc.stdin.fileno(), memoryview(data)
        while view:
            if not select.select([], [fd], [], timeout)[1]:
                raise ConnectionError(f"the server took no data for {timeout:g} s")
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                raise ConnectionError(self._why()) from None

    def close(self, *, at_once: bool = False) -> None:
        """The end of the stream (the child sends FLV's trailer and closes the connection). Never raises."""
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=0 if at_once else IO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(timeout=1)

    def _read_stderr(self) -> None:
        for line in self._proc.stderr:
            self._stderr = (self._stderr + [line])[-5:]

    def _why(self) -> str:
        try:
            self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        self._reader.join(timeout=1)
        text = b"".join(self._stderr).decode(errors="replace").strip().splitlines()
        return text[-1].strip().rstrip(".") if text else "the process that sends it ended"


Sender = Union[Connection, "RtmpProcess"]


def connect(target: LiveTarget, tracks: Tracks) -> Sender:
    """Open ``target`` (rtmp or srt); ConnectionError with the reason when the server cannot be reached
    or refuses; AvatarRenderError when this machine cannot send to it at all."""
    if target.kind == "rtmp":
        return RtmpProcess(target, tracks)
    assert target.kind == "srt"
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise AvatarRenderError(
            "Sending to srt:// needs the ffmpeg command (e.g. apt-get install ffmpeg), which is not on the PATH.")
    return _FfmpegPipe(target, tracks, ffmpeg)


def child_env() -> dict:
    """The environment of a child process that runs this very package (``python -m avatar_render...``).
    Such children, like the ffmpeg ones, start a session of their own: a terminal's Ctrl-C (sent to its
    whole process group) reaches the render alone, which ends its streams cleanly and then its children;
    they would die at once, a lost connection for the render to retry."""
    package_root = str(Path(__file__).resolve().parents[3])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}


def reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc)
    text = text.split("] ", 1)[-1].strip().rstrip(".")
    return text[:1].lower() + text[1:] if text else type(exc).__name__
