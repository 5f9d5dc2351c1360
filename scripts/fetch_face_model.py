"""Install step: put MediaPipe's face mesh model (face_landmark.tflite, Apache-2.0) where avatar-render finds it.

The model ships inside the ``mediapipe==0.10.21`` wheels on PyPI (later releases ship no models). This
downloads one such wheel with pip (no dependencies, nothing installed), takes out only the model and
its licence, checks the model's SHA-256 and writes both into the package's ``face/data`` folder (or
``--dest``). The preview works without it (a template mesh on the detector's boxes); ``avatar-render
doctor`` says which one is in use. Nothing is downloaded when the model is already there.

    python scripts/fetch_face_model.py [--dest DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "mediapipe==0.10.21"
MEMBER = "mediapipe/modules/face_landmark/face_landmark.tflite"
# The model is the same in every platform's wheel: ask for one that exists, whatever this Python is.
PLATFORM = ("--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "--implementation", "cp")


def default_dest() -> Path:
    from avatar_render.face.landmarks import model_search_paths

    for path in model_search_paths():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        probe = path.parent / ".write-test"
        try:
            probe.touch()
            probe.unlink()
            return path.parent
        except OSError:
            continue
    sys.exit(
        "No writable folder for the face landmark model; pass --dest DIR, then face.landmarks=DIR/face_landmark.tflite."
    )


def main() -> None:
    from avatar_render.face.landmarks import MODEL_FILE, MODEL_SHA256

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=None, help="folder to write face_landmark.tflite into")
    args = parser.parse_args()
    dest = args.dest or default_dest()
    target = dest / MODEL_FILE
    if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == MODEL_SHA256:
        print(f"{target}: already in place")
        return
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            WHEEL,
            "--no-deps",
            "--only-binary=:all:",
            *PLATFORM,
            "--dest",
            tmp,
            "--quiet",
            "--disable-pip-version-check",
        ]
        if subprocess.run(cmd).returncode != 0:
            sys.exit(
                f"pip could not download {WHEEL}; the preview will use its template mesh until this step succeeds."
            )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            model = z.read(MEMBER)
            licence = next((z.read(n) for n in z.namelist() if n.endswith(".dist-info/LICENSE")), b"")
    digest = hashlib.sha256(model).hexdigest()
    if digest != MODEL_SHA256:
        sys.exit(f"The model in {wheel.name} has SHA-256 {digest}, not the expected {MODEL_SHA256}; not installed.")
    partial = target.with_suffix(".partial")
    partial.write_bytes(model)
    partial.replace(target)
    if licence:
        (dest / "face_landmark.LICENSE").write_bytes(licence)
    print(f"{target}: MediaPipe face mesh model ({len(model) / 1e6:.2f} MB, Apache-2.0) from {WHEEL}")


if __name__ == "__main__":
    main()
