"""What this machine can run, and why not: versions, codecs, devices, backends."""

from __future__ import annotations

import importlib.metadata
import os
import platform
from dataclasses import dataclass

from avatar_render.errors import AvatarRenderError

_MODEL_INSTALL = "install PyTorch for your hardware, then pip install -e '.[model]' (see the README)"


@dataclass(frozen=True)
class Check:
    group: str  # "versions", "codecs", "devices", "backends"
    name: str
    ok: bool
    detail: str  # plain text (it may hold brackets, as in .[model])


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def diagnose(cfg=None) -> list[Check]:
    """Everything below; with a config whose backend is ``infinitetalk``, also its model files."""
    checks = [Check("versions", "python", True, platform.python_version())]
    for dist in ("avatar-render", "numpy", "av", "opencv-python-headless", "pillow", "omegaconf", "typer", "rich"):
        v = _version(dist)
        checks.append(Check("versions", dist, v is not None, v or "not installed: pip install -e ."))
    torch = _version("torch")
    checks.append(Check("versions", "torch", torch is not None,
                        torch or f"not installed; only the infinitetalk backend needs it: {_MODEL_INSTALL}"))
    codecs = _codecs()
    checks += codecs
    checks += _devices()
    preview_ok = all(c.ok for c in codecs) and _cascades_present()
    why = ("runs on the CPU, no weights needed" if preview_ok
           else "needs the libx264 and aac encoders and OpenCV's face cascades")
    checks += _preview_models(cfg)
    checks.append(Check("backends", "preview", preview_ok, why))
    checks += _infinitetalk(cfg)
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


def _infinitetalk(cfg) -> list[Check]:
    missing = [m for m in ("torch", "diffusers", "transformers", "safetensors") if _version(m) is None]
    if missing:
        return [Check("backends", "infinitetalk", False, f"needs {', '.join(missing)}: {_MODEL_INSTALL}")]
    if cfg is None or cfg.backend != "infinitetalk" or not cfg.model.root:
        return [Check("backends", "infinitetalk", True,
                      "installed; give -c configs/infinitetalk-480p.yaml model.root=FOLDER to check its weight files")]
    from avatar_render.infinitetalk.components import make_components
    from avatar_render.infinitetalk.sr_components import make_sr_components, sr_modules

    comps = make_components(cfg.model, seed=0)
    out = []
    modules = [comps.dit, comps.vae, comps.text, comps.image, comps.audio]
    if cfg.model.sr != "none":
        try:
            modules += sr_modules(make_sr_components(cfg.model, seed=0, device=torch_cpu()))
        except AvatarRenderError as e:  # an SR path unset or absent: say which
            out.append(Check("model files", "sr", False, str(e)))
    for module in modules:
        files = module.weight_files()
        gone = module.missing_files()
        for f in files:
            out.append(Check("model files", module.name, f not in gone,
                             f"{'present' if f not in gone else 'MISSING'}: {f}"))
        if not files:
            out.append(Check("model files", module.name, False, "no weight files found for it"))
    ok = all(c.ok for c in out)
    out.append(Check("backends", "infinitetalk", ok,
                     "all weight files present" if ok else "weight files missing (see above)"))
    return out


def torch_cpu():
    import torch

    return torch.device("cpu")


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


def _preview_models(cfg) -> list[Check]:
    """Which face landmarks and which mouth shapes the preview uses here (both work without their model)."""
    from avatar_render.errors import AvatarRenderError
    from avatar_render.face.landmarks import GET_MODEL, find_model, model_search_paths
    from avatar_render.preview.phones import model_dir

    setting = cfg.face.landmarks if cfg is not None else "auto"
    try:
        path = find_model(setting)
    except AvatarRenderError as e:
        path, problem = None, str(e)
    else:
        problem = ""
    if path is not None:
        landmarks = Check("models", "face landmarks", True, f"MediaPipe face mesh, 468 points: {path}")
    else:
        why = problem or ("face.landmarks=template" if setting == "template"
                          else f"not installed (looked in {', '.join(map(str, model_search_paths()))})")
        landmarks = Check("models", "face landmarks", True, f"template mesh on the detector's boxes ({why}); "
                          f"for exact lips and eyelids: {GET_MODEL}")
    root = model_dir()
    phones = (Check("models", "phones", True, f"PocketSphinx allphone, English acoustic model: {root}")
              if root is not None
              else Check("models", "phones", True,
                         "PocketSphinx not installed: mouth shapes from loudness only (pip install pocketsphinx)"))
    return [landmarks, phones]


def _cascades_present() -> bool:
    from avatar_render.face.detect import FaceDetector

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
    elif torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        why = f"this torch ({torch.__version__}) is a CPU-only build; install a CUDA build to use a GPU"
        out.append(Check("devices", "gpu", False, why))
    else:
        why = f"no CUDA device visible to torch (a CUDA {torch.version.cuda} build)"
        out.append(Check("devices", "gpu", False, why))
    return out
