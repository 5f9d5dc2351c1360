"""What ``avatar-render doctor`` says of the preview backend: which face landmarks and mouth shapes it
uses here (both work without their model), and whether it can run (the encoders, OpenCV's cascades)."""

from __future__ import annotations

from typing import Callable

from avatar_render.backends import PREVIEW, Check
from avatar_render.errors import AvatarRenderError
from avatar_render.face import finder, segment
from avatar_render.face.detect import FaceDetector
from avatar_render.face.landmarks import GET_MODEL, find_model, model_search_paths


def checks(cfg, *, can_encode: bool, version: Callable[[str], str | None]) -> list[Check]:
    ok = can_encode and not FaceDetector().missing_files()
    why = ("runs on the CPU, no weights needed" if ok
           else "needs the libx264 and aac encoders and OpenCV's face cascades")
    return [*_models(cfg), Check("backends", PREVIEW.name, ok, why)]


def _models(cfg) -> list[Check]:
    from avatar_render.preview.phones import model_dir

    setting = cfg.face.landmarks if cfg is not None else "auto"
    try:
        path = find_model(setting)
    except AvatarRenderError as e:
        path, problem = None, str(e)
    else:
        problem = ""
    if path is not None:
        landmarks = Check("models", "face landmarks", True, f"MediaPipe face mesh, 468 points: {path}")
    else:
        why = problem or ("face.landmarks=template" if setting == "template"
                          else f"not installed (looked in {', '.join(map(str, model_search_paths()))})")
        landmarks = Check("models", "face landmarks", True, f"template mesh on the detector's boxes ({why}); "
                          f"for exact lips and eyelids: {GET_MODEL}")
    second = finder.find_model()
    if path is not None and second is not None:
        faces = Check("models", "face detection", True,
                      f"OpenCV's frontal-face cascade, and MediaPipe's BlazeFace for the faces it misses: {second}")
    else:
        faces = Check("models", "face detection", True, "OpenCV's frontal-face cascade only ("
                      + ("face.landmarks=template" if path is None and setting == "template" else
                         f"BlazeFace, which also finds faces turned or speaking, with the landmark model: {GET_MODEL}")
                      + ")")
    person = segment.find_model()
    behind = (Check("models", "person segmentation", True,
                    f"MediaPipe's selfie segmentation: the background stays still as the head moves: {person}")
              if person is not None else
              Check("models", "person segmentation", True,
                    f"not installed: the background near the head moves with it ({GET_MODEL})"))
    root = model_dir()
    phones = (Check("models", "phones", True, f"PocketSphinx allphone, English acoustic model: {root}")
              if root is not None
              else Check("models", "phones", True,
                         "PocketSphinx not installed: mouth shapes from loudness only (pip install pocketsphinx)"))
    return [landmarks, faces, behind, phones]
