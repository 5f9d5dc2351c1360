"""WebRTC viewers of ``--serve`` (WHEP: the page POSTs an SDP offer to /whep and gets the answer with
201 and a Location, which a DELETE hangs up).

One hub for every viewer: it is handed each fragment (the file's H.264, and its input audio as Opus:
``rtc_media``), and a pacer on aiortc's loop (``rtc_loop``) sends the packets at real time from the
first one, to every viewer at once. The writer never waits here. When generation runs ahead, the pacer's
queue holds up to ``buffer_s`` seconds; past that its oldest GOP is dropped (viewers jump ahead to the
next keyframe, which keeps them within ``buffer_s`` of the render). When generation is slower, a packet
goes out as soon as it comes (the schedule moves by the wait); when a chunk then comes before its time
the schedule comes back, a tenth faster than real time, so that the delay does not creep up. Each viewer
has a queue of about a second; a viewer whose queue is full (aiortc could not send for it) loses it and
goes on at the next keyframe, as does a viewer who joins while the stream runs.

The first viewer sees the first frame: while the page is loading or its connection comes up (``coming``:
at most ``_HOLD_S``), the stream does not start; the time it waited is made up at the next keyframe that
comes within ``_CATCH_UP_S`` of the queue's start (the frames before it are skipped), so that a stream
held to real time goes back to the live edge.

A render runs the hub in a process of its own (``rtc_process``, whose ``WebRtcProcess`` is the writer's
sink), where aiortc's per-packet work does not take turns with the render for the interpreter's lock.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Literal, Optional

import av
import numpy as np

from avatar_render.io.fmp4 import Tracks
from avatar_render.io.live.rtc_loop import RtcLoop, addresses_for, packet_track, peer_connection, without_mdns
from avatar_render.io.live.rtc_media import OPUS_FRAME, OPUS_RATE, VIDEO_CLOCK, OpusFromPcm, annexb, packet

MAX_VIEWERS = 32
_ANSWER_TIMEOUT_S = 10.0
_VIEWER_QUEUE_S = 1.0
_HOLD_S = 3.0  # the longest the stream waits for a viewer whose page is loading or whose connection comes up
# A chunk whose first frame would wait (less than _CATCH_UP_S) goes out this much faster than real time: the
# schedule, moved later by chunks that came late, comes back to the render's hand-overs (the viewer's delay with it).
_SPEED_UP = 0.1
_CATCH_UP_S = 1.0  # a wait made up by skipping to a keyframe only when the frames skipped span less than this more
Say = Callable[[Literal["info", "warning"], str], None]


class Refused(Exception):
    """An offer not taken; the message says why (the page falls back to HLS)."""


@dataclass(frozen=True)
class _Item:
    at: float  # seconds on the stream's timeline: video frame i at i / fps
    packet: av.Packet
    video: bool
    key: bool = False
    frame: int = -1  # (video) the frame's index


_END = object()


class _Viewer:
    def __init__(self, pc: Any, video: Any, audio: Any) -> None:
        self.pc, self.video, self.audio = pc, video, audio
        self.waiting = True  # for a keyframe: nothing is sent before one
        self.first_frame: Optional[int] = None  # the frame this viewer's picture starts with
        self.drops = 0

    def offer(self, item: _Item) -> None:
        if item.video and self.waiting and item.key:
            self.waiting = False
            self.first_frame = item.frame if self.first_frame is None else self.first_frame
        if self.waiting:
            return
        queue = (self.video if item.video else self.audio).queue
        try:
            queue.put_nowait(item.packet)
        except asyncio.QueueFull:  # this viewer is behind: it goes on at the next keyframe
            for track in (self.video, self.audio):
                while not track.queue.empty():
                    track.queue.get_nowait()
            self.waiting = True
            self.drops += 1


class WebRtcHub:
    """The sink of every WebRTC viewer, and the WHEP answerer of the watch server (``answer``, ``hang_up``,
    ``status``). ``host``: the address the watch server listens on (ICE uses the same interfaces)."""

    def __init__(self, *, host: str, buffer_s: float, say: Say) -> None:
        self.name = "WebRTC viewers"
        self.buffer_s, self.say = max(buffer_s, 1.0), say
        self._addresses = addresses_for(host)
        self._loop = RtcLoop("webrtc")
        self._viewers: dict[str, _Viewer] = {}
        self._queue: collections.deque = collections.deque()  # (loop thread) items not sent yet, and _END
        self._wake: Optional[Any] = None  # asyncio.Event, made on the loop
        self._origin: Optional[float] = None  # loop.time() at which stream time 0 goes out
        self._pacer: Optional[Any] = None
        self._media: Optional[OpusFromPcm] = None
        self._audio_format = (48000, 1)  # the input audio's rate and channels
        self._extradata = b""
        self._fps = Fraction(25)
        self._audio_at = 0.0  # stream time of the next Opus packet
        self._audio_pts = 0
        self.newest_frame = -1  # the last frame handed over by the writer
        self.newest_at: Optional[float] = None  # its time.time()
        self.sent_frame = -1  # the last frame sent out
        self.frames_sent = 0
        self.dropped_gops = 0
        self.ended = False
        self._hold_until: Optional[float] = None  # (loop time) the first packet waits for a coming viewer till then
        self._first_in: Optional[float] = None  # (loop time) the first packet came
        self._debt = 0.0  # s the stream's start waited for a viewer, to be made up at a keyframe
        self._loop.soon(self._start_pacer)

    # The watch server's side (its request threads).

    def coming(self) -> None:
        """A viewer is on its way (the page was asked for): aiortc is imported now rather than when its offer
        comes, and a stream not yet started waits for it (at most ``_HOLD_S``)."""
        self._loop.soon(self._coming)

    def answer(self, offer: str) -> tuple[str, str]:
        """An SDP offer -> (session id, SDP answer); Refused when it cannot be taken."""
        if len(self._viewers) >= MAX_VIEWERS:
            raise Refused(f"already {MAX_VIEWERS} viewers")
        try:
            return self._loop.run(self._answer(offer), timeout=_ANSWER_TIMEOUT_S)
        except TimeoutError:
            raise Refused("no answer could be made in time") from None
        except Exception as exc:  # (aiortc's ValueError, OperationError...: an offer it cannot take)
            raise Refused(str(exc) or type(exc).__name__) from None

    def sessions(self) -> list[str]:
        return list(self._viewers)

    def hang_up(self, session: str) -> bool:
        if session not in self._viewers:
            return False
        try:
            self._loop.run(self._hang_up(session), timeout=5)
        except TimeoutError:
            pass
        return True

    def status(self, session: Optional[str] = None) -> dict:
        """For status.json; with ``session`` (its viewer's own), the frame that viewer's picture started at
        (the session ids stay with their viewers: an id is what hangs a viewer up)."""
        viewer = self._viewers.get(session) if session else None
        behind = max(0, self.newest_frame - self.sent_frame) / self._fps if self.sent_frame >= 0 else None
        return {"viewers": len(self._viewers), "newest_frame": self.newest_frame, "newest_at": self.newest_at,
                "sent_frame": self.sent_frame, "frames_sent": self.frames_sent, "fps": float(self._fps),
                "behind_s": None if behind is None else round(float(behind), 3), "dropped_gops": self.dropped_gops,
                "ended": self.ended,
                **({"first_frame": viewer.first_frame, "lapses": viewer.drops} if viewer is not None else {})}

    # The writer's side (``rtc_process.WebRtcProcess`` is the writer's sink and hands it on).

    def open(self, tracks: Tracks) -> None:
        self._extradata, self._fps = tracks.avc_extradata, tracks.fps
        self._audio_format = (tracks.audio_rate, tracks.audio_channels)

    def take(self, first_frame: int, video: list[bytes], pcm: Optional[np.ndarray], pcm_at: int) -> None:
        """A fragment's H.264 access units (AVCC), from frame ``first_frame`` on, and its input audio ((C, n)
        float32 from input sample ``pcm_at`` on)."""
        items = []
        for i, avcc in enumerate(video):
            frame = first_frame + i
            data, key = annexb(avcc, self._extradata)
            items.append(_Item(float(frame / self._fps), packet(data, round(frame * VIDEO_CLOCK / self._fps),
                                                                  VIDEO_CLOCK), True, key, frame))
        if pcm is not None:  # (the input audio, not the AAC: it comes with its frames)
            if self._media is None:
                self._media = OpusFromPcm(*self._audio_format)
                self._audio_at = pcm_at / self._audio_format[0]
                self._audio_pts = round(self._audio_at * OPUS_RATE)
            for data in self._media.feed(pcm):
                items.append(_Item(self._audio_at, packet(data, self._audio_pts, OPUS_RATE), False))
                self._audio_at += OPUS_FRAME / OPUS_RATE
                self._audio_pts += OPUS_FRAME
        items.sort(key=lambda it: it.at)
        if video:
            self.newest_frame, self.newest_at = first_frame + len(video) - 1, time.time()
        self._loop.soon(self._append, items)

    def close(self) -> None:
        self._loop.soon(self._append, [_END])

    def shutdown(self) -> None:
        """Every viewer hung up and the loop stopped (when the server closes)."""
        self._loop.close(self._close_all)

    # The loop's side.

    def _coming(self) -> None:
        if self._origin is None:
            self._hold_until = self._loop.loop.time() + _HOLD_S
        import aiortc  # noqa: F401 - (once: the offer is answered sooner)

    def _held(self) -> bool:
        """Whether the stream's start waits for a viewer still connecting."""
        if self._hold_until is None or self._loop.loop.time() >= self._hold_until:
            return False
        return not any(v.pc.connectionState == "connected" for v in self._viewers.values())

    def _start_pacer(self) -> None:
        self._wake = asyncio.Event()
        self._pacer = self._loop.loop.create_task(self._pace())

    def _append(self, items: list) -> None:
        first = next((it for it in items if isinstance(it, _Item)), None)
        if first is not None and self._first_in is None:
            self._first_in = self._loop.loop.time()
        if first is not None and self._origin is not None:
            early = self._origin + first.at - self._loop.loop.time()
            if early < 0 and not self._queue:  # generation is slower than real time: the schedule moves by the wait
                self._origin -= early
            elif 0 < early < _CATCH_UP_S:  # the schedule runs behind the render: sent a little faster till it is not
                last = next((it for it in reversed(items) if isinstance(it, _Item)), first)
                self._origin -= min(early, _SPEED_UP * (last.at - first.at + 1 / float(self._fps)))
        self._queue.extend(items)
        self._drop_ahead()
        self._catch_up()
        self._wake.set()

    def _catch_up(self) -> None:
        """The wait for the first viewer made up: the frames before a keyframe that came soon enough skipped."""
        if self._debt <= 0 or self._origin is None:
            return
        timed = [it for it in self._queue if isinstance(it, _Item)]
        key = next((it for it in timed[1:] if it.video and it.key), None)
        if key is None:
            return
        if key.at - timed[0].at <= self._debt + _CATCH_UP_S:
            while self._queue[0] is not key:
                self._queue.popleft()
            self._origin -= key.at - timed[0].at  # (the keyframe goes out when the first frame skipped was due)
        self._debt = 0.0

    def _drop_ahead(self) -> None:
        """While more than ``buffer_s`` is queued, the oldest GOP goes (up to the next keyframe)."""
        timed = [it for it in self._queue if isinstance(it, _Item)]
        while timed and timed[-1].at - timed[0].at > self.buffer_s:
            key = next((it for it in timed[1:] if it.video and it.key), None)
            if key is None:
                return
            while self._queue[0] is not key:
                self._queue.popleft()
            if self._origin is not None:
                self._origin -= key.at - timed[0].at
            if not self.dropped_gops:
                self.say("info", f"live: generation runs ahead of real time; {self.name} skip ahead to stay within "
                                 f"{self.buffer_s:g} s of the render.")
            self.dropped_gops += 1
            timed = [it for it in self._queue if isinstance(it, _Item)]

    async def _pace(self) -> None:
        loop = self._loop.loop
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            item = self._queue[0]
            if item is _END:
                self._queue.popleft()
                self.ended = True
                continue
            now = loop.time()
            if self._origin is None:
                if self._held():
                    await asyncio.sleep(0.01)
                    continue
                if self._hold_until is not None:
                    self._debt = max(0.0, now - self._first_in)
                self._hold_until = None
                self._origin = now - item.at
            due = self._origin + item.at
            if due > now + 0.002:
                await asyncio.sleep(due - now)
                continue
            self._queue.popleft()
            if item.video:
                self.sent_frame = item.frame
                self.frames_sent += 1
            for viewer in list(self._viewers.values()):
                viewer.offer(item)

    async def _answer(self, offer: str) -> tuple[str, str]:
        from aiortc import RTCRtpSender, RTCSessionDescription

        pc = peer_connection(self._addresses)
        try:
            # the transceivers come first: aiortc settles the codecs when it reads the offer
            fps = float(self._fps)
            video, audio = packet_track("video", int(_VIEWER_QUEUE_S * fps) + 1), packet_track("audio", 50)
            h264 = [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType.lower() == "video/h264"]
            pc.addTransceiver(video, direction="sendonly").setCodecPreferences(h264)
            pc.addTransceiver(audio, direction="sendonly")
            await pc.setRemoteDescription(RTCSessionDescription(without_mdns(offer), "offer"))
            if len(pc.getTransceivers()) != 2:
                raise ValueError("the offer must ask for one video and one audio track")
            await pc.setLocalDescription(await pc.createAnswer())
            if "H264" not in pc.localDescription.sdp:
                raise ValueError("the browser offers no H.264 in packetization mode 1")
        except BaseException:
            await pc.close()
            raise
        session = secrets.token_urlsafe(12)
        self._viewers[session] = _Viewer(pc, video, audio)

        @pc.on("connectionstatechange")
        async def _changed() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self._hang_up(session)

        return session, pc.localDescription.sdp

    async def _hang_up(self, session: str) -> None:
        viewer = self._viewers.pop(session, None)
        if viewer is not None:
            await viewer.pc.close()

    async def _close_all(self) -> None:
        for session in list(self._viewers):
            await self._hang_up(session)
        if self._pacer is not None:
            self._pacer.cancel()


