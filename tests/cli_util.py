"""The CLI run as a user runs it: a separate process, its output captured."""

from __future__ import annotations

import subprocess
import sys


def cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "avatar_render", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)
