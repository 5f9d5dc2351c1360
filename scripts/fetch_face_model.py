"""Install step: put MediaPipe's face mesh model (face_landmark.tflite, Apache-2.0) where avatar-render finds it.

The model ships inside the ``mediapipe==0.10.21`` wheels on PyPI (later releases ship no models). This
downloads one such wheel with pip (no dependencies, nothing installed), takes out only the model and
its licence, checks the model's SHA-256 and writes both into the package's ``face/data`` folder (or
``--dest``). The preview works without it (a template mesh on the detector's boxes); ``avatar-render
doctor`` says which one is in use. Nothing is downloaded when the model is already there.

    python scripts/fetch_face_model.py [--dest DIR]      (the same as: avatar-render setup [--dest DIR])
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avatar_render.errors import AvatarRenderError
from avatar_render.face.install import WHEEL, install_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder to write face_landmark.tflite into")
    args = parser.parse_args()
    try:
        target, fresh = install_model(args.dest)
    except AvatarRenderError as e:
        sys.exit(str(e))
    print(f"{target}: " + (f"MediaPipe face mesh model (Apache-2.0) from {WHEEL}" if fresh else "already in place"))


if __name__ == "__main__":
    main()
