"""``--serve``: a small HTTP server (the loopback by default) for the growing HLS stream, a watch page
with a player and the render's progress as JSON.

The player is hls.js (Apache-2.0), shipped in the package (``static/``, its version in
``static/HLSJS.md``), so nothing is fetched from another server when someone watches."""

from __future__ import annotations

import json
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from typing import Callable, Collection, Iterator, Optional, Protocol

from avatar_render.errors import AvatarRenderError
from avatar_render.io.live.rtc_process import WebRtcProcess
from avatar_render.io.live.webrtc import Refused

_TYPES = {".m3u8": "application/vnd.apple.mpegurl", ".m4s": "video/iso.segment", ".mp4": "video/mp4"}
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_OFFER_LIMIT = 64 << 10  # an SDP offer is a few KB


def _static(name: str) -> bytes:
    return resources.files("avatar_render.io.live").joinpath("static", name).read_bytes()


class AudioIntake(Protocol):
    def push(self, data: bytes) -> None: ...  # raises EOFError once the audio has ended
    def end(self) -> None: ...


def _body(handler: BaseHTTPRequestHandler, piece: int = 1 << 14) -> Iterator[bytes]:
    """A request's body in pieces as they arrive: chunked transfer encoding, or Content-Length bytes."""
    rfile = handler.rfile
    if "chunked" in handler.headers.get("Transfer-Encoding", "").lower():
        while True:
            size = int(rfile.readline(64).split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline(1024).strip():  # trailers, up to the empty line
                    pass
                return
            yield from _read(rfile, size, piece)
            rfile.readline(8)  # the CRLF after the chunk
    yield from _read(rfile, int(handler.headers.get("Content-Length") or 0), piece)


def _read(rfile, size: int, piece: int) -> Iterator[bytes]:
    """``size`` bytes of ``rfile`` in pieces of at most ``piece`` as they arrive."""
    while size > 0:
        data = rfile.read1(min(size, piece))
        if not data:
            raise ValueError("the body ended early")
        size -= len(data)
        yield data


class WatchServer:
    """Serves ``folder``'s playlist ``playlist`` and its segments under /live/, the page at /, the
    progress at /status.json. Only the names ``served()`` gives at the time of the request are handed
    out (the files the render wrote and listed): anything else in the folder is not found.
    ``last_request`` (time.monotonic()) tells whether anyone is watching. With ``webrtc``, an SDP offer
    POSTed to /whep is answered by it (WHEP), and /whep/SESSION is hung up by a DELETE.

    With ``audio_in`` (a session's ``Pieces``), ``POST /audio`` adds its body (with a length or chunked)
    to the session's audio as it comes, and ``POST /end`` ends it."""

    def __init__(self, host: str, port: int, folder: Path, playlist: str, *,
                 served: Callable[[], Collection[str]], webrtc: Optional[WebRtcProcess] = None) -> None:
        self.folder, self.playlist, self.served = Path(folder), playlist, served
        self.webrtc = webrtc
        self.status: dict = {"state": "starting", "chunks": 0, "frames": 0, "frames_total": None,
                             "generated_fps": 0.0, "realtime_factor": 0.0, "eta_s": None}
        self.last_request: Optional[float] = None
        self.first_segment_request: Optional[float] = None  # time.monotonic() of the first segment served
        self.audio_in: Optional[AudioIntake] = None
        page = _static("watch.html").replace(b"PLAYLIST", playlist.encode())
        files = {"/": (page, "text/html; charset=utf-8"),
                 "/hls.light.min.js": (_static("hls.light.min.js"), "text/javascript")}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the standard library's name
                server.last_request = time.monotonic()
                path, _, query = self.path.partition("?")
                if path == "/favicon.ico":
                    self._reply(b"", "image/x-icon", cache=True)
                elif path in files:
                    if path == "/" and server.webrtc is not None:
                        server.webrtc.coming()
                    self._reply(*files[path], cache=True)
                elif path == "/status.json":
                    ready = server.playlist in server.served()  # the player starts once it is there
                    session = query[len("session="):] if query.startswith("session=") else None
                    rtc = {} if server.webrtc is None else {"webrtc": server.webrtc.status(session)}
                    self._reply(json.dumps({**server.status, "playlist": ready, **rtc}).encode(), "application/json")
                elif (path.startswith("/live/") and _NAME.match(path[6:]) and Path(path[6:]).suffix in _TYPES
                      and path[6:] in server.served()):
                    try:
                        body = (server.folder / path[6:]).read_bytes()
                    except OSError:
                        self.send_error(HTTPStatus.NOT_FOUND)
                        return
                    if path.endswith(".m4s") and server.first_segment_request is None:
                        server.first_segment_request = time.monotonic()
                    self._reply(body, _TYPES[Path(path).suffix], cache=not path.endswith(".m3u8"))
                else:
                    self.send_error(HTTPStatus.NOT_FOUND)

            def do_POST(self) -> None:  # noqa: N802 - the standard library's name
                server.last_request = time.monotonic()
                path = self.path.split("?", 1)[0]
                if path in ("/audio", "/end"):
                    self._audio(path)
                elif path == "/whep":
                    self._offer()
                else:
                    self.send_error(HTTPStatus.NOT_FOUND)

            def _audio(self, path: str) -> None:
                intake = server.audio_in
                if intake is None:
                    self.send_error(HTTPStatus.NOT_FOUND)
                    return
                try:
                    if path == "/end":
                        for _ in _body(self):  # (a body is read and dropped)
                            pass
                        intake.end()
                    else:
                        for piece in _body(self):
                            intake.push(piece)
                except EOFError:
                    self.send_error(HTTPStatus.CONFLICT, "the session's audio has ended")
                    return
                except (ValueError, OSError):
                    self.send_error(HTTPStatus.BAD_REQUEST, "the body could not be read")
                    return
                self.send_response(HTTPStatus.NO_CONTENT)
                self.end_headers()

            def _offer(self) -> None:
                if server.webrtc is None:
                    self.send_error(HTTPStatus.NOT_IMPLEMENTED)
                    return
                size = self.headers.get("Content-Length", "")
                size = int(size) if size.isdigit() else 0
                if not 0 < size <= _OFFER_LIMIT:
                    self.send_error(HTTPStatus.BAD_REQUEST)
                    return
                try:
                    session, answer = server.webrtc.answer(self.rfile.read(size).decode("utf-8", "replace"))
                except Refused as exc:
                    self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, explain=str(exc))
                    return
                self._reply(answer.encode(), "application/sdp", status=HTTPStatus.CREATED,
                            headers={"Location": f"/whep/{session}"})

            def do_DELETE(self) -> None:  # noqa: N802
                session = self.path[len("/whep/"):] if self.path.startswith("/whep/") else ""
                if server.webrtc is not None and session and server.webrtc.hang_up(session):
                    self._reply(b"", "text/plain")
                else:
                    self.send_error(HTTPStatus.NOT_FOUND)

            def _reply(self, body: bytes, kind: str, *, cache: bool = False, status: HTTPStatus = HTTPStatus.OK,
                       headers: Optional[dict] = None) -> None:
                try:
                    self.send_response(status)
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("Cache-Control", "max-age=3600" if cache else "no-cache")
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
                pass

        try:
            self._httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise AvatarRenderError(f"Cannot serve on {host}:{port}: {exc.strerror or exc}.") from None
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="watch-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/"

    def close(self) -> None:
        if self.webrtc is not None:
            self.webrtc.shutdown()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
