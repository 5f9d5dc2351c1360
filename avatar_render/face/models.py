"""Where the installed face models live (``avatar-render setup`` puts them there), and the lock their OpenCV nets
share."""

from __future__ import annotations

import os
import threading
from pathlib import Path

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
