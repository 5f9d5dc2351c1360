"""The publishing slot of the diffusion backend's pipeline: what turns the published latents into
frames at the output size.

* ``model.sr=none``: the causal VAE decode (``LatentDecode``), split across processes under torchrun.
* ``model.sr=vae2x``: the 2x decoder's causal decode, then scaled to the output size (``sr``).
* ``model.sr=swiftvr``: the causal decode at the generation size (and the 2x decode as the fidelity
  path when asked), then the one-step SR with its face guard (``sr``).

With SR every process of a launch decodes whole frames (the SR needs them whole; at the generation
size the decode is cheap) and runs the SR on them; only the writing process copies frames to the
host. Under ``dist.fsdp`` the SR DiT is sharded like the A2V DiT (each block, then the root), so each
process holds 1/N of it; its compute is not split (every process restores the same frames).
"""

from __future__ import annotations

from typing import Optional

from avatar_render.backends import sr_mode
from avatar_render.config import Config
from avatar_render.distributed.device_mesh import Mesh, resolve_device
from avatar_render.distributed.parallelize import shard
from avatar_render.distributed.split_decode import RowSplit
from avatar_render.infinitetalk.components import Components
from avatar_render.infinitetalk.sr import SRStage
from avatar_render.infinitetalk.sr_components import make_sr_components
from avatar_render.infinitetalk.sr_decode import FidelityDecode, PixelDecode
from avatar_render.infinitetalk.sr_guard import GuardSettings
from avatar_render.infinitetalk.stages import LatentDecode
from avatar_render.models.sr.swiftvr_stream import SwiftVRStream
from avatar_render.pipeline.chain import StageChain
from avatar_render.pipeline.stage import Stage


def build_publish(cfg: Config, comps: Components, mesh: Mesh) -> Stage:
    m, dist, mode = cfg.model, cfg.dist, sr_mode(cfg.model.sr)
    if not mode.upscales:
        return LatentDecode(vae=comps.vae, colour_guard=m.colour_guard,
                            split=RowSplit(mesh) if mesh.distributed and dist.split_decode else None,
                            writes=mesh.is_writer)
    shard_dit = None
    if mesh.distributed and dist.fsdp:
        offload = dist.offload.get("sr") == "offloaded"
        shard_dit = lambda net: shard(net, list(net.blocks), mesh, offload=offload, prefetch=dist.prefetch_blocks)  # noqa: E731
    stream = max(1, dist.prefetch_blocks) if dist.offload.get("sr") == "offloaded" else 0
    sr = make_sr_components(m, seed=cfg.seed, device=resolve_device(m.device, mesh.device), shard_dit=shard_dit,
                            stream_dit=stream)
    out = (cfg.video.width, cfg.video.height)
    if not mode.one_step:
        return StageChain((PixelDecode(vae=sr.vae2x, colour_guard=m.colour_guard),
                           SRStage(size=out, writes=mesh.is_writer)))
    stages: list[Stage] = [PixelDecode(vae=comps.vae, colour_guard=m.colour_guard)]
    if sr.vae2x is not None:
        stages.append(FidelityDecode(vae=sr.vae2x, colour_guard=m.colour_guard))
    guard = GuardSettings(mouth=m.sr_mouth, colour=m.sr_colour, identity_drop=m.sr_identity_drop)
    swift = SwiftVRStream(sr.reae, sr.dit, lowres=cfg.gen_size, out=out, overlap=m.sr_overlap)
    stages.append(SRStage(size=out, stream=swift, guard=guard, writes=mesh.is_writer))
    return StageChain(tuple(stages))


def publish_notes(cfg: Config, mesh: Mesh) -> Optional[str]:
    """What the user should know about the publishing slot under torchrun (None: nothing)."""
    if sr_mode(cfg.model.sr).upscales and mesh.distributed and cfg.dist.split_decode:
        return "With model.sr set, every process decodes whole frames (dist.split_decode applies to sr=none only)."
    return None
