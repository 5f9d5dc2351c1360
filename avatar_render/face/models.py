"""Where the installed face models live (``avatar-render setup`` puts them there), the lock their OpenCV nets
share, and their reading."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.pipeline.module import Module

GET_MODEL = "avatar-render setup"  # the install step that puts them in place

# OpenCV's TFLite reader and its nets are not safe to use from two threads at once (a render reads the models in
# its set-up and in the early face search's thread): failed reads, crashes and endless spins were seen.
DNN_LOCK = threading.Lock()


def model_folders() -> list[Path]:
    """Where installed models are looked for, first match wins: beside this package, then the user's data folder."""
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return [Path(__file__).with_name("data"), data / "avatar-render"]


def installed(name: str) -> Path | None:
    """The first installed model file called ``name``, or None."""
    return next((p for p in (f / name for f in model_folders()) if p.is_file()), None)


def read_tflite(path: Path, side: int, what: str) -> tuple[cv2.dnn.Net, dict[str, np.ndarray]]:
    """OpenCV's net of the TFLite model at ``path`` (a square input of ``side`` pixels), run once on zeros -> (the
    net, its outputs by name). ``what`` names the model in the sentence raised when it cannot be read."""
    try:
        with DNN_LOCK:
            net = cv2.dnn.readNetFromTFLite(str(path))
            net.setInput(np.zeros((1, 3, side, side), np.float32))
            names = list(net.getUnconnectedOutLayersNames())
            outs = net.forward(names)
    except cv2.error:
        raise AvatarRenderError(f"The {what} '{path}' could not be read; get it again with {GET_MODEL}.") from None
    return net, dict(zip(names, outs))


class TfliteModel(Module):
    """A module whose weights are one installed .tflite file, read by OpenCV (``_net``, set by each one's ``_load``)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._net: cv2.dnn.Net | None = None

    def weight_files(self) -> list[Path]:
        return [self.path]
