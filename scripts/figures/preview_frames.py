"""Contact sheet of a render: the frames where the mouth is most open, closed, rounded and spread, a blink,
and the head turned furthest, chosen by face landmarks found in the frames, beside the reference.

    python scripts/figures/preview_frames.py VIDEO --ref REF -o sheet.png [--crop face|frame] [--tile 256]
        [--face-index N] [--face-landmarks SETTING]

Needs the face landmark model (scripts/fetch_face_model.py).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import cv2
import numpy as np

from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.metrics.face_track import FaceTracker
from avatar_render.metrics.regions import fitted_reference
from avatar_render.metrics.video import iter_frames, probe_video

TILE = 256  # default side of each picture


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("video", type=Path)
    ap.add_argument("--ref", type=Path, required=True)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--crop", choices=("face", "frame"), default="face")
    ap.add_argument("--tile", type=int, default=TILE, help="side of each picture in pixels")
    ap.add_argument("--face-index", type=int, default=None, help="the render's face.index (a photo of several faces)")
    ap.add_argument("--face-landmarks", default="auto",
                    help="the render's face.landmarks (with template, the face was chosen by the cascade alone)")
    args = ap.parse_args()
    path = find_model()
    if path is None:
        sys.exit("The face landmark model is not installed: python scripts/fetch_face_model.py")
    info = probe_video(args.video)
    ref = fitted_reference(args.ref, info.width, info.height, face_index=args.face_index,
                           landmarks=args.face_landmarks)
    model = LandmarkModel(path)
    ref_mesh = model.from_box(ref.image, ref.layout.face, ref.layout.roll)
    if ref_mesh is None:
        sys.exit("No face landmarks found in the reference.")
    tracker = FaceTracker(model, ref_mesh)
    gap, width, eye, turn = [], [], [], []
    for frame in iter_frames(args.video):
        r = tracker.read(frame)
        gap.append(r.lip_gap)
        width.append(r.mouth_width)
        eye.append(r.eye_opening)
        turn.append(
            math.degrees(abs(math.atan2(r.head[1, 0], r.head[0, 0])))
            + 100 * float(np.hypot(*r.head[:, 2])) / info.width
        )
    gap, width, eye, turn = map(np.array, (gap, width, eye, turn))
    # A blink moves the eye corners the head pose is read from: mouth shapes and the head's turn are chosen
    # among frames with the eyes open (rounded and spread also with the lips apart).
    open_eyes = eye > 0.9 * np.median(eye)
    apart = open_eyes & (gap > 0.05)
    picks = {
        "open": np.where(open_eyes, gap, -np.inf),
        "closed": np.where(open_eyes, -gap, -np.inf),
        "rounded": np.where(apart, -width, -np.inf),
        "spread": np.where(apart, width, -np.inf),
        "blink": -eye,
        "head turned": np.where(open_eyes, turn, -np.inf),
    }
    chosen = {name: int(np.argmax(score)) for name, score in picks.items() if np.isfinite(score).any()}
    wanted = set(chosen.values())
    frames = {i: f for i, f in enumerate(iter_frames(args.video)) if i in wanted}
    keep = {name: (0.0, i, frames[i]) for name, i in chosen.items()}
    c = ref_mesh.mouth_centre
    d = ref_mesh.eye_distance
    box = (int(c[0] - 1.6 * d), int(c[1] - 2.2 * d), int(3.2 * d), int(3.2 * d))

    def tile(image: np.ndarray, label: str) -> np.ndarray:
        if args.crop == "face":
            x, y, w, h = box
            image = cv2.getRectSubPix(image, (w, h), (x + w / 2, y + h / 2))
        scale = args.tile / max(image.shape[:2])
        image = cv2.resize(
            image,
            (round(image.shape[1] * scale), round(image.shape[0] * scale)),
            interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC,
        )
        canvas = np.full((args.tile + 24, args.tile, 3), 255, np.uint8)
        canvas[: image.shape[0], : image.shape[1]] = image
        size = 0.4 * args.tile / 256 + 0.1
        cv2.putText(canvas, label, (4, args.tile + 17), cv2.FONT_HERSHEY_SIMPLEX, size, (0, 0, 0), 1, cv2.LINE_AA)
        return canvas

    order = ["open", "closed", "rounded", "spread", "blink", "head turned"]
    tiles = [tile(ref.image, "reference")]
    for name in order:
        if name in keep:
            _, i, frame = keep[name]
            tiles.append(tile(frame, f"{name} {i / float(info.fps):.2f} s"))
    while len(tiles) % 4:
        tiles.append(np.full_like(tiles[0], 255))
    rows = [np.concatenate(tiles[k : k + 4], axis=1) for k in range(0, len(tiles), 4)]
    sheet = np.concatenate(rows, axis=0)
    cv2.imwrite(str(args.out), cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    print(f"{args.out}: " + ", ".join(f"{n} frame {keep[n][1]}" for n in order if n in keep))


if __name__ == "__main__":
    main()
