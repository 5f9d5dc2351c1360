"""The rows of the ``inspect`` table: (metric, value, detail) strings from an InspectResult."""

from __future__ import annotations

from avatar_render.metrics.colour import NOTICEABLE_DE
from avatar_render.metrics.inspect import InspectResult
from avatar_render.metrics.series import OverTime


def _over_time(o: OverTime, *, worst_word: str, digits: int) -> str:
    return (f"{worst_word} second {o.worst:.{digits}f} at {o.worst_s:.0f} s, "
            f"trend {o.trend_per_min:+.{digits}f} per minute")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def summary_rows(r: InspectResult) -> list[tuple[str, str, str]]:
    v = r.video
    rows = [("video", f"{v.duration_s:.1f} s",
             f"{v.frames} frames at {v.fps:g} fps, {v.width}x{v.height}; compared with the {r.compared_with}")]
    c = r.colour
    rows.append(("colour drift, face (ΔE00)", f"{c.face.mean:.2f}",
                 _over_time(c.face, worst_word="worst", digits=2) + "; mean skin colour, eyes and mouth left out"))
    rows.append(("colour drift, frame (ΔE00)", f"{c.frame.mean:.2f}",
                 _over_time(c.frame, worst_word="worst", digits=2)))
    rows.append(("noticeable drift from", "never" if c.first_noticeable_s is None else f"{c.first_noticeable_s:.0f} s",
                 f"first second whose mean colour is {NOTICEABLE_DE:g} ΔE00 or more off the "
                 + ("source" if r.source is not None else "reference")))
    if r.source is not None:
        o = r.source
        wrap = "" if o.wrap_ratio is None else f"; worst turn of the loop {o.wrap_ratio:.2f} ({len(o.wraps)} turns)"
        rows.append(("source video", f"{o.outside_mouth_vs_source:.2f}",
                     "grey levels off the source frame at the same time "
                     f"outside the mouth (vs its first frame {o.outside_mouth_vs_first:.2f}; "
                     f"mouth {o.mouth_vs_source:.2f}){wrap}"))
    if r.seams is None:
        rows.append(("seam ratio", "n/a", r.missing.get("seams", "")))
    else:
        s = r.seams
        worst = ("" if s.worst is None
                 else f"; worst {s.worst.ratio:.2f} at {s.worst.frame / v.fps:.2f} s (frame {s.worst.frame})")
        rows.append(("seam ratio", f"{s.ratio:.2f}",
                     f"N seams {_ratio(s.seam_ratio)}, I-chunk edges {_ratio(s.edge_ratio)}, "
                     f"{len(s.boundaries)} boundaries{worst}; 1.00 = invisible"))
    if r.mouth is None:
        rows.append(("mouth vs speech", "n/a", r.missing.get("mouth", "")))
    else:
        m = r.mouth
        rows.append(("mouth vs speech", f"{m.correlation:.2f}",
                     f"correlation of the mouth ({m.measure}) with speech level; best {m.best_lag_correlation:.2f} "
                     f"at a lag of {m.best_lag_frames:+d} frames (positive: the mouth follows the audio)"))
        silence = "n/a" if m.silence_motion is None else f"{m.silence_motion:.0%}"
        rows.append(("mouth in silence", silence,
                     f"movement during {m.silence_s:.1f} s of silence, against speech (0% = still)"
                     if m.silence_motion is not None else "too little silence in the audio to tell"))
    b = r.blinks
    if r.face_found:
        rows.append(("blink rate", f"{b.per_minute:.1f} /min", f"{b.count} blinks"))
    else:  # (the eyes' places were guessed: what changed there is no blink; pass --ref to find the face)
        rows.append(("blink rate", "n/a", "no face was found, so the eyes are not known (pass --ref REFERENCE)"))
    h = r.head
    rows.append(("head motion", f"{h.speed_mean:.3f} fw/s",
                 f"mean speed in face widths ({h.face_width_px:.0f} px) per second; jerk {h.jerk_rms:.1f} fw/s³, "
                 f"jitter {h.jitter:.2f} (0 = glide, 1.7 = random shake), farthest {h.travel_max:.3f} fw"))
    i = r.identity
    rows.append(("identity similarity", f"{i.similarity.mean:.3f}",
                 _over_time(i.similarity, worst_word="lowest", digits=3) + f"; {i.method}"))
    sh = r.sharpness
    rows.append(("face sharpness", f"{sh.relative:.2f}",
                 f"x the reference face's ({sh.face.mean:.0f} against {sh.reference:.0f}); "
                 + _over_time(sh.face, worst_word="softest", digits=0) + f"; {sh.method}"))
    return rows
