"""Install step: put MediaPipe's face mesh, face detection and person segmentation models (face_landmark.tflite,
face_detection_short_range.tflite and selfie_segmentation.tflite, Apache-2.0) where avatar-render finds them.

The models ship inside the ``mediapipe==0.10.21`` wheels on PyPI (later releases ship no models). This
downloads one such wheel with pip (no dependencies, nothing installed), takes out only the models and
their licence, checks each model's SHA-256 and writes them into the package's ``face/data`` folder (or
``--dest``). The preview works without them (a template mesh on the cascade's boxes); ``avatar-render
doctor`` says which is in use. Nothing is downloaded when all are already there.

    python scripts/fetch_face_model.py [--dest DIR]      (the same as: avatar-render setup [--dest DIR])
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avatar_render.errors import AvatarRenderError
from avatar_render.face.install import WHAT, install_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder to write the .tflite models into")
    args = parser.parse_args()
    try:
        target, fresh = install_model(args.dest)
    except AvatarRenderError as e:
        sys.exit(str(e))
    print(f"{target.parent}: {WHAT if fresh else 'already in place'}")


if __name__ == "__main__":
    main()
