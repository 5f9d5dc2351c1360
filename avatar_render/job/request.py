"""What a caller gives a render and what it gets back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal, Optional

from avatar_render.config import Config

# notice: shown even when quiet (a URL to watch)
OnMessage = Callable[[Literal["info", "notice", "warning"], str], None]


@dataclass(frozen=True)
class LiveOptions:
    """Publishing while rendering (all off by default)."""

    targets: tuple[str, ...] = ()  # rtmp://host/app/key, srt://host:port?..., PATH.m3u8, - (fMP4 on standard output)
    serve: Optional[str] = None  # [ADDR:]PORT: the watch page and the HLS stream over HTTP (ADDR: the loopback)
    underrun: str = "stall"  # push targets when generation is slower than real time: stall | hold | preroll
    # push targets: packet n leaves at start + its time + this; None: 1 s, 0.8 s in a real-time session
    preroll_s: Optional[float] = None
    buffer_s: float = 10.0  # push targets: encoded media queued ahead of the wire (memory stays flat)
    retry_s: float = 30.0  # push targets: a lost connection is retried this long, then given up
    linger_s: float = 10.0  # --serve: after the render, go on serving while the page was open this recently

    @property
    def active(self) -> bool:
        return bool(self.targets) or self.serve is not None


@dataclass(frozen=True)
class RenderRequest:
    reference: Path
    audio: Path | str  # a file, or a stream: "-" (standard input), "post:" (pushed to --serve), rtmp://... (listener)
    output: Optional[Path]  # the MP4 (the record); None: live only (needs live targets, no --resume)
    config: Config = field(default_factory=Config)
    force: bool = False  # replace an existing output file; discard an interrupted render's partial output
    report: Optional[Path] = None  # write a JSON report here
    resume: bool = False  # go on from an interrupted render's journal (start afresh when there is none)
    config_file: Optional[Path] = None  # the YAML file the config came from, if any (an input: never written over)
    live: LiveOptions = field(default_factory=LiveOptions)


@dataclass(frozen=True)
class Progress:
    chunks_done: int
    frames_done: int
    frames_total: Optional[int]  # exact once the audio has been read to its end, else an estimate (or None)
    elapsed_s: float  # since the inputs were ready
    fps: float  # output frame rate
    frames_resumed: int = 0  # of frames_done, those an earlier, interrupted run rendered
    open_duration: bool = False  # a session: frames_total stays None until the stream ends (no ETA to show)


@dataclass(frozen=True)
class RenderReport:
    output: str
    frames: int
    fps: float
    width: int
    height: int
    duration_s: float  # of the audio, hence of the video
    num_chunks: int  # chunks published (the report's "chunks" list has one record each)
    face_detected: bool
    inputs_s: float  # reading the inputs and the static conditioning
    time_to_first_frame_s: float  # from the inputs being ready to the first frame published to the writer
    first_frame_on_disk_s: Optional[float]  # from the inputs being ready to the first fragment on disk
    wall_s: float  # whole job, inputs included
    generated_fps: float  # frames / (wall time after the inputs were ready)
    realtime_factor: float  # video seconds per wall second (> 1 is faster than real time)
    peak_rss_mb: float
    stage_s: dict[str, float]
    resumed_frames: int = 0  # frames taken over from an interrupted run (not counted in the speeds)
    processes: int = 1  # of the launch that made it (torchrun)
    peak_gpu_mb: Optional[float] = None  # GPU memory allocated at the peak (this process), None without a GPU
    live: Optional[dict] = None  # per live target: first frame out (s from the inputs being ready), stalls, drops, CPU
    open_duration: bool = False  # a session: the audio was a stream whose length was not known at the start
    idle_s: Optional[float] = None  # a real-time session: silence put in while no audio came (in the output's audio)
    idle: Optional[list] = None  # a real-time session: [start s, length s] of each stretch of that silence
