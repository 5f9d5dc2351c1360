"""What this machine can run, and why not: versions, codecs, devices, backends."""

from __future__ import annotations

import importlib.metadata
import os
import platform

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from avatar_render.backends import BACKENDS, Check
from avatar_render.infinitetalk.checks import MODEL_INSTALL


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _required() -> dict[str, str]:
    """{distribution: version specifier} of avatar-render's own dependencies, as installed (empty when its
    metadata is not there, e.g. run from a checkout that was never installed)."""
    try:
        lines = importlib.metadata.requires("avatar-render") or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    out = {}
    for line in lines:
        req = Requirement(line)
        if req.marker is None:
            out[canonicalize_name(req.name)] = str(req.specifier)
    return out


def _dependency(dist: str, version: str | None, required: dict[str, str]) -> Check:
    if version is None:
        return Check("versions", dist, False, "not installed: pip install -e .")
    spec = required.get(canonicalize_name(dist), "")
    if spec and not SpecifierSet(spec).contains(version, prereleases=True):
        return Check("versions", dist, False, f"{version}, outside what avatar-render is tested with: pip install "
                                              f"'{dist}{spec}'")
    return Check("versions", dist, True, version)


def diagnose(cfg=None) -> list[Check]:
    """Everything below, and what each backend says of itself (with a config that selects the diffusion
    backend and sets model.root, its weight files)."""
    checks = [Check("versions", "python", True, platform.python_version())]
    required = _required()
    for dist in ("avatar-render", "numpy", "av", "opencv-python-headless", "pillow", "omegaconf", "typer", "rich"):
        checks.append(_dependency(dist, _version(dist), required))
    torch = _version("torch")
    checks.append(Check("versions", "torch", torch is not None,
                        torch or f"not installed; only the infinitetalk backend needs it: {MODEL_INSTALL}"))
    codecs = _codecs()
    checks += codecs
    checks += _devices()
    for backend in BACKENDS.values():  # each says what it needs (its models, weight files, packages)
        checks += backend.load("checks")(cfg, can_encode=all(c.ok for c in codecs), version=_version)
    checks.append(_sessions())
    return checks


def _sessions() -> Check:
    """What a session (--audio -, post:, rtmp://) can read: the demuxers of the streams it takes."""
    import av

    wanted = ("wav", "mov", "ogg", "mpegts", "flv")  # WAV, fragmented MP4, Ogg/Opus, MPEG-TS, FLV (RTMP)
    missing = [name for name in wanted if name not in av.formats_available]
    if missing:
        return Check("inputs", "sessions", False, f"this FFmpeg build cannot read {', '.join(missing)} streams")
    return Check("inputs", "sessions", True, "--audio - (WAV, fMP4, Ogg, MPEG-TS, raw PCM), post: with --serve, "
                                             "rtmp:// and srt:// listeners (srt: the ffmpeg command)")


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
    elif torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        why = f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build to use a GPU"
        out.append(Check("devices", "gpu", False, why))
    else:
        why = f"no CUDA device visible to torch (a CUDA {torch.version.cuda} build)"
        out.append(Check("devices", "gpu", False, why))
    return out
