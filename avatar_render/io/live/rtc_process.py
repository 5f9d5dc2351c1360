"""The WebRTC viewers of ``--serve`` in a process of their own: aiortc's per-packet work for every viewer
(packetizing, SRTP, sending) is Python that holds its interpreter's lock; in the render's process it took
turns with the chunk loop and slowed the render by a fifth with ten viewers (docs/live.md). Here it runs in
``python -m avatar_render.io.live.rtc_process FD HOST BUFFER_S``, which holds a ``WebRtcHub``, at a lower
priority than the render (viewers need real time only; the render runs ahead of it).

``WebRtcProcess`` stands in for the hub in the render's process (the watch server's and the writer's side
alike). Messages go both ways over a socket pair as pickles: to the child ``open``, ``write``, ``close``,
``coming``, ``answer`` and ``hang_up`` (with an id), ``shutdown``; back, ``reply`` (to an id), ``say`` and
``status`` (the hub's figures, sent when they change, at most every ``_STATUS_S``). The writer never waits
for the child: its messages go through a queue and a thread; a child that has taken nothing for
``_STUCK_S`` seconds, or has ended, is given up with one warning (the page plays HLS then).
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Optional

from avatar_render.io.fmp4 import MuxerState, Tracks
from avatar_render.io.live.webrtc import _ANSWER_TIMEOUT_S, Refused, Say, WebRtcHub
from avatar_render.io.live.wire import child_env

if TYPE_CHECKING:
    from avatar_render.io.encoder import Fragment

NICENESS = 10  # the child's, over the render's: viewers take real time only, the render runs ahead of it
_STATUS_S = 0.05
_STUCK_S = 5.0
_START_S = 20.0  # the longest an offer waits for the child to be up (its imports)


class WebRtcProcess:
    """The hub's interface (``coming``, ``answer``, ``hang_up``, ``status``; ``open``, ``write``, ``close``),
    served by a child process."""

    def __init__(self, *, host: str, buffer_s: float, say: Say) -> None:
        self.name, self.say = "WebRTC viewers", say
        ours, theirs = socket.socketpair()
        self._conn = Connection(os.dup(ours.fileno()))
        ours.close()
        self._proc = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno()), host, repr(buffer_s)],
                                      pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(),
                                      start_new_session=True)
        theirs.close()
        self._outbox: queue.Queue = queue.Queue()
        self._replies: dict[int, tuple[threading.Event, list]] = {}
        self._ids = itertools.count()
        self._status: dict = {}
        self._up = threading.Event()
        self._gone: Optional[str] = None  # why the child was given up
        self._closing = False
        self._stderr = b""
        self.newest_frame, self.newest_at = -1, None
        self._fps = 25.0
        threading.Thread(target=self._send_loop, name="webrtc-out", daemon=True).start()
        threading.Thread(target=self._receive_loop, name="webrtc-in", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="webrtc-log", daemon=True).start()

    # The watch server's side.

    def coming(self) -> None:
        self._post("coming")

    def answer(self, offer: str) -> tuple[str, str]:
        if not self._up.wait(_START_S) or self._gone:
            raise Refused(self._gone or "the viewers' process did not start")
        ok, result = self._ask("answer", offer, timeout=_ANSWER_TIMEOUT_S + 2)
        if not ok:
            raise Refused(result)
        return result

    def hang_up(self, session: str) -> bool:
        try:
            return self._ask("hang_up", session, timeout=7)[1]
        except Refused:
            return False

    def status(self, session: Optional[str] = None) -> dict:
        hub = dict(self._status.get("hub", {"viewers": 0, "sent_frame": -1, "frames_sent": 0, "dropped_gops": 0,
                                             "ended": False}))
        sent = hub.get("sent_frame", -1)
        behind = max(0, self.newest_frame - sent) / self._fps if sent >= 0 else None
        hub.update(newest_frame=self.newest_frame, newest_at=self.newest_at, fps=self._fps,
                   behind_s=None if behind is None else round(behind, 3))
        viewer = self._status.get("sessions", {}).get(session) if session else None
        return {**hub, **(viewer or {})}

    # The writer's side.

    @property
    def failed(self) -> None:
        return None

    def open(self, tracks: Tracks, start: MuxerState, *, first_frame: int) -> None:
        self._fps = float(tracks.fps)
        self._post("open", tracks)

    def write(self, fragment: Fragment) -> None:
        if fragment.video:
            self.newest_frame, self.newest_at = fragment.first_frame + len(fragment.video) - 1, time.time()
        self._post("write", fragment.first_frame, [s.data for s in fragment.video], fragment.pcm, fragment.pcm_at)

    def end_gop(self) -> None:
        pass

    def close(self) -> None:
        self._post("close")

    def abort(self) -> None:
        self.close()

    def shutdown(self) -> None:
        """The child's viewers hung up and the child ended (when the server closes)."""
        self._closing = True
        self._post("shutdown")
        self._outbox.put(None)
        try:
            self._proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    # Its threads.

    def _post(self, *message: Any) -> None:
        if self._gone is None:
            self._outbox.put(message)

    def _ask(self, kind: str, arg: Any, *, timeout: float) -> Any:
        key = next(self._ids)
        done, box = self._replies[key] = (threading.Event(), [])
        self._post(kind, key, arg)
        try:
            if not done.wait(timeout):
                raise Refused(self._gone or "the viewers' process did not answer in time")
            return box[0]
        finally:
            self._replies.pop(key, None)

    def _send_loop(self) -> None:
        while (message := self._outbox.get()) is not None:
            if self._gone:
                continue
            sent = threading.Timer(_STUCK_S, self._give_up, ("took nothing for %g s" % _STUCK_S,))
            sent.start()
            try:
                self._conn.send(message)
            except OSError:
                self._give_up("ended")
            finally:
                sent.cancel()

    def _receive_loop(self) -> None:
        try:
            while True:
                kind, *rest = self._conn.recv()
                if kind == "status":
                    self._status = rest[0]
                    self._up.set()
                elif kind == "reply":
                    key, result = rest
                    if key in self._replies:
                        self._replies[key][1].append(result)
                        self._replies[key][0].set()
                elif kind == "say":
                    self.say(*rest)
        except (EOFError, OSError):
            self._give_up("ended")

    def _read_stderr(self) -> None:
        for line in self._proc.stderr:
            self._stderr = (self._stderr + line)[-4096:]

    def _give_up(self, why: str) -> None:
        if self._gone is not None:
            return
        if self._closing:
            self._gone = "the render has ended"
            return
        last = self._stderr.decode(errors="replace").strip().splitlines()
        self._gone = f"the viewers' process {why}" + (f" ({last[-1].strip()})" if last else "")
        self._up.set()
        for done, box in list(self._replies.values()):
            box.append((False, self._gone))
            done.set()
        self.say("warning", f"live: WebRTC: {self._gone}; the page plays HLS instead.")
        if self._proc.poll() is None and why != "ended":
            self._proc.kill()


# The child.

class _Child:
    def __init__(self, conn: Connection, host: str, buffer_s: float) -> None:
        self.conn, self.lock = conn, threading.Lock()
        self.hub = WebRtcHub(host=host, buffer_s=buffer_s, say=lambda *m: self.send("say", *m))
        self.last: Optional[dict] = None

    def send(self, *message: Any) -> None:
        with self.lock:
            self.conn.send(message)

    def status(self) -> dict:
        sessions = {s: {k: v for k, v in self.hub.status(s).items() if k in ("first_frame", "lapses")}
                    for s in list(self.hub.sessions())}
        hub = {k: v for k, v in self.hub.status().items() if k in ("viewers", "sent_frame", "frames_sent",
                                                                     "dropped_gops", "ended")}
        return {"hub": hub, "sessions": sessions}

    def report(self) -> None:
        """The hub's figures, when they change."""
        while True:
            now = self.status()
            if now != self.last:
                self.send("status", now)
                self.last = now
            time.sleep(_STATUS_S)

    def reply(self, key: int, fn: Any, *args: Any) -> None:
        try:
            result = (True, fn(*args))
        except Refused as exc:
            result = (False, str(exc))
        self.send("reply", key, result)

    def run(self) -> None:
        import aiortc  # noqa: F401 - (now: the first offer is answered sooner)

        threading.Thread(target=self.report, daemon=True).start()
        try:
            while True:
                kind, *rest = self.conn.recv()
                if kind == "write":
                    self.hub.take(*rest)
                elif kind == "open":
                    self.hub.open(rest[0])
                elif kind == "coming":
                    self.hub.coming()
                elif kind == "close":
                    self.hub.close()
                elif kind in ("answer", "hang_up"):
                    fn = self.hub.answer if kind == "answer" else self.hub.hang_up
                    threading.Thread(target=self.reply, args=(rest[0], fn, rest[1]), daemon=True).start()
                elif kind == "shutdown":
                    break
        except EOFError:  # the render has gone
            pass
        self.hub.shutdown()


def main(fd: int, host: str, buffer_s: float) -> int:
    try:
        os.nice(NICENESS)
    except OSError:
        pass
    _Child(Connection(fd), host, buffer_s).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3])))
