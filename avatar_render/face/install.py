"""The install step for the face models (``avatar-render setup``): MediaPipe's face mesh (face_landmark.tflite),
short-range face detector (face_detection_short_range.tflite) and selfie segmentation (selfie_segmentation.tflite,
all Apache-2.0), put where ``landmarks.find_model``, ``finder.find_model`` and ``segment.find_model`` find them.

The models ship inside the ``mediapipe==0.10.21`` wheels on PyPI (later releases ship no models). pip
downloads one such wheel (no dependencies, nothing installed); only the models and their licence are taken
out, each model's SHA-256 checked. Nothing is downloaded when all are already in place; a render never
calls this.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from avatar_render.errors import AvatarRenderError
from avatar_render.face import finder, segment
from avatar_render.face.landmarks import MODEL_FILE, MODEL_SHA256, model_search_paths
from avatar_render.files.targets import check_folder
from avatar_render.files.write import (
    make_folder,
    remove,
    remove_empty_folder,
    replace_atomically,
    temp_beside,
    temp_folder,
)

WHEEL = "mediapipe==0.10.21"
WHAT = f"MediaPipe's face mesh, face detection and person segmentation models (Apache-2.0) from {WHEEL}"
# (member of the wheel, file written, its SHA-256)
MODELS = (
    ("mediapipe/modules/face_landmark/face_landmark.tflite", MODEL_FILE, MODEL_SHA256),
    ("mediapipe/modules/face_detection/face_detection_short_range.tflite", finder.MODEL_FILE, finder.MODEL_SHA256),
    ("mediapipe/modules/selfie_segmentation/selfie_segmentation.tflite", segment.MODEL_FILE, segment.MODEL_SHA256),
)
# The model is the same in every platform's wheel: ask for one that exists, whatever this Python is.
PLATFORM = ("--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "--implementation", "cp")


def default_folder() -> Path:
    """The first folder of ``model_search_paths()`` this user can write into."""
    for path in model_search_paths():
        try:
            make_folder(path.parent, parents=True)
            remove(temp_beside(path))  # a file can be made there
        except OSError:
            continue
        return path.parent
    raise AvatarRenderError(
        "No writable folder for the face models; pass --dest DIR, then face.landmarks=DIR/face_landmark.tflite "
        "(the second face detector is looked for only in the usual folders)."
    )


def install_model(dest: Path | None = None) -> tuple[Path, bool]:
    """Put the models into ``dest`` (default: ``default_folder()``) -> (the landmark model's path, whether they were
    downloaded now)."""
    made = dest is not None and check_folder(Path(dest), what="folder for the face models (--dest)", create=True)
    dest = Path(dest) if dest is not None else default_folder()
    target = dest / MODEL_FILE
    if all(_intact(dest / name, digest) for _, name, digest in MODELS):
        return target, False
    with temp_folder() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "--only-binary=:all:", *PLATFORM,
               "--dest", str(tmp), "--quiet", "--disable-pip-version-check"]
        done = subprocess.run(cmd, capture_output=True, text=True)  # (pip's retries and errors, one sentence)
        if done.returncode != 0:
            if made:
                remove_empty_folder(dest)
            raise AvatarRenderError(
                f"pip could not download {WHEEL} ({_why(done.stderr)}); the preview uses its template mesh until this "
                "step succeeds."
            )
        wheel = next(tmp.glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            models = {name: z.read(member) for member, name, _ in MODELS}
            licence = next((z.read(n) for n in z.namelist() if n.endswith(".dist-info/LICENSE")), b"")
    for _, name, expected in MODELS:
        digest = hashlib.sha256(models[name]).hexdigest()
        if digest != expected:
            raise AvatarRenderError(f"{name} in {WHEEL} has SHA-256 {digest}, not the expected {expected}.")
    for name, model in models.items():
        replace_atomically(dest / name, model)
    if licence:
        replace_atomically(dest / "face_landmark.LICENSE", licence)
    return target, True


def _why(said: str) -> str:
    """pip's failure in a few words: the index unreachable, or its last error line."""
    if any(w in said for w in ("NameResolution", "Failed to establish a new connection", "Network is unreachable")):
        return "the package index could not be reached: is this machine offline?"
    errors = [line.removeprefix("ERROR:").strip() for line in said.splitlines() if line.startswith("ERROR:")]
    return errors[-1].rstrip(".") if errors else f"pip said: {said.strip()[-200:] or 'nothing'}"


def _intact(path: Path, digest: str) -> bool:
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == digest
