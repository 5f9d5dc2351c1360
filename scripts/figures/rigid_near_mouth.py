"""How far the preview's mouth warp moves things near the mouth that should not bend: a moustache, a beard's
outline, a hand at the chin, drawn in code onto a reference (examples/face.png by default).

For each drawn thing, the rig is built on the drawn reference and the mouth bank's displacements (backward
maps, output pixels) are read over the thing at the widest jaw drop with the lips at rest, rounded and spread:
the largest displacement (px) and its spread over the thing's outline (the 95th percentile minus the 5th of
the displacement's length along the outline: 0 for a thing that moves whole, rigidly; more where its outline
is bent). The face's own landmarks place the drawings; nothing is downloaded.

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
    return out


def paint(image: np.ndarray, masks: dict[str, np.ndarray], seed: int = 0) -> dict[str, np.ndarray]:
    """The reference with each thing drawn on it: dark hair with strands (moustache, beard), a hand's flat
    colour lighter than the face, with a dark outline."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, mask in masks.items():
        img = image.copy()
        if name == "hand":
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
    """The mouth bank's displacements over a mask at the widest jaw drop: largest, and spread along its outline."""
    bank = rig.mouth_bank
    r = bank.rect
    inside = mask[r.slices]
    edge = inside & ~cv2.erode(inside.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
    out = {}
    for label, width in (("rest", 0.0), ("rounded", min(WIDTH_LEVELS)), ("spread", max(WIDTH_LEVELS))):
        d = np.linalg.norm(bank.blend(max(OPEN_LEVELS), width), axis=-1)  # (rect.h, rect.w)
        along = d[edge] if edge.any() else np.zeros(1)
        out[label] = {"max_px": round(float(d[inside].max()) if inside.any() else 0.0, 2),
                      "outline_spread_px": round(float(np.percentile(along, 95) - np.percentile(along, 5)), 2)}
    return out


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
