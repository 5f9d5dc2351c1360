"""What ``avatar-render doctor`` says of the diffusion backend: whether its packages are installed and,
with a config that selects it and sets ``model.root``, whether each weight file is present. Nothing
here imports torch until the packages are known to be installed."""

from __future__ import annotations

from typing import Callable

from avatar_render.backends import INFINITETALK, Check, sr_mode
from avatar_render.errors import AvatarRenderError

MODEL_INSTALL = "install PyTorch for your hardware, then pip install -e '.[model]' (see the README)"


def checks(cfg, *, can_encode: bool, version: Callable[[str], str | None]) -> list[Check]:
    name = INFINITETALK.name
    missing = [m for m in ("torch", "diffusers", "transformers", "safetensors") if version(m) is None]
    if missing:
        return [Check("backends", name, False, f"needs {', '.join(missing)}: {MODEL_INSTALL}")]
    if cfg is None or cfg.backend != name or not cfg.model.root:
        return [Check("backends", name, True,
                      "installed; give -c configs/infinitetalk-480p.yaml model.root=FOLDER to check its weight files")]
    import torch

    from avatar_render.infinitetalk.components import make_components
    from avatar_render.infinitetalk.sr_components import make_sr_components, sr_modules

    comps = make_components(cfg.model, seed=0)
    out = []
    modules = [comps.dit, comps.vae, comps.text, comps.image, comps.audio]
    if sr_mode(cfg.model.sr).upscales:
        try:
            modules += sr_modules(make_sr_components(cfg.model, seed=0, device=torch.device("cpu")))
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
    out.append(Check("backends", name, ok, "all weight files present" if ok else "weight files missing (see above)"))
    return out
