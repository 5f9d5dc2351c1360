"""``inspect``: consistency of a rendered video over time, in one pass over its frames (constant memory).

Only per-frame scalars are kept (a few numbers a frame); frames are decoded, measured and dropped.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.face.patches import luma
from avatar_render.files.names import os_reason, shown
from avatar_render.files.targets import Inputs, check_target, signature
from avatar_render.files.write import replace_atomically
from avatar_render.metrics.blinks import BlinkResult, EyeClosure
from avatar_render.metrics.colour import ColourDrift, ColourDriftResult
from avatar_render.metrics.identity import IdentityResult, IdentityTracker
from avatar_render.metrics.lips import MEASURE as LIPS_MEASURE
from avatar_render.metrics.lips import lip_opening
from avatar_render.metrics.motion import HeadMotionResult, HeadTracker
from avatar_render.metrics.regions import Reference, fitted_reference, frame_reference
from avatar_render.metrics.seams import FrameChange, SeamResult, load_report, seam_result
from avatar_render.metrics.series import Track
from avatar_render.metrics.sharpness import FaceSharpness, SharpnessResult
from avatar_render.metrics.source import SourceComparison, SourceResult, video_reference
from avatar_render.metrics.speech import MouthActivity, MouthSyncResult, iter_frame_levels, mouth_sync
from avatar_render.metrics.video import iter_frames, probe_video

SOURCE_FRAME = "source frame at the same time"  # a video reference: each frame against the source at its time


@dataclass(frozen=True)
class VideoSummary:
    path: str
    frames: int
    fps: float
    width: int
    height: int
    duration_s: float


@dataclass(frozen=True, eq=False)
class Series:
    """Per-frame series for the plots (T values each; not written to the JSON)."""

    frame_change: np.ndarray  # grey levels, NaN at frame 0
    colour_face: np.ndarray  # CIEDE2000
    colour_frame: np.ndarray
    identity: np.ndarray  # similarity
    mouth: np.ndarray  # the inner-lip opening (eye distances) where landmarks are found, else mouth activity (grey)
    speech_rms: np.ndarray | None  # audio RMS per frame
    eyes: np.ndarray  # eye closure: the eyes' dark core brighter than in the reference, grey levels
    head: np.ndarray  # (T, 2) face shift, pixels
    sharpness: np.ndarray  # variance of the Laplacian of the face patch
    mouth_is_lips: bool = False  # mouth: the inner-lip opening (else the mouth region's motion)


@dataclass(frozen=True, eq=False)
class InspectResult:
    video: VideoSummary
    reference: str  # what the metrics compare against: "reference image", "first frame" or SOURCE_FRAME
    face_found: bool
    colour: ColourDriftResult
    seams: SeamResult | None
    mouth: MouthSyncResult | None
    blinks: BlinkResult
    head: HeadMotionResult
    identity: IdentityResult
    sharpness: SharpnessResult
    source: SourceResult | None = None  # with a video reference: each frame against the source at its time
    missing: dict[str, str] = field(default_factory=dict)  # metric -> why it could not be measured
    notes: tuple[str, ...] = ()
    series: Series | None = None
    reference_file: str | None = None  # the --ref file's name

    @property
    def compared_with(self) -> str:
        """What the metrics compare against, for the table and the plots."""
        return self.reference + ("" if self.reference_file is None else f" of '{self.reference_file}'")

    def to_dict(self) -> dict[str, Any]:
        """Everything but the per-frame series, JSON-ready."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self) if f.name != "series"}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if not np.isfinite(value) else round(float(value), 5)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _landmarks_here(setting: str | None) -> str:
    """The render's ``face.landmarks`` setting, where this machine has what it names (else ``auto``)."""
    if setting in (None, "auto", "template"):
        return setting or "auto"
    return setting if Path(setting).expanduser().is_file() else "auto"


def inspect_video(
    video: str | Path, *, report: str | Path | None = None, reference: str | Path | None = None,
    audio: str | Path | None = None, face_box: list[float] | None = None,
    on_progress: Callable[[int, int | None], None] | None = None,
) -> InspectResult:
    """Measure colour drift, seams, mouth against speech, blinks, head motion, identity and face sharpness of a video.

    reference: the reference image it was rendered from (fitted like the renderer does); without
    it, the first frame is the reference. A video reference is also compared frame by frame: each
    output frame against the source frame at its time (the report says the timing and the backend).
    report: the render's ``--report`` JSON, needed for seams.
    audio: the speech it was rendered from; without it, the video's own audio track.
    face_box: [x, y, w, h] of the face (reference pixels with a reference, else video pixels); None = detect.
    """
    info = probe_video(video)
    rep = load_report(report) if report is not None else None
    face = ((rep or {}).get("config") or {}).get("face") or {}
    chosen = {"face_index": face.get("index"), "landmarks": _landmarks_here(face.get("landmarks"))}  # as rendered
    if face_box is None and rep is not None and reference is not None:
        face_box = face.get("box") or (rep.get("config", {}).get("preview") or {}).get("face_box")
    fps = float(info.fps)
    frames = iter_frames(video)
    levels = None
    try:
        first = next(frames, None)
        if first is None:
            raise AvatarRenderError(f"The video '{video}' has no frames.")
        if reference is not None:
            ref = fitted_reference(reference, info.width, info.height, face_box=face_box, **chosen)
        else:
            ref = frame_reference(first, face_box=face_box)
        speech = audio if audio is not None else (info.path if info.has_audio else None)
        levels = iter_frame_levels(speech, fps=info.fps) if speech is not None else None
        source = None
        if reference is not None:
            config = (rep or {}).get("config", {})
            timing = (config.get("reference") or {}).get("timing", "loop")
            video_ref = video_reference(reference, fps=info.fps, timing=timing)
            if video_ref is not None:
                source = SourceComparison(video_ref, width=info.width, height=info.height,
                                          backend=config.get("backend", "preview"), face_box=face_box, **chosen)
        tracker, colour, change = HeadTracker(ref), ColourDrift(ref), FrameChange()
        # (a dub's mouth rests shut, whatever the source's first frame shows: its rest is its own quietest moment)
        mouth = MouthActivity(ref, rest_from_reference=reference is not None and source is None, fps=fps)
        eyes, identity, rms = EyeClosure(ref), IdentityTracker(ref), Track()
        lips = lip_opening(ref)
        sharpness = FaceSharpness(ref)
        count = 0
        for frame in _chain(first, frames):
            gray = luma(frame)
            shift = tracker.update(gray)
            level = next(levels) if levels is not None else None
            if level is not None:
                rms.append(level)
            against = source.frame(count) if source is not None else None  # the source frame at this time
            if against is not None and against.shape != frame.shape:
                against = None
            colour.update(frame, shift, against=against)
            change.update(gray)
            mouth.update(gray, shift, level)
            if lips is not None:
                lips.update(frame)
            eyes.update(gray, shift)
            identity.update(gray, shift, against=None if against is None else luma(against))
            sharpness.update(gray, shift)
            if source is not None:
                source.update(count, gray)
            count += 1
            if on_progress is not None and count % 25 == 0:
                on_progress(count, info.frames_estimate)
    finally:
        frames.close()
        if levels is not None:
            levels.close()
    mouth.finish()
    if on_progress is not None:
        on_progress(count, count)
    opening = None if lips is None else lips.series()
    parts = dict(tracker=tracker, colour=colour, change=change, mouth=mouth, eyes=eyes, identity=identity,
                 sharpness=sharpness, opening=opening)
    result = _result(info, ref, rep, speech, rms.numpy() if levels is not None else None, count, **parts)
    if reference is not None:
        result = dataclasses.replace(result, reference_file=Path(reference).name)
    if source is not None:  # colour and identity were compared with the source frame at each frame's time
        result = dataclasses.replace(result, source=source.result(change.values.numpy()), reference=SOURCE_FRAME)
    return result


def _chain(first: np.ndarray, rest):
    yield first
    yield from rest


def _result(info, ref: Reference, rep, speech, rms, count, *, tracker, colour, change, mouth, eyes, identity,
            sharpness, opening) -> InspectResult:
    fps = float(info.fps)
    missing: dict[str, str] = {}
    notes: list[str] = []
    if not ref.face_found:
        notes.append("No face was found; the face was assumed at the centre of the frame, so face metrics may miss it.")
    seams = None
    if rep is None:
        missing["seams"] = "needs the render's report: pass --report report.json"
    else:
        seams = seam_result(change.values.numpy(), rep)
        if isinstance(rep.get("frames"), int) and rep["frames"] != count:
            notes.append(f"The report describes {rep['frames']} frames but the video has {count}; "
                         "is it this video's report?")
    sync = None
    if rms is None:
        missing["mouth"] = "needs speech: pass --audio or a video with an audio track"
    else:
        sync = (mouth_sync(mouth.values.numpy(), rms, fps=fps, audio=str(speech)) if opening is None
                else mouth_sync(opening, rms, fps=fps, audio=str(speech), measure=LIPS_MEASURE))
        if sync is None:
            missing["mouth"] = "the video is too short" if count < 3 else "the audio holds no speech"
    series = Series(
        frame_change=change.values.numpy(), colour_face=colour.face.numpy(), colour_frame=colour.frame.numpy(),
        identity=identity.values.numpy(), mouth=mouth.values.numpy() if opening is None else opening,
        speech_rms=rms, eyes=eyes.values.numpy(),
        head=tracker.positions(), sharpness=sharpness.values.numpy(), mouth_is_lips=opening is not None,
    )
    return InspectResult(
        video=VideoSummary(path=str(info.path), frames=count, fps=fps, width=info.width, height=info.height,
                           duration_s=round(count / fps, 4)),
        reference=ref.source, face_found=ref.face_found,
        colour=colour.result(fps), seams=seams, mouth=sync, blinks=eyes.result(fps), head=tracker.result(fps),
        identity=identity.result(fps), sharpness=sharpness.result(fps), missing=missing, notes=tuple(notes),
        series=series,
    )


INSPECT, PLOT = "inspect", "plot"  # the kinds of file inspect writes (files.targets.signature)


def check_destinations(video: Path, *, json_path: Path | None, plot_path: Path | None, force: bool,
                       report: Path | None = None, reference: Path | None = None, audio: Path | None = None) -> None:
    """Before the frames are read: the JSON and the plot may be written where they are named (not over
    an input or each other; an existing file only if inspect wrote it, or with ``force``)."""
    inputs = Inputs({"video": video, "report": report, "reference file": reference, "audio file": audio})
    if json_path is not None:
        check_target(json_path, what="JSON file", force=force, kind=INSPECT, inputs=inputs)
        inputs = inputs.plus_outputs({"JSON file": json_path})
    if plot_path is not None:
        check_target(plot_path, what="plot", force=force, kind=PLOT, inputs=inputs)


def write_json(result: InspectResult, path: str | Path) -> Path:
    path = Path(path)
    text = json.dumps({"written_by": signature(INSPECT), **result.to_dict()}, indent=1) + "\n"
    try:
        replace_atomically(path, text.encode())
    except OSError as e:
        raise AvatarRenderError(f"Cannot write {shown(path)}: {os_reason(e)}.") from None
    return path
