"""The face landmark model used from several threads at once, as a render does (its planning thread and the
preview's early face search): OpenCV's TFLite reader, used so, failed reads ("Unsupported operator type
PRELU"), crashed the process or spun for ever, so every read and run of the model takes one lock."""

from __future__ import annotations

import threading
import time

import cv2
import pytest

from avatar_render.face.detect import FaceDetector
from avatar_render.face.landmarks import LandmarkModel, find_model
from tests.test_preview import FACE


class _Overlap:
    """Counts how many threads are inside the wrapped calls at once; each call lingers a little so that
    calls made together overlap unless something keeps them apart."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def wrap(self, fn):
        def counted(*args):
            with self._lock:
                self.inside += 1
                self.most = max(self.most, self.inside)
            try:
                time.sleep(0.05)
                return fn(*args)
            finally:
                with self._lock:
                    self.inside -= 1

        return counted


class _CountedNet:
    def __init__(self, net, overlap: _Overlap) -> None:
        self.setInput = overlap.wrap(net.setInput)
        self.forward = overlap.wrap(net.forward)


def _together(work, n: int = 4) -> list:
    start = threading.Barrier(n)
    out: list = [None] * n

    def one(i: int) -> None:
        start.wait()
        out[i] = work()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


@pytest.fixture
def model_path():
    path = find_model()
    if path is None:
        pytest.skip("the face landmark model is not installed (avatar-render setup)")
    return path


def test_the_model_is_read_by_one_thread_at_a_time(model_path, monkeypatch):
    overlap = _Overlap()
    monkeypatch.setattr(cv2.dnn, "readNetFromTFLite", overlap.wrap(cv2.dnn.readNetFromTFLite))
    models = [LandmarkModel(model_path) for _ in range(4)]
    loaded = iter(models)
    lock = threading.Lock()

    def load_one():
        with lock:
            m = next(loaded)
        m.load()
        return m._net is not None

    assert _together(load_one) == [True] * 4
    assert overlap.most == 1


def test_the_model_is_run_by_one_thread_at_a_time(model_path):
    image = cv2.cvtColor(cv2.imread(str(FACE)), cv2.COLOR_BGR2RGB)
    face = FaceDetector().detect(image)
    overlap = _Overlap()
    models = [LandmarkModel(model_path) for _ in range(2)]
    for m in models:
        m.load()
        m._net = _CountedNet(m._net, overlap)
    meshes = _together(lambda: [m.from_box(image, face.face, face.roll) for m in models])
    assert all(mesh is not None for pair in meshes for mesh in pair)
    assert overlap.most == 1
