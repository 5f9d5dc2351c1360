"""aiortc's side of things: an asyncio loop in a thread of its own, peer connections that reach only
the addresses they are meant to, and tracks that hand aiortc packets already encoded.

aiortc is imported in that thread when first needed (it costs 0.4 s), never when the package loads.
Two things of aiortc's defaults are not wanted here: a STUN server on the public internet (it would send
traffic off the machine; every connection here has ``iceServers=[]``), and ICE on every interface but the
loopback (aioice leaves 127.0.0.1 out). ``connecting_from`` names the addresses a connection may use: a
server on the loopback is reached on the loopback only. Browsers hide their own addresses behind mDNS
names; those candidates are dropped from an offer (resolving them would send multicast to the network),
and the browser is reached as a peer-reflexive candidate from its connectivity checks instead.
"""

from __future__ import annotations

import asyncio
import contextvars
import ipaddress
import socket
import threading
from typing import Any, Awaitable, Callable, Optional, TypeVar

T = TypeVar("T")
_ADDRESSES: contextvars.ContextVar[Optional[list[str]]] = contextvars.ContextVar("rtc_addresses", default=None)


class RtcLoop:
    """An asyncio event loop run by a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Awaitable[T], timeout: float) -> T:
        """``coro`` run on the loop, from another thread; TimeoutError after ``timeout`` seconds."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def soon(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the server has gone
            pass

    def close(self, cleanup: Optional[Callable[[], Awaitable[None]]] = None, *, timeout: float = 5.0) -> None:
        """``cleanup`` run, the tasks left cancelled, the loop stopped. Never raises."""
        if self.loop.is_closed():
            return
        try:
            if cleanup is not None:
                self.run(cleanup(), timeout=timeout)
            self.run(_cancel_the_rest(), timeout=2)
        except Exception:  # (TimeoutError, or whatever the cleanup met: the loop is stopped all the same)
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_the_rest() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def addresses_for(host: str) -> Optional[list[str]]:
    """The local addresses ICE may use to serve or reach ``host``: the loopback for a loopback host,
    that address for a specific one, every interface (None) for an unspecified one or a remote host."""
    try:
        ips = {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_UDP)}
    except (OSError, UnicodeError):
        return None
    parsed = [ipaddress.ip_address(ip.split("%")[0]) for ip in ips]
    if parsed and all(ip.is_loopback for ip in parsed):
        return ["127.0.0.1"] if any(ip.version == 4 for ip in parsed) else ["::1"]
    return None


def without_mdns(sdp: str) -> str:
    """``sdp`` without the candidates that name an mDNS host (``….local``)."""
    lines = sdp.splitlines()
    kept = [ln for ln in lines if not (ln.startswith("a=candidate:") and len(ln.split()) > 4
                                       and ln.split()[4].endswith(".local"))]
    return "\r\n".join(kept) + "\r\n"


def peer_connection(addresses: Optional[list[str]]) -> Any:
    """A new RTCPeerConnection with no STUN or TURN server; its ICE candidates on ``addresses`` (None:
    every interface) when gathered in the same asyncio task as this call (see ``_install_hook``)."""
    from aiortc import RTCConfiguration, RTCPeerConnection

    _install_hook()
    _ADDRESSES.set(addresses)
    return RTCPeerConnection(RTCConfiguration(iceServers=[]))


def _install_hook() -> None:
    """aioice gathers host candidates from ``aioice.ice.get_host_addresses`` (its only way in): it is
    wrapped once to give the addresses the current task chose, falling back to aioice's own choice."""
    import aioice.ice

    original = aioice.ice.get_host_addresses
    if getattr(original, "avatar_render", False):
        return

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        chosen = _ADDRESSES.get()
        return original(use_ipv4, use_ipv6) if chosen is None else list(chosen)

    host_addresses.avatar_render = True  # type: ignore[attr-defined]
    aioice.ice.get_host_addresses = host_addresses


def packet_track(kind: str, limit: int) -> Any:
    """An aiortc track that hands out the encoded ``av.Packet``s put in its ``queue`` (at most ``limit``)
    as they come: aiortc packetizes them (``Encoder.pack``) without encoding anything. None ends it."""
    from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

    class PacketTrack(MediaStreamTrack):
        def __init__(self) -> None:
            super().__init__()
            self.kind = kind
            self.queue: asyncio.Queue = asyncio.Queue(limit)

        async def recv(self) -> Any:
            item = await self.queue.get()
            if item is None:
                self.stop()
                raise MediaStreamError
            return item

    return PacketTrack()
