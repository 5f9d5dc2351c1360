"""Tests only: on PYTHONPATH of the processes a batch test starts (its workers, a Ray instance), with
AVATAR_TEST_CHUNK_DELAY=SECONDS set, every preview chunk takes that much longer, so that a test can
kill a job in the middle; the frames are unchanged."""

import os

if os.environ.get("AVATAR_TEST_CHUNK_DELAY"):
    import time

    from avatar_render.preview import engine

    _delay = float(os.environ["AVATAR_TEST_CHUNK_DELAY"])
    _original = engine.PreviewRender.run

    def _slow_run(self, x, *, static, carry):
        time.sleep(_delay)
        return _original(self, x, static=static, carry=carry)

    engine.PreviewRender.run = _slow_run
