"""How far the preview's mouth warp moves things near the mouth that should not bend: a moustache, a beard, a
hand over the chin, a fist and a shirt collar under it, drawn in code onto a reference (examples/face.png by default).

For each drawn thing, the rig is built on the drawn reference and the mouth bank's displacements (backward
maps) are read over the output pixels that show the thing (whose source lies on it: what the chin comes down
over is hidden, not moved) at the widest jaw drop with the lips at rest, rounded and spread: the largest
displacement (px), its spread over the outline of what shows (the 95th percentile minus the 5th of the
displacement's length: 0 for a thing that moves whole), and its bend (the 95th percentile of how far the
displacements depart from the affine motion that fits them best: 0 for a thing moved whole or stretched
evenly, more where the warp bends it). The face's own landmarks place the drawings; nothing is downloaded.

    python scripts/figures/rigid_near_mouth.py [--ref examples/face.png] [--size 512] [--png OUT.png]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import cv2
import numpy as np

from avatar_render.config import load_config
from avatar_render.face import mesh as fm
from avatar_render.io.reference import load_reference
from avatar_render.job.setup import request_input
from avatar_render.preview.engine import build_preview
from avatar_render.preview.rig import OPEN_LEVELS, WIDTH_LEVELS

ROOT = Path(__file__).resolve().parents[2]


def drawings(image: np.ndarray, mesh: fm.FaceMesh) -> dict[str, np.ndarray]:
    """(H, W) bool masks of a moustache, a beard and a hand, placed by the mesh (output pixels)."""
    h, w = image.shape[:2]
    c, mw = mesh.mouth_centre, mesh.mouth_width()
    upper = mesh.at(fm.LIPS_OUTER_UPPER)
    lower = mesh.at(fm.LIPS_OUTER_LOWER)
    oval = mesh.at(fm.FACE_OVAL)
    out = {}
    m = np.zeros((h, w), np.uint8)  # over the upper lip, below the nose
    band = np.concatenate([upper + (0, -0.02 * mw), (upper + (0, -0.22 * mw))[::-1]])
    cv2.fillPoly(m, [np.round(band).astype(np.int32)], 1)
    out["moustache"] = m > 0
    b = np.zeros((h, w), np.uint8)  # from under the lower lip down the chin, inside the face outline
    chin = oval[oval[:, 1] > c[1] + 0.25 * mw]
    region = np.concatenate([lower + (0, 0.08 * mw), chin[np.argsort(-chin[:, 0])]])
    cv2.fillPoly(b, [np.round(cv2.convexHull(region.astype(np.float32))[:, 0]).astype(np.int32)], 1)
    out["beard"] = b > 0
    k = np.zeros((h, w), np.uint8)  # a hand's back from below, its fingers up to under the lower lip
    top = float(lower[:, 1].max()) + 0.35 * mw
    cv2.ellipse(k, (int(c[0] + 0.3 * mw), int(top + 0.6 * mw)), (int(0.55 * mw), int(0.6 * mw)), 0, 0, 360, 1, -1)
    out["hand"] = k > 0
    k = np.zeros((h, w), np.uint8)  # a fist under the chin, clear of its edge and the shadow under it
    ey = mesh.axes()[1]
    low = oval[np.argmax(oval @ ey)]
    cv2.ellipse(k, (int(low[0]), int(low[1] + 0.57 * mw)), (int(0.5 * mw), int(0.45 * mw)), 0, 0, 360, 1, -1)
    out["fist under the chin"] = k > 0
    k = np.zeros((h, w), np.uint8)  # a shirt collar's V under the chin
    v = [low + (dx * mw, 0) + ey * dy * mw for dx, dy in ((-0.9, 0.25), (0.0, 0.6), (0.9, 0.25))]
    cv2.polylines(k, [np.round(np.array(v)).astype(np.int32)], False, 1, max(2, int(0.12 * mw)))
    out["collar"] = k > 0
    return out


def paint(image: np.ndarray, masks: dict[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """The reference with each thing drawn on it: dark hair with strands (moustache, beard), a hand's flat
    colour lighter than the face, with a dark outline."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, mask in masks.items():
        img = image.copy()
        if name == "collar":
            img[mask] = (235, 238, 242)
        elif name.startswith(("hand", "fist")):
            img[mask] = (226, 180, 150)
            edge = mask & ~cv2.erode(mask.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
            img[edge] = (120, 80, 60)
        else:
            strands = cv2.GaussianBlur(rng.normal(0, 1, mask.shape).astype(np.float32), (0, 0), 0.8)
            hair = np.clip(55 + 25 * strands, 0, 255)[..., None] * np.array([1.0, 0.85, 0.7])
            img[mask] = hair[mask].astype(np.uint8)
        out[name] = img
    return out


def moved(rig, mask: np.ndarray) -> dict:
    """The mouth bank's displacements over the pixels that show a thing (those whose source lies on it: what the
    chin comes down over is hidden, not moved) at the widest jaw drop: largest, spread along the outline of what
    shows, and bend."""
    bank = rig.mouth_bank
    r = bank.rect
    h, w = mask.shape
    xs, ys = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
    out = {}
    for label, width in (("rest", 0.0), ("rounded", min(WIDTH_LEVELS)), ("spread", max(WIDTH_LEVELS))):
        grid = np.zeros((h, w, 2), np.float32)
        grid[r.slices] = bank.blend(max(OPEN_LEVELS), width)
        shown = cv2.remap(mask.astype(np.float32), xs + grid[..., 0], ys + grid[..., 1], cv2.INTER_LINEAR) > 0.5
        edge = shown & ~cv2.erode(shown.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
        d = np.linalg.norm(grid, axis=-1)
        along = d[edge] if edge.any() else np.zeros(1)
        out[label] = {"max_px": round(float(d[shown].max()) if shown.any() else 0.0, 2),
                      "outline_spread_px": round(float(np.percentile(along, 95) - np.percentile(along, 5)), 2),
                      "bend_px": round(bend(grid, shown), 2)}
    return out


def bend(grid: np.ndarray, inside: np.ndarray) -> float:
    """How far (px, 95th percentile over the thing) its displacements depart from the affine motion that fits
    them best: 0 for a thing moved whole or stretched evenly, more where the warp bends it."""
    ys, xs = np.nonzero(inside)
    if len(xs) < 3:
        return 0.0
    a = np.stack([xs, ys, np.ones_like(xs)], axis=1).astype(np.float64)
    d = grid[ys, xs].astype(np.float64)  # (n, 2)
    fit, *_ = np.linalg.lstsq(a, d, rcond=None)
    return float(np.percentile(np.linalg.norm(d - a @ fit, axis=1), 95))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", type=Path, default=ROOT / "examples" / "face.png")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--png", type=Path, default=None, help="write the drawn references side by side here")
    args = ap.parse_args()
    cfg = load_config(None, (f"video.width={args.size}", f"video.height={args.size}"))
    plain = build_preview(cfg).prepare(request_input(cfg, load_reference(args.ref), args.ref)).rig
    masks = drawings(plain.image, plain.mesh)
    figures = {}
    for name, img in paint(plain.image, masks).items():
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.png"
            cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
            rig = build_preview(cfg).prepare(request_input(cfg, load_reference(path), path)).rig
        assert rig.image.shape == img.shape  # (the drawn reference is the fitted one: fitted again, unchanged)
        figures[name] = moved(rig, masks[name])
        if args.png is not None:
            figures[name]["_img"] = img
    if args.png is not None:
        cv2.imwrite(str(args.png), cv2.cvtColor(np.hstack([f.pop("_img") for f in figures.values()]),
                                                cv2.COLOR_RGB2BGR))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
