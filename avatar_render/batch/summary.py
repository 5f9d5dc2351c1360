"""The batch's summary: a JSON file and, beside it, a static HTML page (a thumbnail of each output,
its duration and status) for whoever comes back to a finished folder. The page needs no server:
its links and images are paths relative to it."""

from __future__ import annotations

import html
import io
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Optional, Sequence

import av

from avatar_render.batch.jobs import STATUSES, Outcome
from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import os_reason, shown
from avatar_render.files.targets import signature
from avatar_render.files.write import replace_atomically

THUMB_WIDTH = 192
SUMMARY = "batch-summary"  # the kind of file the summaries are (files.targets.signature)


def thumbnail(video: Path, dest: Path) -> Optional[Path]:
    """A JPEG of the video's middle frame, at most THUMB_WIDTH wide; None when it cannot be read."""
    try:
        if dest.exists() and dest.stat().st_mtime_ns >= video.stat().st_mtime_ns:
            return dest
        with av.open(str(video)) as container:
            if container.duration:
                container.seek(container.duration // 2)  # (microseconds) the keyframe before the middle
            image = next(container.decode(video=0)).to_image()
        image.thumbnail((THUMB_WIDTH, THUMB_WIDTH))
        jpeg = io.BytesIO()
        image.save(jpeg, "JPEG", quality=85)
        replace_atomically(dest, jpeg.getvalue())  # (in the batch's own folder)
        return dest
    except (OSError, av.error.FFmpegError, StopIteration, IndexError):
        return None


def counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    seen = Counter(o.status for o in outcomes)
    return {status: seen.get(status, 0) for status in STATUSES}


def summary_record(
    outcomes: Sequence[Outcome], *, meta: dict[str, Any], out_dir: Path, thumbs: dict[str, Optional[Path]]
) -> dict[str, Any]:
    def rel(path: Optional[Path]) -> Optional[str]:
        return None if path is None else os.path.relpath(path, out_dir)

    jobs = []
    for o in outcomes:
        jobs.append(
            {
                "name": o.job.name,
                "status": o.status,
                "reason": o.reason,
                "origin": o.job.origin,
                "reference": str(o.job.reference),
                "audio": str(o.job.audio),
                "output": str(o.job.output),
                "overrides": list(o.job.overrides),
                "frames": o.frames,
                "duration_s": o.duration_s,
                "generated_fps": o.generated_fps,
                "wall_s": o.wall_s,
                "resumed_frames": o.resumed_frames,
                "processes": o.processes,
                "report": rel(o.report),
                "figures_from": o.figures_from,
                "thumbnail": rel(thumbs.get(o.job.key)),
            }
        )
    return {"written_by": signature(SUMMARY), **meta, "counts": counts(outcomes),
            "failed": sum(o.status == "failed" for o in outcomes), "jobs": jobs}


def write_summary(record: dict[str, Any], json_path: Path) -> tuple[Path, Path]:
    """``json_path`` and the HTML page beside it (same name, .html)."""
    html_path = json_path.with_suffix(".html")
    try:
        for path, text in (
            (json_path, json.dumps(record, indent=1) + "\n"),
            (html_path, page(record, json_path.parent)),
        ):
            replace_atomically(path, text.encode())
    except OSError as e:
        raise AvatarRenderError(f"Cannot write the batch summary {shown(json_path)}: {os_reason(e)}.") from None
    return json_path, html_path


_COLOURS = {
    "done": "#1a7f37",
    "resumed": "#1a7f37",
    "skipped": "#57606a",
    "failed": "#cf222e",
    "stopped": "#9a6700",
    "not run": "#9a6700",
}
_STYLE = """body{font:14px system-ui,sans-serif;margin:2em;color:#1f2328}table{border-collapse:collapse}
td,th{padding:6px 12px;border-bottom:1px solid #d0d7de;text-align:left;vertical-align:middle}
th{background:#f6f8fa}img{display:block;border-radius:4px;max-width:192px}.num{text-align:right;font-variant-numeric:tabular-nums}
.status{font-weight:600}.reason{max-width:36em;color:#57606a}"""


def skipped_reason(job: dict[str, Any]) -> str:
    """A skipped job's reason, and where its figures come from."""
    if not job.get("figures_from"):
        return job["reason"]
    return f"{job['reason']}; not rendered again: the figures are from the run that ended {job['figures_from']}"


def page(record: dict[str, Any], folder: Path) -> str:
    e = html.escape
    rows = []
    for job in record["jobs"]:
        output = os.path.relpath(job["output"], folder)
        thumb = job.get("thumbnail")
        image = (
            f'<a href="{e(output)}"><img src="{e(thumb)}" alt="{e(job["name"])}"></a>'
            if thumb
            else ""
        )
        name = (
            f'<a href="{e(output)}">{e(job["name"])}</a>'
            if job["status"] in ("done", "resumed", "skipped")
            else e(job["name"])
        )
        ran = job["status"] in ("done", "resumed") or bool(job.get("figures_from"))
        has_video = bool(job["frames"])
        numbers = [
            f"{job['duration_s']:.1f} s" if has_video else "",
            str(job["frames"]) if has_video else "",
            f"{job['generated_fps']:.1f}" if ran else "",
            f"{job['wall_s']:.1f} s" if ran else "",
        ]
        colour = _COLOURS.get(job["status"], "#1f2328")
        rows.append(
            f"<tr><td>{image}</td><td>{name}</td>"
            f'<td class="status" style="color:{colour}">{e(job["status"])}</td>'
            + "".join(f'<td class="num">{n}</td>' for n in numbers)
            + f'<td class="reason">{e(skipped_reason(job) if job["status"] == "skipped" else job["reason"])}</td></tr>'
        )
    tally = ", ".join(f"{n} {s}" for s, n in record["counts"].items() if n)
    title = f"avatar-render batch: {record.get('source', '')}"
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="generator" content="{signature(SUMMARY)}">'
        f"<title>{e(title)}</title><style>{_STYLE}</style></head>\n"
        f"<body><h1>{e(title)}</h1><p>{e(tally)} &middot; {e(record.get('finished', ''))}"
        f"{' &middot; shard ' + e(record['shard']) if record.get('shard') else ''}</p>\n"
        "<table><tr><th></th><th>job</th><th>status</th><th>duration</th><th>frames</th><th>fps</th>"
        "<th>time</th><th>reason</th></tr>\n" + "\n".join(rows) + "\n</table></body></html>\n"
    )
