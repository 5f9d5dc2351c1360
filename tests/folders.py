"""A folder's contents as a comparable value: what the ownership tests check a command left alone."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def snapshot(folder: Path, *, mtimes: bool = False) -> dict[str, tuple]:
    """Every entry under ``folder`` without following links: links by target, files by content (and
    modification time with ``mtimes``)."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(root) / name
            rel = str(p.relative_to(folder))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            else:
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[rel] = (p.stat().st_mtime_ns, digest) if mtimes else (digest,)
    return out
