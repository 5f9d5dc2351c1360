"""Which live sinks a render has, checked before the models load; the watch server and its lingering.

Only the writing process (process 0 of a launch) gets here, so only it publishes."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import time
from fractions import Fraction
from pathlib import Path
from typing import Callable, Optional

from avatar_render.backends import backend
from avatar_render.config import Config
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import shown
from avatar_render.files.write import new_temp_folder, remove_tree
from avatar_render.io.live.hls import HlsSink, claimed_names, remove_playlist, written_names
from avatar_render.io.live.pipe import PipeSink
from avatar_render.io.live.push import POLICIES, Pacing, PushSink
from avatar_render.io.live.rtc_process import WebRtcProcess
from avatar_render.io.live.server import AudioIntake, WatchServer
from avatar_render.io.live.targets import LiveTarget, parse_serve, parse_target
from avatar_render.io.sink import Sink
from avatar_render.io.spec import WriterSpec
from avatar_render.job.output import request_inputs
from avatar_render.job.request import OnMessage, Progress, RenderRequest

_SERVED_PLAYLIST = "live.m3u8"
# The preview's first chunk in a live render (unless chunk.first_frames says otherwise): its frames are what
# a watcher waits for, 0.1 s of work against 0.45 s for a 50-frame chunk; the chunks after it keep their size.
LIVE_FIRST_FRAMES = 12
PREROLL_S = 1.0  # push targets: packet n leaves at start + its time + this (job.session: a session's)


def live_request(request: RenderRequest) -> RenderRequest:
    """``request`` as a live render runs it: with the preview backend, a short first chunk
    (``LIVE_FIRST_FRAMES``, at least what the first seam needs) unless ``chunk.first_frames`` is set."""
    cfg = request.config
    if not request.live.active or not backend(cfg.backend).session_chunks or cfg.chunk.first_frames:
        return request
    first = max(LIVE_FIRST_FRAMES, cfg.chunk.transition_frames // 2 + 2)
    if first >= cfg.chunk.chunk_frames:
        return request
    chunk = dataclasses.replace(cfg.chunk, first_frames=first)
    return dataclasses.replace(request, config=dataclasses.replace(cfg, chunk=chunk))


def gop_seconds(cfg: Config, live: Optional["Live"]) -> float:
    """The keyframe interval of a render's writer (the resume points, the HLS segments)."""
    return cfg.video.gop(live=False) if live is None else live.gop_seconds(cfg)


class Live:
    """The live side of one render. ``Live(request, ...)`` checks everything it can at once (targets,
    folders, an existing playlist, the server's address) and starts the watch server, so that its
    URL is printed before the models load."""

    def __init__(self, request: RenderRequest, *, on_message: OnMessage, pieces: Optional[AudioIntake] = None) -> None:
        opts, cfg = request.live, request.config
        self.options, self.cfg, self.say = opts, cfg, on_message
        self.targets = [parse_target(t) for t in opts.targets]
        if opts.underrun not in POLICIES:
            raise AvatarRenderError(f"Underrun policy '{opts.underrun}' is not one of {', '.join(POLICIES)}.")
        self.preroll_s = PREROLL_S if opts.preroll_s is None else opts.preroll_s
        for name, value in (("pre-roll", self.preroll_s), ("live buffer", opts.buffer_s), ("retry time", opts.retry_s),
                            ("serve linger", opts.linger_s)):
            if not 0 <= value <= 24 * 3600:
                raise AvatarRenderError(f"The {name} of {value:g} s must be between 0 s and a day.")
        if any(t.kind == "whip" for t in self.targets) and importlib.util.find_spec("aiortc") is None:
            raise AvatarRenderError("Publishing to a WHIP endpoint needs aiortc: pip install 'avatar-render[webrtc]'.")
        if sum(t.kind == "stdout" for t in self.targets) > 1:
            raise AvatarRenderError("Standard output ('-') can be a live target only once.")
        hls = [t for t in self.targets if t.kind == "hls"]
        if len({t.path.resolve() for t in hls}) < len(hls):
            raise AvatarRenderError("The same playlist is named twice with --live.")
        for t in hls:
            self._check_playlist(t, request)
        self._temp: Optional[Path] = None
        self.server: Optional[WatchServer] = None
        self.sinks: list[Sink] = []
        self._served: Optional[HlsSink] = None  # the sink of the playlist the server serves
        self.clock: Optional[Callable[[], Optional[float]]] = None  # a real-time session's (push targets pace by it)
        if opts.serve is not None:
            host, port = parse_serve(opts.serve)
            if hls:  # the first playlist named is the one served
                folder, playlist = hls[0].path.resolve().parent, hls[0].path.name
            else:
                self._temp = new_temp_folder("avatar-render-live-")
                folder, playlist = self._temp, _SERVED_PLAYLIST
                self.targets.append(LiveTarget("hls", str(self._temp / playlist), path=self._temp / playlist))
            # WebRTC viewers where aiortc is installed (the 'webrtc' extra); else the page plays HLS
            hub = (WebRtcProcess(host=host, buffer_s=opts.buffer_s, say=on_message)
                   if importlib.util.find_spec("aiortc") is not None else None)
            try:
                self.server = WatchServer(host, port, folder, playlist, served=self._served_names, webrtc=hub)
            except BaseException:
                if hub is not None:
                    hub.shutdown()
                self.close()
                raise
            on_message("notice", f"Watch the render at {self.server.url}")
            if pieces is not None:
                self.server.audio_in = pieces
                on_message("notice", f"Push the audio to {self.server.url}audio (POST, in pieces); POST "
                                     f"{self.server.url}end ends the session")

    @property
    def shown(self) -> str:
        """Where the render went, for its summary: the targets and the watch page."""
        named = [t.shown for t in self.targets if self._temp is None or t.path is None or t.path.parent != self._temp]
        return ", ".join(named + ([self.server.url] if self.server is not None else []))

    def gop_seconds(self, cfg: Config) -> float:
        """The writer's shortest GOP: ``video.gop_seconds``, 2 s when unset (segments and joins stay
        short); under ``hold`` every chunk starts one (filler can only be spliced in before a keyframe)."""
        return 1e-6 if self.options.underrun == "hold" else cfg.video.gop(live=True)

    def make_sinks(self, spec: WriterSpec, *, first_frame: int,
                   total_seconds: Callable[[], Optional[float]]) -> list[Sink]:
        opts = self.options
        pacing = Pacing(policy=opts.underrun, preroll_s=self.preroll_s, buffer_s=opts.buffer_s, retry_s=opts.retry_s,
                        origin=self.clock)
        chunk_s = float(self.cfg.chunk.chunk_frames / self.cfg.fps)
        sinks: list[Sink] = []
        for t in self.targets:
            if t.kind == "hls":
                if not first_frame and t.path.exists():  # --force or a resume with nothing to resume (checked)
                    remove_playlist(t.path, spec.fps)
                # a GOP spans whole chunks: the first checkpoint at least a GOP's length after its start
                target = math.ceil(max(1, math.ceil(spec.gop_seconds / chunk_s - 1e-9)) * chunk_s - 1e-9)
                sinks.append(HlsSink(t.path, fps=spec.fps, target_seconds=target))
                if self._served is None:  # (the first playlist is the one served)
                    self._served = sinks[-1]
            elif t.kind == "stdout":
                sinks.append(PipeSink(1, say=self.say))
            else:
                sinks.append(PushSink(t, pacing, spec=spec, say=self.say, total_seconds=total_seconds))
        if self.server is not None and self.server.webrtc is not None:
            sinks.append(self.server.webrtc)
        self.sinks = sinks
        return sinks

    def _served_names(self) -> frozenset[str]:
        """What the watch server may hand out: the files the render wrote and listed, nothing else."""
        return frozenset() if self._served is None else self._served.served

    def on_progress(self, p: Progress, *, generated_fps: float) -> None:
        if self.server is None:
            return
        eta = None
        if p.frames_total and generated_fps > 0:
            eta = round(max(0, p.frames_total - p.frames_done) / generated_fps, 1)
        self.server.status = {"state": "rendering", "chunks": p.chunks_done, "frames": p.frames_done,
                              "frames_total": p.frames_total, "generated_fps": round(generated_fps, 2),
                              "realtime_factor": round(generated_fps / p.fps, 3), "eta_s": eta}

    def ended(self, state: str, *, should_stop: Callable[[], bool]) -> None:
        """The render is over (``state``: finished, stopped, failed): the page is told; when it ended
        normally, the server goes on while a viewer had it open within ``linger_s`` (Ctrl-C ends it)."""
        if self.server is None:
            return
        self.server.status = {**self.server.status, "state": state, "eta_s": 0 if state == "finished" else None}
        linger = self.options.linger_s
        if state != "finished" or not linger or self.server.last_request is None:
            return
        self.say("info", f"The render is complete; {self.server.url} stays up while it is watched (Ctrl-C to stop).")
        while not should_stop() and time.monotonic() - self.server.last_request < linger:
            time.sleep(0.2)

    def figures(self, t_ready: float) -> dict:
        """Per target: when its first frame went out (s after ``t_ready``, a time.monotonic()) and
        what the pacing met."""
        out = {}
        for sink in self.sinks:
            if isinstance(sink, PushSink):
                s = sink.stats
                out[sink.name] = {
                    "first_frame_out_s": None if s.first_packet_at is None else round(s.first_packet_at - t_ready, 3),
                    "preroll_s": round(s.preroll_s, 3), "stalls": s.stalls, "stalled_s": round(s.stalled_s, 3),
                    "held_s": round(s.held_s, 3), "dropped_fragments": s.dropped_fragments, "reconnects": s.reconnects,
                    "cpu_s": round(s.send_cpu_s, 3), "failed": None if sink.failed is None else str(sink.failed)}
            elif isinstance(sink, HlsSink):
                out[sink.name] = {
                    "first_segment_listed_s": None if sink.first_listed_at is None
                    else round(sink.first_listed_at - t_ready, 3),
                    "segments": len(sink.segments)}
        if self.server is not None and self.server.first_segment_request is not None:
            out["server"] = {"url": self.server.url,
                             "first_segment_served_s": round(self.server.first_segment_request - t_ready, 3)}
        return out

    def close(self) -> None:
        """Stop the watch server and remove the watch folder this made (the folder even when a stop signal ends the
        server's closing: it waits for its viewers' connections)."""
        try:
            if self.server is not None:
                server, self.server = self.server, None
                server.close()
        finally:
            if self._temp is not None:
                remove_tree(self._temp)
                self._temp = None

    def _check_playlist(self, target: LiveTarget, request: RenderRequest) -> None:
        path = target.path
        if not path.parent.is_dir():
            raise AvatarRenderError(
                f"Cannot write the playlist {shown(path)}: the folder '{path.parent}' does not exist.")
        if path.is_symlink() or (path.exists() and not path.is_file()):
            raise AvatarRenderError(f"{shown(path)} is not a regular file; the render writes only files it makes.")
        ours: set[str] = set()
        if path.exists():
            ours = claimed_names(path, Fraction(request.config.fps))  # one of ours, else refused whatever the flags
            if not (request.force or request.resume):
                raise AvatarRenderError(f"The playlist {shown(path)} exists; pass --force to replace it "
                                        "(or --resume to go on with the render it belongs to).")
        if request.output is not None and path.resolve() == Path(request.output).resolve():
            raise AvatarRenderError(f"The playlist {shown(path)} cannot be the output too.")
        inputs = request_inputs(request)
        for written in [path, *written_names(path)]:
            inputs.check(written, what="playlist" if written == path else "HLS segment")
        if not (ours and request.resume and not request.force):  # (a resume meets its own files: hls.py)
            stranger = next((p for p in written_names(path) if p.name not in ours), None)
            if stranger is not None:
                raise AvatarRenderError(
                    f"{shown(stranger)} is in the way: the stream's segments would be written there under the "
                    f"playlist's name, and it is not a file this render wrote; move it away or name the playlist "
                    "otherwise.")
