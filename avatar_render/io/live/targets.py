"""What ``--live TARGET`` names: a push server (RTMP, SRT, a WHIP endpoint), an HLS playlist, or standard output."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional
from urllib.parse import urlsplit

from avatar_render.errors import AvatarRenderError

Kind = Literal["rtmp", "srt", "whip", "hls", "stdout"]


@dataclass(frozen=True)
class LiveTarget:
    kind: Kind
    url: str  # as given
    path: Optional[Path] = None  # the playlist (hls)

    @property
    def pushed(self) -> bool:
        """Sent at wall-clock pace to a server (the others are written as fast as they are encoded)."""
        return self.kind in ("rtmp", "srt", "whip")

    @property
    def shown(self) -> str:
        """The target for a message: the URL without its query (an SRT passphrase stays out of logs)."""
        if self.kind == "hls":
            return f"'{self.path}'"
        if self.kind == "stdout":
            return "standard output"
        parts = urlsplit(self.url)
        path = parts.path
        if self.kind == "rtmp" and path.count("/") >= 2:  # the last part of an RTMP path is the stream key
            path = path[: path.rindex("/") + 1] + "…"
        return f"{parts.scheme}://{parts.netloc}{path}"


def parse_target(text: str) -> LiveTarget:
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if text == "-":
        return LiveTarget("stdout", text)
    if scheme in ("rtmp", "rtmps"):
        parts = urlsplit(text)
        if not parts.hostname or parts.path.strip("/").count("/") < 1:
            raise AvatarRenderError(f"The RTMP target '{text}' must be rtmp://host[:port]/app/key.")
        return LiveTarget("rtmp", text)
    if scheme == "srt":
        parts = urlsplit(text)
        try:
            port = parts.port
        except ValueError:
            port = None
        if not parts.hostname or port is None:
            raise AvatarRenderError(f"The SRT target '{text}' must be srt://host:port (options after '?').")
        return LiveTarget("srt", text)
    if scheme in ("whip", "whips") or (scheme in ("http", "https") and "whip" in urlsplit(text).path.lower()):
        if not urlsplit(text).hostname:
            raise AvatarRenderError(f"The WHIP target '{text}' must be whip://host[:port]/path or an http(s):// URL.")
        return LiveTarget("whip", text)
    if scheme:
        raise AvatarRenderError(
            f"Live target '{text}': {scheme}:// is not supported; use rtmp://, srt://, whip:// (or an http(s):// "
            "WHIP endpoint, its path with 'whip' in it), a .m3u8 path or -.")
    if text.lower().endswith(".m3u8"):
        return LiveTarget("hls", text, path=Path(text))
    raise AvatarRenderError(
        f"'{text}' is not a live target: give rtmp://host/app/key, srt://host:port, a path ending in .m3u8 "
        "or - (fragmented MP4 on standard output).")


def parse_serve(text: str) -> tuple[str, int]:
    """``[ADDR:]PORT`` -> (address, port); the loopback when no address is given."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise AvatarRenderError(
            f"--serve '{text}' must be PORT or ADDR:PORT (a port from 0 to 65535; 0 picks a free one).")
    return host, int(port)
