"""Where the person is in a reference: MediaPipe's selfie segmentation (``selfie_segmentation.tflite``,
Apache-2.0), read by OpenCV's TFLite reader and installed beside the face models by ``avatar-render setup``.

The preview moves the head over what lies behind it with it (``preview.backdrop``); without this model the
background near the head bends along with it.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.face.models import DNN_LOCK, TfliteModel, installed, read_tflite

MODEL_FILE = "selfie_segmentation.tflite"
MODEL_SHA256 = "9ee168ec7c8f2a16c56fe8e1cfbc514974cbbb7e434051b455635f1bd1462f5c"  # as in mediapipe 0.10.21
_INPUT = 256
_AROUND = 1.3  # the square the model looks at, over the longer side of the region asked about


def find_model() -> Path | None:
    return installed(MODEL_FILE)


class PersonSegmenter(TfliteModel):
    name = "person_segmenter"

    def _load(self) -> None:
        net, outs = read_tflite(self.path, _INPUT, "person segmentation model")
        if [o.shape for o in outs.values()] != [(1, 1, _INPUT, _INPUT)]:
            raise AvatarRenderError(f"The person segmentation model '{self.path}' is not MediaPipe's selfie "
                                    "segmentation.")
        self._net = net

    def person(self, image: np.ndarray, region: tuple[int, int, int, int]) -> np.ndarray:
        """(y1 - y0, x1 - x0) float32, 0..1: how far each pixel of ``region`` (x0, y0, x1, y1) of an (H, W, 3) uint8
        RGB image is the person's. The model looks at a square around it (the picture's edges repeated beyond)."""
        self.load()
        assert self._net is not None
        rx0, ry0, rx1, ry1 = region
        side = max(int(np.ceil(_AROUND * max(rx1 - rx0, ry1 - ry0))), 1)
        x0, y0 = (rx0 + rx1) // 2 - side // 2, (ry0 + ry1) // 2 - side // 2
        h, w = image.shape[:2]
        part = image[max(y0, 0) : min(y0 + side, h), max(x0, 0) : min(x0 + side, w)]
        square = cv2.copyMakeBorder(part, max(-y0, 0), max(y0 + side - h, 0), max(-x0, 0), max(x0 + side - w, 0),
                                    cv2.BORDER_REPLICATE)
        small = cv2.resize(square, (_INPUT, _INPUT), interpolation=cv2.INTER_AREA)
        with DNN_LOCK:
            self._net.setInput(cv2.dnn.blobFromImage(small, scalefactor=1 / 255.0))  # RGB in [0, 1]
            found = self._net.forward()
        mask = cv2.resize(found.reshape(_INPUT, _INPUT).astype(np.float32), (side, side),
                          interpolation=cv2.INTER_LINEAR)
        return np.ascontiguousarray(np.clip(mask[ry0 - y0 : ry1 - y0, rx0 - x0 : rx1 - x0], 0, 1))
