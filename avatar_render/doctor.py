"""What this machine can run, and why not: versions, codecs, devices, backends."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    group: str  # "versions", "codecs", "devices", "backends"
    name: str
    ok: bool
    detail: str


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def diagnose() -> list[Check]:
    checks = [Check("versions", "python", True, platform.python_version())]
    for dist in ("avatar-render", "numpy", "av", "opencv-python-headless", "pillow", "omegaconf", "typer", "rich", "torch"):
        v = _version(dist)
        checks.append(Check("versions", dist, v is not None or dist == "torch", v or "not installed"))
    codecs = _codecs()
    checks += codecs
    checks += _devices()
    preview_ok = all(c.ok for c in codecs) and _cascades_present()
    why = "runs on the CPU, no weights needed" if preview_ok else "needs the libx264 and aac encoders and OpenCV's face cascades"
    checks.append(Check("backends", "preview", preview_ok, why))
    checks.append(Check("backends", "infinitetalk", False, "not available in this version of avatar-render"))
    return checks


def _codecs() -> list[Check]:
    import av

    out = []
    ffmpeg = ".".join(map(str, av.library_versions.get("libavcodec", ())))
    for name, role in (("libx264", "H.264 video encoder"), ("aac", "AAC audio encoder")):
        try:
            av.codec.Codec(name, "w")
            out.append(Check("codecs", name, True, f"{role} (libavcodec {ffmpeg})"))
        except Exception:  # noqa: BLE001 - any failure means the codec is unusable
            out.append(Check("codecs", name, False, f"{role} missing from this FFmpeg build"))
    return out


def _cascades_present() -> bool:
    from avatar_render.preview.face import FaceDetector

    return not FaceDetector().missing_files()


def _devices() -> list[Check]:
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    out = [Check("devices", "cpu", True, f"{os.cpu_count()} cores, {mem_gb:.1f} GiB memory")]
    try:
        import torch
    except ImportError:
        out.append(Check("devices", "gpu", False, "torch is not installed, so no GPU can be used"))
        return out
    if torch.cuda.is_available():
        names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        out.append(Check("devices", "gpu", True, f"{torch.cuda.device_count()} CUDA device(s): {names}"))
    else:
        out.append(Check("devices", "gpu", False, "no CUDA device visible to torch"))
    return out
