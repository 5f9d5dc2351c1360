"""Tests only: on PYTHONPATH of the processes a batch test starts (its workers, a Ray instance), with
AVATAR_TEST_CHUNK_DELAY=SECONDS set, every preview chunk takes that much longer, so that a test can
kill a job in the middle; the frames are unchanged."""

import os

if os.environ.get("AVATAR_TEST_CHUNK_DELAY"):
    import time

    from tests.decode_hook import before_each_segment

    _delay = float(os.environ["AVATAR_TEST_CHUNK_DELAY"])
    before_each_segment(lambda segment: time.sleep(_delay))
