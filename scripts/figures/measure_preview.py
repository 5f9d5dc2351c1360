"""Measure a preview render on its own frames, with face landmarks found in each frame (not the renderer's
parameters): lip gap against speech level, m/b/p closures and ee/oo widths (with the text, by forced
alignment), silence, blinks, how much the rest of the face stays the reference, teeth.

    python scripts/figures/measure_preview.py VIDEO --ref REF --audio AUDIO [--text TEXT.txt] [--json OUT.json]
        [--face-index N] [--face-landmarks SETTING]

Needs the face landmark model (scripts/fetch_face_model.py). Definitions (all printed with the figures):
* lip gap: distance between the inner lip contours (middle five points), in the reference's eye distances;
  opening: the lip gap above the reference's own (a smiling reference shows its teeth at rest).
* aperture (the figure the targets are judged on): in the middle 40 % of the mouth, the length of the line
  from the frame's outer upper to its outer lower lip contour whose grey level is 40 or more from the
  reference's lips (teeth, the dark of the mouth), median over 9 columns, in eye distances
  (``metrics.face_track.lip_aperture``); such pixels joined to either end of the line are skin beyond a
  contour placed a pixel off and are not counted (lips pressed together read 0). Closures: under 15 %
  of its speech median within 40 ms of an m/b/p's middle; silence: its mean in silence over speech.
* visible opening: the pixels inside the frame's outer lip contour that are not lip (teeth or the dark
  mouth: grey level 40 or more from the reference's lips), in squared eye distances. The landmark
  model's inner contours do not close fully on closed lips (on the example it reads 0.10 eye distances
  at a complete closure, 0.17 at rest), so closures and silence are judged on this one too.
* speech level: RMS of the audio during each frame in dB, floored 40 dB below the loud passages.
* closures (--text): phones M, B, P from a forced alignment of the text (PocketSphinx, sentence by
  sentence), or those its synthesizer wrote beside the audio (AUDIO.phones: other languages); closed when
  the lip gap is under 15 % of its median in speech on a frame whose centre lies within 40 ms of the
  phone's middle. The landmark model cannot read that low on a smiling
  reference: it reads the reference rendered with its lips pressed shut (the instrument's floor, also
  printed) at about 0.10 eye distances; so closures are also counted against that floor: closed when
  the gap is within a quarter of the way from the floor to the speech median.
* ee/oo (--text with "see" and "sue"): mouth width on the middle frame of each IY and UW phone.
* silence: frames 30 dB below the loud passages for 0.12 s either side (as ``inspect``).
* blinks: the eye opening falling under 85 % of its median (the landmark model reads a fully closed eye
  of the example at 73 % of an open one). Through spectacle frames the landmark model's lids do not move;
  ``blinks_per_minute_eye_pixels`` counts them from the pixels as ``avatar-render inspect`` does (the eye
  regions' dark core, moved with the head, brighter than in the reference: ``metrics.blinks``).
* still: SSIM to the reference after undoing the head's motion (bicubic) (a similarity fitted to rigid landmarks,
  refined by following textured points of the still region from the reference into the frame and fitting a
  similarity to them), over the head and its surroundings without the mouth/jaw region (below a line 0.15 eye
  distances above the nose tip) and the eye regions; background: SSIM outside the head.
* inner mouth (every reference): the pixels inside the frame's inner lip contour (shrunk by a pixel); on
  the widest-open third of the speech frames (by aperture), the share of frames whose inner mouth has
  teeth in it (5 % or more of it, and 3 pixels or more, 30 grey levels brighter than the reference's lips
  and unsaturated), and the median spread (standard deviation) of its grey levels: a flat fill reads
  a few levels, a real open mouth (teeth, dark, tongue) 30 or more.
* teeth: where the reference shows teeth, the best normalised correlation of that patch with the
  frame (head undone, searched over small vertical shifts) on every frame whose lips are apart (aperture
  over half the reference's); present: 0.7 or more.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from fractions import Fraction
from pathlib import Path

import cv2
import numpy as np

from avatar_render.face import mesh as fm
from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.face.patches import luma
from avatar_render.io.audio import AudioReader
from avatar_render.metrics.blinks import EyeClosure
from avatar_render.metrics.face_track import FaceTracker, lip_aperture, ssim_map, still_mask, undo_head
from avatar_render.metrics.regions import fitted_reference
from avatar_render.metrics.series import pearson
from avatar_render.metrics.speech import SILENCE_DB, SILENCE_GUARD_S, iter_frame_levels, speech_level_db
from avatar_render.metrics.video import iter_frames, probe_video


def load_16k(path: Path) -> np.ndarray:
    with AudioReader(path, fps=Fraction(25), model_rate=16000) as a:
        a.probe(10**9)
        return a.model_audio(0, a.total_frames)


def spoken(path: Path, text: str) -> list[tuple[str, float, float]]:
    """(phone, start s, end s) spoken in the audio: the phones its synthesizer wrote beside it (PATH.phones, from
    scripts/fixtures/timed_speech.py: other languages) where there are, else the text's forced alignment."""
    timed = path.with_suffix(".phones")
    if timed.is_file():
        rows = (line.split() for line in timed.read_text().splitlines())
        return [(label, float(a), float(b)) for a, b, label in rows]
    return align(path, text)


def align(path: Path, text: str) -> list[tuple[str, float, float]]:
    """(phone, start s, end s) of the text spoken in the audio: PocketSphinx forced alignment, one sentence
    per stretch of speech between pauses."""
    from pocketsphinx import Decoder

    x = load_16k(path)
    energy = np.sqrt(np.array([np.mean(x[i : i + 160] ** 2) for i in range(0, len(x) - 160, 160)]))
    quiet = energy < 1e-3
    stretches, start, run = [], None, 0
    for i, q in enumerate(quiet):
        if not q:
            start = i if start is None else start
            run = 0
        else:
            run += 1
            if start is not None and run >= 25:
                stretches.append((start, i - run + 1))
                start = None
    if start is not None:
        stretches.append((start, len(quiet)))
    sentences = [s for s in re.split(r"[.!?]", text) if s.strip()]
    if len(stretches) != len(sentences):
        stretches, sentences = [(0, len(quiet))], [text]
    out = []
    for (a, b), sentence in zip(stretches, sentences):
        a, b = max(0, a - 10), b + 10
        words = re.sub(r"[^a-z' ]", " ", sentence.lower()).split()
        pcm = (np.clip(x[a * 160 : b * 160], -1, 1) * 32767).astype(np.int16).tobytes()
        d = Decoder(samprate=16000, bestpath=False, fsgusefiller=False, loglevel="FATAL")
        d.set_align_text(" ".join(words))
        for second in (False, True):
            if second:
                d.set_alignment()
            d.start_utt()
            d.process_raw(pcm, full_utt=True)
            d.end_utt()
            if not second and d.hyp() is None:  # (hyp() must not be asked in sub-word alignment mode)
                sys.exit(f"The text could not be aligned with {path} ('{sentence.strip()}').")
        alignment = d.get_alignment()  # (kept referenced while its phones are read: the binding needs it)
        out += [(p.name, (a + p.start) / 100, (a + p.start + p.duration) / 100) for p in alignment.phones()]
    return out


def closed_reading(ref: Path, width: int, height: int, model: LandmarkModel, ref_mesh: fm.FaceMesh) -> float:
    """What the landmark model reads as the lip gap of the reference with its lips pressed shut (pixels)."""
    from avatar_render.config import load_config
    from avatar_render.io.reference import load_reference
    from avatar_render.job.setup import request_input
    from avatar_render.preview.engine import build_preview
    from avatar_render.preview.motion import OPEN, PARAMS
    from avatar_render.preview.render import render_frame

    cfg = load_config(None, (f"video.width={width}", f"video.height={height}"))
    static = build_preview(cfg).prepare(request_input(cfg, load_reference(ref), ref))
    p = np.zeros(len(PARAMS), np.float32)
    p[OPEN] = -1.0
    mesh = model.track(render_frame(static.rig, p), ref_mesh)
    return mesh.lip_gap() if mesh is not None else 0.0


def inner_mouth(frame: np.ndarray, gray: np.ndarray, mesh: fm.FaceMesh, lip_luma: float) -> tuple[bool, float]:
    """(teeth in it, spread of its grey levels) of the region inside the inner lip contour, shrunk by a pixel."""
    mask = np.zeros(gray.shape, np.uint8)
    inner = np.concatenate([mesh.at(fm.LIPS_INNER_UPPER), mesh.at(fm.LIPS_INNER_LOWER)[::-1]])
    cv2.fillPoly(mask, [np.round(inner).astype(np.int32)], 1)
    mask = cv2.erode(mask, np.ones((3, 3), np.uint8)) > 0
    if mask.sum() < 6:
        return False, float("nan")
    g = gray[mask]
    px = frame[mask].astype(np.float32)
    chroma = px.max(axis=1) - px.min(axis=1)
    bright = (g >= lip_luma + 30) & (chroma < 0.35 * np.maximum(g, 1))
    return bool(bright.sum() >= max(3, 0.05 * mask.sum())), float(g.std())


def blink_count(opening: np.ndarray) -> int:
    # The landmark model reads a fully closed eye of the example at 0.21 against 0.29 open (73 %): a dip
    # under 85 % of the median is a blink.
    closed = opening < 0.85 * np.median(opening)
    return int(np.sum(closed[1:] & ~closed[:-1]) + closed[0])


def measure(video: Path, ref_path: Path, audio: Path, text: str | None = None, face_index: int | None = None,
            face_landmarks: str = "auto") -> dict:
    """Every figure of the module's docstring for one render (a dict, in print order)."""
    path = find_model()
    if path is None:
        sys.exit("The face landmark model is not installed: python scripts/fetch_face_model.py")
    info = probe_video(video)
    fps = float(info.fps)
    ref = fitted_reference(ref_path, info.width, info.height, face_index=face_index, landmarks=face_landmarks)
    model = LandmarkModel(path)
    ref_mesh = model.from_box(ref.image, ref.layout.face, ref.layout.roll)
    if ref_mesh is None:
        sys.exit("No face landmarks found in the reference.")
    scale = ref_mesh.eye_distance
    rest_gap = ref_mesh.lip_gap() / scale
    floor = closed_reading(ref_path, info.width, info.height, model, ref_mesh) / scale
    still = still_mask(ref_mesh, (info.height, info.width))
    tracker = FaceTracker(model, ref_mesh, image=ref.image, still=still)
    oval = ref_mesh.at(fm.FACE_OVAL)
    head_zone = np.zeros((info.height, info.width), np.uint8)
    c = oval.mean(axis=0)
    cv2.fillPoly(head_zone, [np.round(c + (oval - c) * 2.0).astype(np.int32)], 1)
    background = head_zone == 0
    ref_luma = luma(ref.image)
    # The reference's visible teeth: between its inner lip contours, if they are apart.
    teeth_box = None
    if ref_mesh.lip_gap() > 3:
        pts = np.concatenate([ref_mesh.at(fm.LIPS_INNER_UPPER[2:-2]), ref_mesh.at(fm.LIPS_INNER_LOWER[2:-2])])
        x0, y0 = np.floor(pts.min(axis=0)).astype(int) + (0, 1)
        x1, y1 = np.ceil(pts.max(axis=0)).astype(int) - (0, 1)
        teeth_box = (x0, y0, x1, y0 + max(3, int(0.6 * (y1 - y0))))  # the upper teeth, away from the lower lip
    lips_region = np.zeros((info.height, info.width), np.uint8)
    cv2.fillPoly(
        lips_region,
        [
            np.round(np.concatenate([ref_mesh.at(fm.LIPS_OUTER_UPPER), ref_mesh.at(fm.LIPS_OUTER_LOWER)[::-1]])).astype(
                np.int32
            )
        ],
        1,
    )
    cv2.fillPoly(
        lips_region,
        [
            np.round(np.concatenate([ref_mesh.at(fm.LIPS_INNER_UPPER), ref_mesh.at(fm.LIPS_INNER_LOWER)[::-1]])).astype(
                np.int32
            )
        ],
        0,
    )
    lip_luma = float(np.median(ref_luma[lips_region > 0]))
    closure = EyeClosure(ref)
    eye_centre = np.array([[b.cx, b.cy, 1.0] for b in closure.boxes]).mean(axis=0)
    gaps, widths, eyes, ssim_still, ssim_bg, teeth, visible, apertures = [], [], [], [], [], [], [], []
    inner_teeth, inner_spread = [], []
    for frame in iter_frames(video):
        r = tracker.read(frame)
        mouth = np.zeros((info.height, info.width), np.uint8)
        outline = np.concatenate([r.mesh.at(fm.LIPS_OUTER_UPPER), r.mesh.at(fm.LIPS_OUTER_LOWER)[::-1]])
        cv2.fillPoly(mouth, [np.round(outline).astype(np.int32)], 1)
        gray = luma(frame)
        visible.append(float((np.abs(gray[mouth > 0] - lip_luma) >= 40).sum()) / scale**2)
        apertures.append(lip_aperture(gray, r.mesh, lip_luma) / scale)
        has_teeth, spread = inner_mouth(frame, gray, r.mesh, lip_luma)
        inner_teeth.append(has_teeth)
        inner_spread.append(spread)
        gaps.append(r.lip_gap)
        widths.append(r.mouth_width)
        eyes.append(r.eye_opening)
        dx, dy = r.head @ eye_centre - eye_centre[:2]
        closure.update(gray, (float(dx), float(dy)))
        undone = luma(undo_head(frame, r.head))
        s = ssim_map(undone, ref_luma)
        ssim_still.append(float(s[still].mean()))
        ssim_bg.append(float(ssim_map(luma(frame), ref_luma)[background].mean()) if background.any() else float("nan"))
        if teeth_box is not None:
            x0, y0, x1, y1 = teeth_box
            patch = ref_luma[y0:y1, x0:x1]
            shift = int(np.ceil(0.08 * scale))
            area = undone[max(0, y0 - shift) : y1 + shift, x0:x1]
            ncc = cv2.matchTemplate(area, patch, cv2.TM_CCOEFF_NORMED)
            teeth.append(float(ncc.max()))
    n = len(gaps)
    gaps, widths, eyes = np.array(gaps), np.array(widths), np.array(eyes)
    levels = iter_frame_levels(audio, fps=info.fps)
    rms = np.array([next(levels) for _ in range(n)])
    levels.close()
    level, top = speech_level_db(rms)
    silent = level < top - SILENCE_DB
    guard = max(1, round(SILENCE_GUARD_S * fps))
    sustained = np.lib.stride_tricks.sliding_window_view(
        np.pad(silent, guard, constant_values=True), 2 * guard + 1
    ).all(axis=1)
    speech = ~silent
    opening = np.maximum(gaps - rest_gap, 0)
    visible = np.array(visible)
    rest_visible = (
        float(
            (
                np.abs(
                    ref_luma[
                        cv2.fillPoly(
                            np.zeros_like(lips_region),
                            [
                                np.round(
                                    np.concatenate(
                                        [ref_mesh.at(fm.LIPS_OUTER_UPPER), ref_mesh.at(fm.LIPS_OUTER_LOWER)[::-1]]
                                    )
                                ).astype(np.int32)
                            ],
                            1,
                        )
                        > 0
                    ]
                    - lip_luma
                )
                >= 40
            ).sum()
        )
        / scale**2
    )
    vis_open = np.maximum(visible - rest_visible, 0)
    aperture = np.array(apertures)
    rest_aperture = lip_aperture(ref_luma, ref_mesh, lip_luma) / scale
    out: dict = {
        "video": str(video),
        "frames": n,
        "fps": fps,
        "landmarks": "MediaPipe face mesh (468 points) on each frame",
        "rest_lip_gap": round(rest_gap, 4),
        "r_lip_gap_vs_level": round(pearson(gaps, level), 3),
        "r_best_lag": max(
            (round(pearson(gaps[max(k, 0) : n + min(k, 0)], level[max(-k, 0) : n - max(k, 0)]), 3), k)
            for k in range(-4, 5)
        ),
        "r_aperture_vs_level": round(pearson(aperture, level), 3),
        "aperture_silence_over_speech": round(float(aperture[sustained].mean() / max(aperture[speech].mean(), 1e-9)), 4)
        if sustained.any() and speech.any()
        else None,
        "rest_aperture": round(rest_aperture, 4),
        "speech_median_aperture": round(float(np.median(aperture[speech])), 4) if speech.any() else None,
        "r_visible_opening_vs_level": round(pearson(visible, level), 3),
        "rest_visible_opening": round(rest_visible, 4),
        "visible_opening_silence_over_speech": round(
            float(vis_open[sustained].mean() / max(vis_open[speech].mean(), 1e-9)), 4
        )
        if sustained.any() and speech.any()
        else None,
        "silence_s": round(float(sustained.sum() / fps), 2),
        "opening_silence_over_speech": round(float(opening[sustained].mean() / max(opening[speech].mean(), 1e-9)), 4)
        if sustained.any() and speech.any()
        else None,
        "blinks": blink_count(eyes),
        "blinks_per_minute": round(blink_count(eyes) / (n / fps / 60), 1),
        "blinks_per_minute_eye_pixels": round(closure.result(fps).per_minute, 1),
        "ssim_still_mean": round(float(np.mean(ssim_still)), 4),
        "ssim_still_p5": round(float(np.percentile(ssim_still, 5)), 4),
        "ssim_still_min": round(float(np.min(ssim_still)), 4),
        "ssim_still_frames_over_0.95": f"{int(np.sum(np.array(ssim_still) >= 0.95))}/{n}",
        "ssim_background_min": round(float(np.nanmin(ssim_bg)), 4),
    }
    if speech.sum() >= 3:
        idx = np.flatnonzero(speech)
        widest = idx[np.argsort(aperture[idx])[::-1][: max(1, len(idx) // 3)]]
        spreads = np.array(inner_spread)[widest]
        out["widest_third_teeth_frames"] = f"{int(np.array(inner_teeth)[widest].sum())}/{len(widest)}"
        out["widest_third_teeth_fraction"] = round(float(np.array(inner_teeth)[widest].mean()), 3)
        out["widest_third_inner_luma_spread_median"] = (
            round(float(np.nanmedian(spreads)), 1) if np.isfinite(spreads).any() else None
        )
    if teeth:
        # (lips apart read from the pixels: the landmark model's lip gap on closed lips is more than half its
        # rest reading on this kind of face)
        apart = aperture > 0.5 * rest_aperture
        t = np.array(teeth)
        out["teeth_ncc_min_lips_apart"] = round(float(t[apart].min()), 3) if apart.any() else None
        out["teeth_present_frames"] = (
            f"{int((t[apart] > 0.7).sum())}/{int(apart.sum())} (lips apart; {int((~apart).sum())} lips closed)"
        )
    if text is not None:
        phones = spoken(audio, text)
        median = float(np.median(gaps[speech]))
        mids = [((a + b) / 2, p) for p, a, b in phones if p in ("M", "B", "P")]
        closed, floored = [], []
        for mid, _ in mids:
            near = [f for f in range(n) if abs((f + 0.5) / fps - mid) <= 0.04]
            if near:
                closed.append(bool(gaps[near].min() < 0.15 * median))
                floored.append(bool(gaps[near].min() < floor + 0.25 * (median - floor)))
        vmedian = float(np.median(visible[speech]))
        vclosed = []
        for mid, _ in mids:
            near = [f for f in range(n) if abs((f + 0.5) / fps - mid) <= 0.04]
            if near:
                vclosed.append(bool(visible[near].min() < 0.15 * vmedian))
        amedian = float(np.median(aperture[speech]))
        aclosed = []
        for mid, _ in mids:
            near = [f for f in range(n) if abs((f + 0.5) / fps - mid) <= 0.04]
            if near:
                aclosed.append(bool(aperture[near].min() < 0.15 * amedian))
        if mids:
            out["mbp_closed_by_aperture"] = f"{sum(aclosed)}/{len(aclosed)}"
            out["mbp_closed_by_lip_gap"] = f"{sum(closed)}/{len(closed)}"
            out["lip_gap_floor_closed"] = round(floor, 4)
            out["speech_median_lip_gap"] = round(median, 4)
            out["mbp_closed_against_floor"] = f"{sum(floored)}/{len(floored)}"
            out["mbp_closed_by_visible_opening"] = f"{sum(vclosed)}/{len(vclosed)}"
            out["mbp_closed_fraction"] = round(sum(vclosed) / max(len(vclosed), 1), 3)
        ee = [(a + b) / 2 for p, a, b in phones if p == "IY"]
        oo = [(a + b) / 2 for p, a, b in phones if p == "UW"]
        if ee and oo:
            at = lambda t: widths[min(n - 1, int(t * fps))]  # noqa: E731
            pairs = list(zip(ee, oo))
            out["ee_oo_width"] = [(round(float(at(e)), 3), round(float(at(o)), 3)) for e, o in pairs]
            out["ee_wider_than_oo"] = f"{sum(at(e) > at(o) for e, o in pairs)}/{len(pairs)}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("video", type=Path)
    ap.add_argument("--ref", type=Path, required=True)
    ap.add_argument("--audio", type=Path, required=True)
    ap.add_argument("--text", type=Path, default=None, help="the words spoken (for closures and ee/oo)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--face-index", type=int, default=None, help="the render's face.index (a photo of several faces)")
    ap.add_argument("--face-landmarks", default="auto",
                    help="the render's face.landmarks (with template, the face was chosen by the cascade alone)")
    args = ap.parse_args()
    out = measure(args.video, args.ref, args.audio, args.text.read_text() if args.text is not None else None,
                  args.face_index, args.face_landmarks)
    for k, v in out.items():
        print(f"{k}: {v}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
