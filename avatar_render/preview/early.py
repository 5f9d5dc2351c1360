"""The preview's slow set-up started from the command's first moments, while the rest of the package is
still being imported: the reference's face looked for (OpenCV's cascades, 0.2-0.4 s) and PocketSphinx's
decoder made (0.2-0.4 s), each in a thread (``preview.ahead``). Both let go of the interpreter, and both
were on the path to the first frame. The set-up takes what was made: the face when the image it was found
in is the image it renders, for the same ``face.index`` and landmark model (else, and with a face box or
after a failure, it looks again, as before); the decoder as it is (its settings are fixed). This module
imports nothing heavy until its threads run, but OpenCV (see ``start``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from avatar_render.preview import ahead

EARLY_MAX_PIXELS = 16_000_000  # larger references are looked at by the set-up alone (48 MB as RGB)


def start(cfg: Any, reference: Path) -> None:
    """Start looking for the face of the image ``reference`` as ``cfg`` asks for it (unless ``face.box``
    places it) and making the phone recogniser's decoder (when ``preview.phones`` is on)."""
    if not cfg.face.box:
        # OpenCV imported here, before the thread: its loader takes its module out of sys.modules while it loads the
        # binary, and a thread importing it meanwhile was handed the bare binary module, without cv2.data (about
        # one render in 60 failed so). The library imports it anyway; in one thread it loads whole.
        import cv2  # noqa: F401

        index, landmarks = cfg.face.index, cfg.face.landmarks
        ahead.begin(ahead.FACE, lambda: _find_face(Path(reference), index, landmarks))
    if cfg.preview.phones:
        ahead.begin(ahead.PHONE_DECODER, _make_decoder)


def take_face(image: Any, index: Optional[int], landmarks: Any) -> Optional[tuple]:
    """``face.detect.choose_face``'s answer for ``image`` (its face layout or None, and the note) when the
    early search looked in the very same pixels for the same ``face.index``, its boxes checked by the same
    landmark model (``landmarks``, a ``LandmarkModel`` or None); else None."""
    found = ahead.take(ahead.FACE)
    if found is None or found[0] != (index, None if landmarks is None else landmarks.path):
        return None
    import numpy as np

    return found[2] if np.array_equal(found[1], image) else None


def _find_face(reference: Path, index: Optional[int], landmarks: str) -> Optional[tuple]:
    """((face.index, the landmark model's path or None), the image, choose_face's answer), or None for a video
    reference. landmarks: the ``face.landmarks`` setting."""
    from avatar_render.face.detect import FaceDetector, choose_face
    from avatar_render.face.landmarks import LandmarkModel, find_model
    from avatar_render.io.reference import VIDEO_SUFFIXES, image_within, load_reference

    if reference.suffix.lower() in VIDEO_SUFFIXES or not image_within(reference, EARLY_MAX_PIXELS):
        return None  # (a video's first frame, read with the rest of the video; a large image, read once)
    image = load_reference(reference)
    path = find_model(landmarks)
    is_face = None if path is None else LandmarkModel(path).finds_face(image)
    return (index, path), image, choose_face(image, FaceDetector(index=index), None, is_face=is_face)


def _make_decoder() -> Any:
    from avatar_render.preview.phones import make_decoder, model_dir

    root = model_dir()
    return None if root is None else make_decoder(root)
