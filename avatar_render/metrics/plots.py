"""PNG pictures of ``inspect`` and ``bench`` results (matplotlib, off-screen)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from avatar_render.errors import AvatarRenderError  # noqa: E402
from avatar_render.files.names import os_reason, shown  # noqa: E402
from avatar_render.files.targets import signature  # noqa: E402
from avatar_render.files.write import replace_atomically  # noqa: E402
from avatar_render.metrics.colour import NOTICEABLE_DE  # noqa: E402
from avatar_render.metrics.inspect import PLOT, InspectResult  # noqa: E402
from avatar_render.metrics.series import moving_average  # noqa: E402


def _save(fig, path: Path) -> Path:
    """The figure as a PNG at ``path``, signed as a plot of ours (replaced whole, never written through)."""
    path = Path(path)
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=110, metadata={"Software": signature(PLOT)})
        replace_atomically(path, png.getvalue())
    except OSError as e:
        raise AvatarRenderError(f"Cannot write the picture {shown(path)}: {os_reason(e)}.") from None
    finally:
        plt.close(fig)
    return path


def plot_inspect(r: InspectResult, path: str | Path) -> Path:
    """Six panels over video time: colour drift, identity, frame change with seams, mouth vs speech, eyes, head."""
    s = r.series
    assert s is not None, "the result carries its per-frame series"
    fps = r.video.fps
    t = np.arange(r.video.frames) / fps
    sec = np.arange(len(r.colour.face.per_second)) + 0.5
    fig, axes = plt.subplots(3, 2, figsize=(13, 10), sharex=True)
    fig.suptitle(f"{Path(r.video.path).name}: {r.video.duration_s:.1f} s, compared with the {r.compared_with}")

    ax = axes[0, 0]
    ax.plot(sec, r.colour.face.per_second, "o-", ms=3, label="face skin")
    ax.plot(sec, r.colour.frame.per_second, "s-", ms=3, label="whole frame")
    ax.axhline(NOTICEABLE_DE, color="grey", ls="--", lw=1, label="noticeable")
    against = "source" if r.source is not None else "reference"
    ax.set(title="colour drift per second", ylabel=f"ΔE00 against the {against}")
    ax.legend(fontsize=8)

    ax = axes[0, 1]
    ax.plot(t, s.identity, lw=0.6, alpha=0.5, label="per frame")
    ax.plot(sec, r.identity.similarity.per_second, "o-", ms=3, label="per second")
    ax.set(title="identity similarity (" + r.identity.method.split(":")[0] + ")", ylabel=f"cosine, 1 = {against}")
    ax.legend(fontsize=8)

    ax = axes[1, 0]
    ax.plot(t, s.frame_change, lw=0.7, label="frame-to-frame change")
    if r.seams is not None:
        for kind, colour in (("seam", "red"), ("edge", "orange")):
            marks = [b for b in r.seams.boundaries if b.kind == kind]
            if marks:
                ax.plot([b.frame / fps for b in marks], [b.change for b in marks], "v", color=colour,
                        label="N seams" if kind == "seam" else "I-chunk edges")
        ax.set_title(f"seams: ratio {r.seams.ratio:.2f} (1 = invisible)")
    else:
        ax.set_title("frame-to-frame change (seams need --report)")
    ax.set(ylabel="mean |Δ luma|, grey levels")
    ax.legend(fontsize=8)

    ax = axes[1, 1]
    smooth = max(1, round(0.12 * fps)) * 2 + 1
    ax.plot(t, _unit(moving_average(s.mouth, smooth)), lw=0.9,
            label="lip opening" if s.mouth_is_lips else "mouth movement")
    if s.speech_rms is not None:
        ax.plot(t, _unit(moving_average(20 * np.log10(s.speech_rms + 1e-9).clip(-60), smooth)), lw=0.9, alpha=0.8,
                label="speech level")
    title = "mouth vs speech" + ("" if r.mouth is None else f": correlation {r.mouth.correlation:.2f}")
    ax.set(title=title, ylabel="scaled 0..1")
    ax.legend(fontsize=8)

    ax = axes[2, 0]
    ax.plot(t, s.eyes, lw=0.7, label="eye closure")
    if r.blinks.times_s:
        idx = np.clip(np.round(np.array(r.blinks.times_s) * fps).astype(int), 0, len(s.eyes) - 1)
        ax.plot(np.array(r.blinks.times_s), s.eyes[idx], "v", color="red", label="blinks")
    ax.set(title=f"blinks: {r.blinks.count} ({r.blinks.per_minute:.1f} per minute)", ylabel="eyes brighter, grey",
           xlabel="video time, s")
    ax.legend(fontsize=8)

    ax = axes[2, 1]
    fw = max(r.head.face_width_px, 1e-9)
    ax.plot(t, s.head[:, 0] / fw, lw=0.8, label="x")
    ax.plot(t, s.head[:, 1] / fw, lw=0.8, label="y")
    ax.set(title=f"head position: jitter {r.head.jitter:.2f}", ylabel="face widths from the reference",
           xlabel="video time, s")
    ax.legend(fontsize=8)

    fig.tight_layout()
    return _save(fig, path)


def _unit(x: np.ndarray) -> np.ndarray:
    lo, hi = np.nanpercentile(x, 1), np.nanpercentile(x, 99)
    return np.clip((x - lo) / (hi - lo), 0, 1) if hi > lo else np.zeros_like(x)


def _label(row: dict[str, Any]) -> str:
    return f"{row['duration_s']:g} s, {row['width']}x{row['height']}, {row.get('backend', 'preview')}"


def plot_bench(rows: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """bench_memory.png (RSS per chunk against wall time and against progress), bench_fps.png (generated fps per
    chunk against video time) and bench_stages.png (milliseconds per frame in each stage)."""
    out_dir = Path(out_dir)
    paths = []
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for row in rows:
        t, rss = row["series"]["t_s"], row["series"]["rss_mb"]
        ax.plot(t, rss, lw=1.2, label=_label(row))
        ax2.plot(np.array(row["series"]["end_frame"]) / max(row["frames"], 1), rss, lw=1.2, label=_label(row))
    ax.set(title="resident memory during the render", xlabel="wall time, s", ylabel="MB")
    ax2.set(title="the same against progress (flat = constant memory)", xlabel="fraction of the video rendered")
    ax.set_ylim(bottom=0)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    paths.append(_save(fig, out_dir / "bench_memory.png"))

    fig, ax = plt.subplots(figsize=(9, 5))
    for row in rows:
        ax.plot(np.array(row["series"]["end_frame"]) / row["fps"], row["series"]["fps"], lw=1, label=_label(row))
    ax.set(title="generated frames per second, per chunk", xlabel="video time, s", ylabel="frames per wall second")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(_save(fig, out_dir / "bench_fps.png"))

    stages = sorted({k for row in rows for k in row["stage_s"]},
                    key=lambda k: -max(r["stage_s"].get(k, 0) / r["frames"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows) + 3), 5))
    bottom = np.zeros(len(rows))
    for stage in stages:
        ms = np.array([1000 * row["stage_s"].get(stage, 0.0) / max(row["frames"], 1) for row in rows])
        ax.bar(range(len(rows)), ms, bottom=bottom, label=stage)
        bottom += ms
    ax.set_xticks(range(len(rows)), [_label(r).replace(", ", "\n") for r in rows], fontsize=8)
    ax.set(title="time per frame in each stage", ylabel="ms per frame")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(_save(fig, out_dir / "bench_stages.png"))
    return paths
