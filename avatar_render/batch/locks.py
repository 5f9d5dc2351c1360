"""Per-job locks of one output folder, so that two batches writing into it at once never render, nor
record, the same job: a byte-range lock (``lockf``) on ``OUT/.batch/locks``, one byte per job at an
offset made from its key, held by the batch process while the job is its own. The system drops a lock
when its process ends, however it ends."""

from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

from avatar_render.errors import AvatarRenderError
from avatar_render.files.names import os_reason, shown
from avatar_render.files.write import open_lock


class JobLocks:
    def __init__(self, batch_folder: Path) -> None:
        path = Path(batch_folder) / "locks"
        try:
            self._fd = open_lock(path)
        except OSError as e:
            raise AvatarRenderError(f"Cannot open the batch's lock file {shown(path)}: {os_reason(e)}.") from None

    def take(self, key: str) -> bool:
        """Whether the job ``key`` is now this batch's (False: another batch holds it)."""
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _offset(key))
        except (BlockingIOError, PermissionError):
            return False
        return True

    def close(self) -> None:
        """Every lock of this batch let go (closing the descriptor drops them all)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JobLocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _offset(key: str) -> int:
    return int(hashlib.sha256(key.encode()).hexdigest()[:15], 16)  # below 2**60: a valid file offset
