"""A push target (RTMP, SRT, WHIP) fed at wall-clock pace from a bounded queue of encoded fragments.

Packet times come from the counters: video frame ``i`` at ``i / fps``, audio at its sample clock, both
plus the AAC priming (so that nothing is negative) and, under ``hold``, the filler sent so far.
Packet ``n`` leaves at ``start + its time + preroll``: the queue holds at most ``buffer_s`` seconds
of media, so memory stays flat however far generation runs ahead (the writer, then generation, wait).

When the queue is empty at a packet's time (generation slower than real time), the policy decides:
``stall`` waits (the schedule moves by the wait), ``hold`` sends the last frame again with silence
(a closed GOP of its own, at a GOP end only; elsewhere it stalls), ``preroll`` measures the speed on
the first chunks and delays the start so that a render of known length plays through without a stall.

In a real-time session the start is the session's clock's time 0 (``Pacing.origin``), not the first
packet, which comes after the render's set-up: the stream's delay behind the clock is the pre-roll, not
the pre-roll plus the set-up. A late packet then goes out as soon as it comes and the schedule stays on
the clock (the session's timeline follows the clock: nothing would ever bring a moved schedule back).

A lost connection is retried with back-off for ``retry_s`` seconds; meanwhile the fragments past their time are dropped
(the file keeps being written), and the stream goes on at the next keyframe, its times continuing the
same timeline. After that the target is given up (``failed``) and the render goes on without it.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Callable, Literal, Optional, Union

from avatar_render.errors import AvatarRenderError
from avatar_render.io.encoder import Fragment
from avatar_render.io.fmp4 import AAC_FRAME, AAC_PRIMING, MuxerState, Tracks
from avatar_render.io.live.filler import Filler
from avatar_render.io.live.targets import LiveTarget
from avatar_render.io.live.whip import WhipConnection
from avatar_render.io.live.wire import WIRE_CLOCK, Sender, WirePacket, connect
from avatar_render.io.spec import WriterSpec

Policy = Literal["stall", "hold", "preroll"]
POLICIES: tuple[str, ...] = ("stall", "hold", "preroll")
_HOLD_SECONDS = 0.5  # filler sent per wait under ``hold``
Say = Callable[[Literal["info", "warning"], str], None]


@dataclass(frozen=True)
class Pacing:
    policy: Policy = "stall"
    preroll_s: float = 1.0  # packet n leaves at start + its time + this
    buffer_s: float = 10.0  # media the queue may hold ahead of the wire (``preroll`` raises it as it needs)
    retry_s: float = 30.0  # how long a lost connection is retried before the target is given up
    # a real-time session's clock (io/audio_stream.py): the time.monotonic() at which its time 0 was. The
    # schedule then counts from it rather than from the first packet, which comes after the render's set-up
    # (a schedule counted from there would keep the set-up's delay for the whole session).
    origin: Optional[Callable[[], Optional[float]]] = None


@dataclass
class PushStats:
    first_packet_at: Optional[float] = None  # time.monotonic() when the first packet went out
    packets: int = 0
    stalls: int = 0
    stalled_s: float = 0.0
    held_s: float = 0.0  # filler sent under ``hold``
    dropped_fragments: int = 0  # lost while the connection was down (or before a keyframe after it)
    reconnects: int = 0
    preroll_s: float = 0.0  # the pre-roll the stream started with
    send_cpu_s: float = 0.0  # CPU time of this sink's thread (muxing, sending, filler)
    video_end: int = 0  # wire time after the last video packet sent (1 / WIRE_CLOCK)
    audio_end: int = 0


_CLOSE = object()
_GOP_END = object()
Item = Union[Fragment, object]


class _Buffer:
    """A FIFO of fragments and markers holding at most ``limit_s`` seconds of video; ``put`` waits
    for room, or drops the oldest fragment instead where ``may_drop(it)`` says so."""

    def __init__(self, limit_s: float, fps: Fraction) -> None:
        self.limit_s, self.fps = limit_s, fps
        self._items: collections.deque[tuple[Item, float]] = collections.deque()
        self._held_s = 0.0
        self._cond = threading.Condition()

    def _seconds(self, item: Item) -> float:
        return float(len(item.video) / self.fps) if isinstance(item, Fragment) else 0.0

    def put(self, item: Item, *, may_drop: Callable[[Fragment], bool] = lambda f: False,
            dropped: Callable[[], None] = lambda: None) -> None:
        with self._cond:
            while isinstance(item, Fragment) and self._held_s and self._held_s + self._seconds(item) > self.limit_s:
                oldest = next(i for i, _ in self._items if isinstance(i, Fragment))
                if may_drop(oldest):
                    self._drop_oldest()
                    dropped()
                    continue
                self._cond.wait(timeout=0.1)
            self._items.append((item, time.monotonic()))
            self._held_s += self._seconds(item)
            self._cond.notify_all()

    def _drop_oldest(self) -> None:
        for i, (item, _) in enumerate(self._items):
            if isinstance(item, Fragment):
                del self._items[i]
                self._held_s -= self._seconds(item)
                return

    def get(self, timeout: Optional[float]) -> Optional[tuple[Item, float]]:
        """The next item and when it was put, or None after ``timeout`` seconds."""
        with self._cond:
            if not self._items and not self._cond.wait_for(lambda: self._items, timeout=timeout):
                return None
            item, at = self._items.popleft()
            self._held_s -= self._seconds(item)
            self._cond.notify_all()
            return item, at

    def peek_all(self) -> list[tuple[Item, float]]:
        with self._cond:
            return list(self._items)

    def wait_for(self, predicate: Callable[[list[tuple[Item, float]]], bool], timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: predicate(list(self._items)), timeout=timeout)


class _Abort(Exception):
    pass


class PushSink:
    def __init__(self, target: LiveTarget, pacing: Pacing, *, spec: WriterSpec, say: Say,
                 total_seconds: Callable[[], Optional[float]] = lambda: None) -> None:
        self.target, self.pacing, self.spec, self.say = target, pacing, spec, say
        self.name = target.shown
        self.total_seconds = total_seconds
        self.stats = PushStats()
        self._buffer = _Buffer(pacing.buffer_s, spec.fps)
        self._abort = threading.Event()
        self._failed: Optional[AvatarRenderError] = None
        self._lost = False  # (sink thread) the connection is down: the writer's fragments are dropped
        self._conn: Optional[Sender] = None
        self._thread: Optional[threading.Thread] = None
        self._tracks: Optional[Tracks] = None
        self._filler: Optional[Filler] = None
        # the schedule: a packet at wire time ``pts`` leaves at t0 + (pts - pts0) / WIRE_CLOCK + shift
        self._t0: Optional[float] = None
        self._pts0 = 0
        self._shift = 0.0
        self._on_clock = False  # the schedule follows a session's clock: a late packet goes out when it comes
        self._next_video = 0  # wire time of the next video packet
        self._next_audio = 0
        self._hold_video = self._hold_audio = 0  # filler sent, in wire ticks, per track
        self._at_gop_end = False
        self._need_key = False
        self._last_rgb = None
        self._epoch = 0  # connections lost so far

    @property
    def failed(self) -> Optional[AvatarRenderError]:
        return self._failed

    # The writer thread's side.

    def open(self, tracks: Tracks, start: MuxerState, *, first_frame: int) -> None:
        self._tracks = tracks
        self._next_video = self._video_pts(first_frame)
        self._next_audio = self._audio_pts(start.audio_time)
        try:
            self._conn = _connect(self.target, tracks)
        except ConnectionError as exc:
            raise AvatarRenderError(f"Could not connect to the live target {self.name}: {exc}.") from None
        if self.pacing.policy == "hold":
            self._filler = Filler(self.spec, tracks.avc_extradata)
        self._thread = threading.Thread(target=self._run, name=f"live-{self.target.kind}", daemon=True)
        self._thread.start()

    def write(self, fragment: Fragment) -> None:
        if self._failed is not None:
            return
        if self.pacing.policy != "hold":
            fragment = replace(fragment, last_rgb=None)  # only ``hold`` shows it again
        self._buffer.put(fragment, may_drop=self._may_drop, dropped=self._count_drop)

    def _may_drop(self, oldest: Fragment) -> bool:
        """While the connection is down the queue drops what is past its time (generation stays paced,
        and the stream goes on near where the clock is); once given up (or stopping), anything."""
        if self._failed is not None or self._abort.is_set():
            return True
        return self._lost and (self._t0 is None or self._due(self._video_pts(oldest.first_frame)) < time.monotonic())

    def end_gop(self) -> None:
        self._buffer.put(_GOP_END)

    def close(self) -> None:
        """Send what is queued (at its pace), then end the stream."""
        self._buffer.put(_CLOSE)
        if self._thread is not None:
            self._thread.join()

    def abort(self) -> None:
        self._abort.set()
        self._buffer.put(_CLOSE)
        if self._thread is not None:
            self._thread.join(timeout=10.0)
        elif self._conn is not None:
            self._conn.close()

    def _count_drop(self) -> None:
        self.stats.dropped_fragments += 1

    # The sink thread.

    def _run(self) -> None:
        cpu = time.thread_time()
        try:
            while True:
                item, put_at = self._take()
                if item is _CLOSE:
                    break
                if item is _GOP_END:
                    self._at_gop_end = True
                    continue
                self._at_gop_end = False
                if self._failed is None:
                    self._send_fragment(item, put_at)
        except _Abort:
            pass
        finally:
            if self._conn is not None:
                self._conn.close()
            self.stats.send_cpu_s = time.thread_time() - cpu

    def _take(self) -> tuple[Item, float]:
        while True:
            if self._abort.is_set():
                raise _Abort
            if self._t0 is None or self._failed is not None:
                got = self._buffer.get(timeout=0.1)
                if got is not None:
                    return got
                continue
            due = self._due(self._next_video)
            late = self._on_clock and time.monotonic() >= due  # (on a session's clock: no stall, what comes goes out)
            got = self._buffer.get(timeout=0.1 if late else max(0.0, min(due - time.monotonic(), 0.1)))
            if got is not None:
                return got
            if time.monotonic() < due or self._on_clock:
                continue
            if self.pacing.policy == "hold" and self._at_gop_end and self._hold():
                continue
            return self._stall(due)

    def _stall(self, due: float) -> tuple[Item, float]:
        if not self.stats.stalls:
            self.say("warning", f"live: generation is slower than real time; the stream to {self.name} waits for it "
                                "(viewers see it pause).")
        self.stats.stalls += 1
        while True:
            if self._abort.is_set():
                raise _Abort
            got = self._buffer.get(timeout=0.1)
            if got is not None:
                wait = max(0.0, time.monotonic() - due)
                self._shift += wait
                self.stats.stalled_s += wait
                return got

    def _due(self, pts: int) -> float:
        return self._t0 + (pts - self._pts0) / WIRE_CLOCK + self._shift

    def _video_pts(self, frame: int) -> int:
        return round((Fraction(frame) / self.spec.fps + Fraction(AAC_PRIMING, self.spec.audio_rate)) *
                     WIRE_CLOCK) + self._hold_video

    def _audio_pts(self, audio_time: int) -> int:
        return round(Fraction(audio_time, self.spec.audio_rate) * WIRE_CLOCK) + self._hold_audio

    def _start(self, fragment: Fragment, put_at: float) -> None:
        """The schedule's origin: the first packet leaves a pre-roll from now."""
        preroll = self.pacing.preroll_s
        if self.pacing.policy == "preroll":
            preroll = max(preroll, self._needed_preroll(fragment, put_at))
        self.stats.preroll_s = preroll
        first = min(self._video_pts(fragment.first_frame), self._audio_pts(fragment.audio_time))
        self._t0, self._pts0, self._shift, self._on_clock = time.monotonic() + preroll, first, 0.0, False
        origin = self.pacing.origin() if self.pacing.origin is not None and not self._epoch else None
        if origin is not None:  # (the first start only: after a lost connection the stream goes on from a keyframe)
            self._t0, self._pts0 = min(origin, time.monotonic()) + preroll, self._video_pts(0)
            self._on_clock = True

    def _needed_preroll(self, first: Fragment, put_at: float) -> float:
        """The wait that lets a render of known length play through: generation speed from the first
        chunks' arrivals, the rest of the render's length from ``total_seconds``."""
        while not self._buffer.wait_for(lambda items: any(isinstance(i, Fragment) or i is _CLOSE for i, _ in items),
                                        0.1):
            if self._abort.is_set():
                raise _Abort
        items = self._buffer.peek_all()
        later = [(i, at) for i, at in items if isinstance(i, Fragment) and i.video]
        total = self.total_seconds()
        if not later or total is None:
            if total is None:
                self.say("warning", "live: the render's length is not known yet, so no pre-roll is computed for "
                                    f"{self.name}; it waits for generation when it must.")
            return 0.0
        fps = self.spec.fps
        nxt, nxt_at = later[0]
        speed = float(len(nxt.video) / fps) / max(nxt_at - put_at, 1e-3)  # video seconds per wall second
        received = float((nxt.first_frame + len(nxt.video) - first.first_frame) / fps)
        remaining = max(0.0, total - float(first.first_frame / fps) - received)
        chunk = float(len(nxt.video) / fps)
        # Content c (from this stream's start; what comes after ``received``) arrives by about
        # now + (c - received + chunk) / speed and plays at start + c: the earliest start for which that
        # holds for every c up to the render's end (the ends of the range are the worst cases).
        preroll = max(0.0, (remaining + chunk) / speed - (received + remaining), chunk / speed - received)
        if preroll > self.pacing.preroll_s:
            self._buffer.limit_s = max(self._buffer.limit_s, (preroll + 2 * chunk) * min(speed, 1.0) + 2 * chunk)
            self.say("info", f"live: generation runs at {speed:.2f}x real time; the stream to {self.name} starts after "
                             f"a pre-roll of {preroll:.0f} s so that it plays to the end without a stall.")
        return preroll

    def _send_fragment(self, fragment: Fragment, put_at: float) -> None:
        if fragment.last_rgb is not None:
            self._last_rgb = fragment.last_rgb
        if self._need_key:
            if not fragment.opens_gop:
                self.stats.dropped_fragments += 1
                return
            self._need_key = False
            self._t0 = None  # a new connection: the schedule starts again from this keyframe
        if self._t0 is None:
            self._start(fragment, put_at)
        epoch = self._epoch
        for packet in self._packets(fragment):
            self._send(packet)
            if self._epoch != epoch:  # the connection was lost: the rest of the fragment is dropped
                return

    def _packets(self, fragment: Fragment) -> list[WirePacket]:
        out = []
        frame_ticks = Fraction(WIRE_CLOCK) / self.spec.fps
        for i, s in enumerate(fragment.video):
            pts = self._video_pts(fragment.first_frame + i)
            out.append(WirePacket(True, s.data, pts, round(frame_ticks), s.key))
        t = fragment.audio_time
        for s in fragment.audio:
            out.append(WirePacket(False, s.data, self._audio_pts(t),
                                  round(Fraction(s.duration * WIRE_CLOCK, self.spec.audio_rate)), True))
            t += s.duration
        out.sort(key=lambda p: p.pts)  # interleaved by time (stable: video first at equal times)
        return out

    def _send(self, packet: WirePacket) -> None:
        delay = self._due(packet.pts) - time.monotonic()
        if delay > 0 and self._abort.wait(delay):
            raise _Abort
        try:
            self._conn.send(packet)
        except ConnectionError as exc:
            self._reconnect(str(exc))
            return
        self.stats.packets += 1
        if self.stats.first_packet_at is None:
            self.stats.first_packet_at = time.monotonic()
        end = packet.pts + packet.duration
        if packet.video:
            self._next_video = self.stats.video_end = max(self._next_video, end)
        else:
            self._next_audio = self.stats.audio_end = max(self._next_audio, end)

    def _hold(self) -> bool:
        """Send ``_HOLD_SECONDS`` of the last frame and silence; False when that cannot be done here."""
        if self._filler is None or self._last_rgb is None:
            return False
        fps, rate = self.spec.fps, self.spec.audio_rate
        frames = _hold_frames(fps, rate)
        gop = self._filler.video(self._last_rgb, frames)
        if gop is None:
            return False
        if not self.stats.held_s:
            self.say("warning", f"live: generation is slower than real time; the stream to {self.name} shows the last "
                                "frame with silence until it catches up (hold).")
        frame_ticks = Fraction(WIRE_CLOCK) / fps
        start_v, start_a = self._next_video, self._next_audio
        video = [WirePacket(True, data, start_v + round(i * frame_ticks), round(frame_ticks), key)
                 for i, (data, key) in enumerate(gop)]
        # as many AAC frames as keep the audio's filler within half a frame of the video's
        video_ticks = self._hold_video + round(frames * frame_ticks)
        aac_ticks = Fraction(AAC_FRAME * WIRE_CLOCK, rate)
        count = max(0, round((video_ticks - self._hold_audio) / aac_ticks))
        silence = self._filler.silence()
        audio = [WirePacket(False, silence, start_a + round(i * aac_ticks), round(aac_ticks), True)
                 for i in range(count)]
        epoch = self._epoch
        for packet in sorted(video + audio, key=lambda p: p.pts):
            self._send(packet)
            if self._epoch != epoch:
                return True
        self._hold_video = video_ticks
        self._hold_audio += round(count * aac_ticks)
        self.stats.held_s += float(frames / fps)
        return True

    def _reconnect(self, reason: str) -> None:
        self._conn.close()
        self._conn, self._lost = None, True
        self._epoch += 1
        retry = self.pacing.retry_s
        self.say("warning", f"live: lost the connection to {self.name} ({reason}); retrying for up to {retry:g} s "
                            "while the render goes on.")
        deadline, delay = time.monotonic() + retry, 0.5
        while True:
            if self._abort.wait(min(delay, max(0.0, deadline - time.monotonic()))):
                raise _Abort
            delay = min(2 * delay, 8.0)
            try:
                self._conn = _connect(self.target, self._tracks)
                break
            except ConnectionError as exc:
                reason = str(exc)
            except AvatarRenderError as exc:
                reason = str(exc).rstrip(".")
            if time.monotonic() >= deadline:
                self._failed = AvatarRenderError(
                    f"Lost the live stream to {self.name}: {reason}; gave up after {retry:g} s of retries.")
                self.say("warning", f"{self._failed} The render goes on without it.")
                return
        self.stats.reconnects += 1
        self._lost, self._need_key = False, True
        self.say("info", f"live: reconnected to {self.name}; the stream goes on at the next keyframe.")


def _connect(target: LiveTarget, tracks: Tracks) -> Union[Sender, WhipConnection]:
    return WhipConnection(target, tracks) if target.kind == "whip" else connect(target, tracks)


def _hold_frames(fps: Fraction, rate: int) -> int:
    """Frames of filler per wait: the fewest (up to a second's) whose length is a whole number of AAC
    frames, so that the filler keeps audio and video exactly together (16 and 48 kHz at 25 or 30 fps);
    else about ``_HOLD_SECONDS``, the audio kept within half an AAC frame of the video."""
    for frames in range(1, math.ceil(fps) + 1):
        if (Fraction(frames) / fps * rate / AAC_FRAME).denominator == 1:
            return frames
    return max(1, round(_HOLD_SECONDS * fps))

