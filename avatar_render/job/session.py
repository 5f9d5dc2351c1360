"""A session: a render whose audio arrives as a stream (standard input, pieces pushed to the watch
server, a network listener). Its length is open until the stream ends; it cannot be resumed (its
input is gone); with a live input it runs on the clock (``session.realtime``)."""

from __future__ import annotations

import dataclasses
import sys
from typing import Callable, Optional

from avatar_render.backends import backend
from avatar_render.config import Config
from avatar_render.errors import AvatarRenderError
from avatar_render.io.audio_stream import (
    PUSHED,
    SRT_RAW,
    STDIN,
    Pieces,
    RawFormat,
    StreamedAudio,
    is_stream,
    srt_listener,
    stream_name,
)
from avatar_render.job.request import RenderRequest

SESSION_PREROLL_S = 0.8  # a real-time session's push targets, unless --preroll says (docs/live.md: p95 under 1 s)


def realtime(request: RenderRequest) -> bool:
    """Whether the session runs on the clock: ``session.realtime``, auto = on for pushed and network inputs."""
    mode = request.config.session.realtime.lower()  # (YAML reads on and off as true and false)
    return mode in ("on", "true") or mode == "auto" and str(request.audio) != STDIN


def session_request(request: RenderRequest) -> RenderRequest:
    """``request`` as a session runs it: checked, and in real time with the session's chunk sizes (preview)."""
    if not is_stream(request.audio):
        return request
    if request.resume:
        raise AvatarRenderError(
            f"A session reading {stream_name(str(request.audio))} cannot be resumed: its audio cannot be read again "
            "(start it over with --force).")
    if str(request.audio) == PUSHED and request.live.serve is None:
        raise AvatarRenderError("--audio post: takes the audio pushed to the watch server: add --serve PORT.")
    cfg = request.config
    if cfg.audio.raw is not None:
        RawFormat.parse(cfg.audio.raw)
    if realtime(request) and backend(cfg.backend).session_chunks:
        chunk = dataclasses.replace(cfg.chunk, chunk_frames=cfg.session.chunk_frames,
                                    transition_frames=cfg.session.transition_frames, first_frames=0)
        request = dataclasses.replace(request, config=dataclasses.replace(cfg, chunk=chunk))
    if realtime(request) and request.live.preroll_s is None:  # (its short chunks: the speech seen sooner)
        request = dataclasses.replace(request, live=dataclasses.replace(request.live, preroll_s=SESSION_PREROLL_S))
    return request


def open_stream(request: RenderRequest, *, pieces: Optional[Pieces],
                should_stop: Callable[[], bool]) -> StreamedAudio:
    """The session's audio stream, read from now on (``pieces``: the buffer the watch server fills)."""
    cfg: Config = request.config
    audio = str(request.audio)
    if audio == STDIN and sys.stdin.isatty():
        raise AvatarRenderError("--audio - reads the audio from standard input, which is a terminal here; pipe the "
                                "audio in (for example: cat talk.wav | avatar-render render ... --audio -).")
    raw = None if cfg.audio.raw is None else RawFormat.parse(cfg.audio.raw)
    if audio.startswith("srt://"):
        process = srt_listener(audio)
        return StreamedAudio(process.stdout.fileno(), name=stream_name(audio), raw=RawFormat.parse(SRT_RAW),
                             realtime=realtime(request), slack_s=cfg.session.slack_s, should_stop=should_stop,
                             process=process)
    source: int | Pieces | str = sys.stdin.fileno() if audio == STDIN else pieces if audio == PUSHED else audio
    return StreamedAudio(source, name=stream_name(audio), raw=raw, realtime=realtime(request),
                         slack_s=cfg.session.slack_s, should_stop=should_stop)
