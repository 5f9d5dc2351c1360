"""A WHIP connection (``--live whip://host[:port]/path`` or an ``http(s)://…/whip…`` URL): the SDP offer
POSTed to the endpoint, its answer (201 and a Location) applied, then the push sink's packets sent over
WebRTC: the file's H.264 as it is, its AAC as Opus (``rtc_media``). Pacing, underrun and retries are the
push sink's (``push.py``), as for RTMP; this is its connection, with the same ``send``/``close``."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from typing import Any, Optional
from urllib.parse import urljoin, urlsplit

from avatar_render.io.fmp4 import Tracks
from avatar_render.io.live.rtc_loop import RtcLoop, addresses_for, packet_track, peer_connection
from avatar_render.io.live.rtc_media import OPUS_FRAME, OPUS_RATE, VIDEO_CLOCK, OpusFromAac, annexb, packet
from avatar_render.io.live.targets import LiveTarget
from avatar_render.io.live.wire import IO_TIMEOUT_S, OPEN_TIMEOUT_S, WIRE_CLOCK, WirePacket

_QUEUE_S = 2.0  # media a track may hold before the connection counts as lost


def endpoint(target: LiveTarget) -> str:
    """The HTTP URL of a WHIP target (whip:// is plain HTTP, whips:// HTTPS)."""
    scheme, rest = target.url.split("://", 1)
    return {"whip": "http", "whips": "https"}.get(scheme.lower(), scheme.lower()) + "://" + rest


class WhipConnection:
    def __init__(self, target: LiveTarget, tracks: Tracks) -> None:
        self.url = endpoint(target)
        self._media = OpusFromAac(tracks)
        self._extradata = tracks.avc_extradata
        self._audio_pts: Optional[int] = None
        self._lost: Optional[str] = None
        self._location: Optional[str] = None
        self._pc: Any = None
        fps = float(tracks.fps)
        self._loop = RtcLoop("whip")
        try:
            self._loop.run(self._connect(int(_QUEUE_S * fps) + 1), timeout=OPEN_TIMEOUT_S)
        except TimeoutError:
            self.close(at_once=True)
            raise ConnectionError(f"the WHIP endpoint did not connect within {OPEN_TIMEOUT_S:g} s") from None
        except ConnectionError:
            self.close(at_once=True)
            raise

    async def _connect(self, video_limit: int) -> None:
        from aiortc import RTCRtpSender, RTCSessionDescription

        self._pc = pc = peer_connection(addresses_for(urlsplit(self.url).hostname or ""))
        self._video, self._audio = packet_track("video", video_limit), packet_track("audio", int(_QUEUE_S * 50))
        h264 = [c for c in RTCRtpSender.getCapabilities("video").codecs if c.mimeType.lower() == "video/h264"]
        pc.addTransceiver(self._video, direction="sendonly").setCodecPreferences(h264)
        pc.addTransceiver(self._audio, direction="sendonly")
        connected = asyncio.Event()

        @pc.on("connectionstatechange")
        async def _changed() -> None:
            if pc.connectionState == "connected":
                connected.set()
            elif pc.connectionState in ("failed", "closed") and self._lost is None:
                self._lost = "the WHIP connection was " + pc.connectionState
                connected.set()

        await pc.setLocalDescription(await pc.createOffer())
        answer, self._location = await asyncio.get_running_loop().run_in_executor(
            None, self._post, pc.localDescription.sdp)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        except ValueError as exc:
            raise ConnectionError(f"the WHIP endpoint's answer cannot be used ({exc})") from None
        await connected.wait()
        if self._lost is not None:
            raise ConnectionError(self._lost)

    def _post(self, offer: str) -> tuple[str, Optional[str]]:
        request = urllib.request.Request(self.url, data=offer.encode(), method="POST",
                                         headers={"Content-Type": "application/sdp"})
        try:
            with urllib.request.urlopen(request, timeout=OPEN_TIMEOUT_S) as reply:
                if reply.status != 201:
                    raise ConnectionError(f"the WHIP endpoint answered {reply.status} instead of 201")
                location = reply.headers.get("Location")
                return reply.read().decode("utf-8", "replace"), urljoin(self.url, location) if location else None
        except urllib.error.HTTPError as exc:
            raise ConnectionError(f"the WHIP endpoint answered {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            why = getattr(exc, "reason", exc)
            raise ConnectionError(str(getattr(why, "strerror", None) or why).lower()) from None

    def send(self, wire: WirePacket) -> None:
        if self._lost is not None:
            raise ConnectionError(self._lost)
        if wire.video:
            data, _ = annexb(wire.data, self._extradata)
            self._loop.soon(self._put, self._video, packet(data, wire.pts, VIDEO_CLOCK))
            return
        if self._audio_pts is None:
            self._audio_pts = round(wire.pts * OPUS_RATE / WIRE_CLOCK)
        for data in self._media.feed(wire.data):
            self._loop.soon(self._put, self._audio, packet(data, self._audio_pts, OPUS_RATE))
            self._audio_pts += OPUS_FRAME

    def _put(self, track: Any, item: Any) -> None:
        try:
            track.queue.put_nowait(item)
        except asyncio.QueueFull:
            self._lost = self._lost or f"the WHIP connection took no media for {_QUEUE_S:g} s"

    def close(self, *, at_once: bool = False) -> None:
        """What is queued sent (up to IO_TIMEOUT_S), the session deleted at the endpoint, the connection
        closed. Never raises."""
        self._loop.close(lambda: self._hang_up(at_once), timeout=IO_TIMEOUT_S + 5)

    async def _hang_up(self, at_once: bool) -> None:
        if self._pc is None:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (0 if at_once or self._lost else IO_TIMEOUT_S)
        while loop.time() < deadline and not (self._video.queue.empty() and self._audio.queue.empty()):
            await asyncio.sleep(0.02)
        if self._location is not None:
            await loop.run_in_executor(None, self._delete)
        await self._pc.close()

    def _delete(self) -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(self._location, method="DELETE"), timeout=2).close()
        except (urllib.error.URLError, OSError):
            pass
