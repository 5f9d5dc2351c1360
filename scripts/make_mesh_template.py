"""Re-create avatar_render/face/mesh_template.npy: the face mesh the preview places on the detector's
boxes when no landmark model is installed.

It is the landmark model's own mesh of examples/face.png (needs the model: scripts/fetch_face_model.py),
with the lips closed and normalised to eye centres at (-0.5, 0) and (0.5, 0).

    python scripts/make_mesh_template.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from avatar_render.face.detect import FaceDetector
from avatar_render.face.landmarks import LandmarkModel, find_model
from avatar_render.face.mesh import normalise_template
from avatar_render.io.reference import load_reference

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    path = find_model()
    if path is None:
        raise SystemExit("The face landmark model is not installed: run python scripts/fetch_face_model.py first.")
    image = load_reference(ROOT / "examples" / "face.png")
    layout = FaceDetector().detect(image)
    mesh = LandmarkModel(path).from_box(image, layout.face) if layout is not None else None
    if mesh is None:
        raise SystemExit("No face found in examples/face.png.")
    out = ROOT / "avatar_render" / "face" / "mesh_template.npy"
    np.save(out, normalise_template(mesh.points))
    print(f"{out}: {len(mesh.points)} points")


if __name__ == "__main__":
    main()
