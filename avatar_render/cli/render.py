"""``avatar-render render``: one video, written and published while it is generated."""

from __future__ import annotations

import dataclasses
import json
import signal
from pathlib import Path
from typing import Annotated, Optional

import typer

from avatar_render.cli.app import (
    ConfigOpt,
    DebugOpt,
    HeldSignals,
    Out,
    OverridesArg,
    ProgressEveryOpt,
    ProgressOpt,
    guard,
    read_config,
)
from avatar_render.cli.progress_view import RenderProgress, progress_choice
from avatar_render.config import path_override
from avatar_render.errors import AvatarRenderError
from avatar_render.progress import done_record


def render(
    ref: Annotated[Path, typer.Option("--ref", help="Reference image (PNG/JPEG/WebP) or video.")],
    audio: Annotated[str, typer.Option(
        "--audio", help="Audio of any length: wav, flac, mp3, m4a, ogg, opus or a video file; or a stream "
                        "(a session): - (standard input), post: (pushed to --serve), rtmp://ADDR:PORT/app/key or "
                        "srt://ADDR:PORT?mode=listener (listeners).")],
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", help="Output .mp4 file (the record; optional with --live or --serve).")] = None,
    overrides: OverridesArg = None,
    config: ConfigOpt = None,
    seed: Annotated[Optional[int], typer.Option("--seed", help="Random seed (overrides the config).")] = None,
    transcript: Annotated[Optional[Path], typer.Option(
        "--transcript", help="The words spoken (a text, .srt or .vtt file): the preview's mouth follows their "
                             "sounds, every m, b and p closing the lips (preview.transcript).")] = None,
    report: Annotated[Optional[Path], typer.Option("--report", help="Write a JSON report here.")] = None,
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite an existing output file; discard an interrupted render of it.")] = False,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue an interrupted render of this output from the last keyframe its journal "
                         "recorded (byte for byte the uninterrupted render).")] = False,
    live: Annotated[Optional[list[str]], typer.Option(
        "--live", metavar="TARGET", help="Publish while rendering (repeatable): rtmp://host/app/key, srt://host:port, "
                                         "whip://host/path (WebRTC), PATH.m3u8 (HLS) or - (fragmented MP4 on standard "
                                         "output).")] = None,
    serve: Annotated[Optional[str], typer.Option(
        "--serve", metavar="[ADDR:]PORT", help="Serve a watch page (WebRTC, HLS as the fall-back) over HTTP "
                                               "(loopback by default; port 0: any).")] = None,
    underrun: Annotated[str, typer.Option(
        "--underrun", help="RTMP/SRT when generation is slower than real time: stall (wait), hold (last frame and "
                           "silence), preroll (start late enough to play through).")] = "stall",
    preroll: Annotated[Optional[float], typer.Option(
        "--preroll", metavar="SECONDS", help="RTMP/SRT: delay of every packet after its time (default 1; 0.8 in "
                                             "a real-time session).", show_default=False)] = None,
    live_buffer: Annotated[float, typer.Option(
        "--live-buffer", metavar="SECONDS", help="RTMP/SRT: encoded media queued ahead of the wire.")] = 10.0,
    live_retry: Annotated[float, typer.Option(
        "--live-retry", metavar="SECONDS", help="RTMP/SRT: how long a lost connection is retried.")] = 30.0,
    live_gop: Annotated[Optional[float], typer.Option(
        "--live-gop", metavar="SECONDS", hidden=True, help="Old name of video.gop_seconds=SECONDS.")] = None,
    serve_linger: Annotated[float, typer.Option(
        "--serve-linger", metavar="SECONDS", help="--serve: after the render, keep serving while the page was open "
                                                  "this recently (0: stop at once).")] = 10.0,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Check the inputs, the config and the outputs, print the plan (frames, chunks, memory, "
                          "backend, face) and stop: nothing is written.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or summary.")] = False,
    progress: ProgressOpt = "auto",
    progress_every: ProgressEveryOpt = 5.0,
    debug: DebugOpt = False,
) -> None:
    """Render a talking-avatar MP4, written while it is generated, and publish it live with --live or
    --serve. Ctrl-C (or SIGTERM) stops after the next keyframe (every video.gop_seconds) and keeps what
    was written for --resume, ending the live streams cleanly; a second Ctrl-C stops at once. In a
    session (the audio a stream) Ctrl-C ends the stream and the file is finished with what came."""
    from avatar_render.distributed.launch import is_writer_process

    # under torchrun only process 0 reports progress (and publishes)
    writer = is_writer_process()
    out = Out(quiet=quiet or not writer, stdout_is_video="-" in (live or ()), stdout_is_json=progress == "json")
    shown = progress_choice(progress if writer else "none", quiet=out.quiet, terminal=out.console.is_terminal)

    def _request(cfg):
        from avatar_render.api import LiveOptions, RenderRequest
        from avatar_render.io.audio_stream import is_stream

        options = LiveOptions(targets=tuple(live or ()), serve=serve, underrun=underrun, preroll_s=preroll,
                              buffer_s=live_buffer, retry_s=live_retry, linger_s=serve_linger)
        return RenderRequest(reference=ref, audio=audio if is_stream(audio) else Path(audio), output=output,
                             config=cfg, force=force, report=report, resume=resume, config_file=config, live=options)

    def run() -> None:
        given = list(overrides or ())
        if live_gop is not None:  # the old name of the one keyframe knob
            out.warn(f"--live-gop is now the config key video.gop_seconds (2 s for a live render when unset): "
                     f"pass video.gop_seconds={live_gop:g} instead.")
            given.append(f"video.gop_seconds={live_gop:g}")
        if transcript is not None:
            given.insert(0, path_override("preview.transcript", transcript))
        cfg = read_config(out, config, given, seed=seed)
        if output is None and not live and serve is None:
            raise AvatarRenderError("Give an output file (-o), a live target (--live) or --serve.")
        _check_address(audio)
        if dry_run:
            _show_plan(out, _request(cfg), json_lines=shown == "json")
            return
        with HeldSignals() as held:  # (a Ctrl-C here stops the render before its first chunk)
            start_early(cfg, ref)  # (the backend's set-up work in threads while the library is imported)
            from avatar_render.api import RenderStopped, StopNow, StopSignals, stopping_notice
            from avatar_render.api import render as render_video
            from avatar_render.io.audio_stream import is_stream

        session = is_stream(audio)
        request = _request(cfg)
        on_message = lambda level, text: {"warning": out.warn, "notice": out.notice}.get(level, out.info)(text)  # noqa: E731
        stopping = StopSignals(on_first=lambda signum: out.warn(stopping_notice(signum, session=session)),
                               signum=held.first)
        try:
            with stopping, RenderProgress(out, shown, progress_every) as on_progress:
                result = render_video(request, on_progress=on_progress, on_message=on_message, should_stop=stopping)
        except RenderStopped as stopped:
            out.warn(str(stopped))
            raise typer.Exit(stopping.exit_code) from None
        except StopNow:  # a second signal outside the chunk loop
            out.warn("Stopped at once.")
            raise typer.Exit(stopping.exit_code) from None
        if stopping.signum is not None and not stopping.told:  # (it came after the last point a render stops at)
            out.warn(f"{signal.Signals(stopping.signum).name} came during the render's last part: it was finished "
                     "rather than stopped.")
        if shown == "json":
            out.data(done_record(result))
        out.info(
            f"{'Wrote' if output is not None else 'Streamed'} {result.output}: {result.duration_s:.2f} s, "
            f"{result.frames} frames at {result.fps:g} fps, "
            f"{result.width}x{result.height} | first frame {result.time_to_first_frame_s:.2f} s | "
            f"{result.generated_fps:.1f} fps generated, {result.realtime_factor:.2f}x real time | "
            f"peak memory {result.peak_rss_mb:.0f} MB"
            + ("" if result.peak_gpu_mb is None else f", GPU {result.peak_gpu_mb / 1024:.1f} GiB")
        )

    guard(out, debug, run)


def _show_plan(out: Out, request, *, json_lines: bool) -> None:
    """``render --dry-run``: the plan, as lines or one JSON object."""
    from avatar_render.api import plan_render

    plan = plan_render(request)
    if json_lines:
        out.data(json.dumps({"event": "plan", **dataclasses.asdict(plan)}))
        return
    for key, value in plan.rows():
        out.notice(f"{key + ':':13}{value}")
    out.notice("Dry run: nothing was written.")


def _check_address(audio: str) -> None:
    """Refuse an --audio that is a web address other than a listener's (read as a path, its // would fold to /)."""
    from avatar_render.io.audio_stream import NETWORK, is_stream

    scheme = audio.split("://", 1)[0]
    if "://" in audio and scheme.isascii() and scheme.isalpha() and not is_stream(audio):
        raise AvatarRenderError(
            f"--audio '{audio}' is a web address; give a local file, - (standard input), post: (audio sent to "
            f"--serve) or a listener to receive it ({', '.join(n + '...' for n in NETWORK)}).")


def start_early(cfg, ref: Path) -> None:
    """What the backend's set-up can start before the library is imported (``Backend.early``)."""
    from avatar_render.backends import backend

    own = backend(cfg.backend)
    if own.early:
        own.load("early")(cfg, ref)
