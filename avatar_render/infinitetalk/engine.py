"""The diffusion backend: Wan2.1 I2V + audio cross-attention (InfiniteTalk family), wired as a Pipeline."""

from __future__ import annotations

from avatar_render.config import Config
from avatar_render.distributed.cfg_parallel import spare_replicas, split_passes
from avatar_render.distributed.mesh import Mesh
from avatar_render.distributed.parallelize import dit_plan, text_plan
from avatar_render.distributed.split_decode import RowSplit
from avatar_render.errors import AvatarRenderError
from avatar_render.infinitetalk.a2v import A2VStage
from avatar_render.infinitetalk.components import architectures, make_components
from avatar_render.infinitetalk.stages import (
    AUDIO_MARGIN_S,
    AudioContext,
    LatentDecode,
    ModelInit,
)
from avatar_render.models.grid import TIME_STRIDE, frames_in, latents_in
from avatar_render.models.sampler import SamplerConfig, passes, serial
from avatar_render.pipeline.pipeline import ChunkSizes, Pipeline

SPATIAL_STRIDE = 16  # VAE 8x8 times the DiT's 2x2 patches


def check_sizes(cfg: Config) -> None:
    c, v = cfg.chunk, cfg.video
    checks = [
        (c.chunk_frames % TIME_STRIDE == 0, "chunk.chunk_frames", "must be a multiple of 4 for this backend (the VAE packs 4 frames per latent)"),
        (c.context_frames >= 1 and (c.context_frames - 1) % TIME_STRIDE == 0, "chunk.context_frames", "must be 1 + 4k for this backend (e.g. 1, 5, 9)"),
        (c.transition_frames % (2 * TIME_STRIDE) == 0, "chunk.transition_frames", "must be a multiple of 8 for this backend"),
        (frames_in(latents_in(c.context_frames)) <= c.chunk_frames + 1, "chunk.context_frames", "must not exceed chunk.chunk_frames + 1"),
        (v.width % SPATIAL_STRIDE == 0 and v.height % SPATIAL_STRIDE == 0, "video.width", "and video.height must be multiples of 16 for this backend"),
    ]
    for ok, key, why in checks:
        if not ok:
            raise AvatarRenderError(f"Config key '{key}' {why}.")


def build_infinitetalk(cfg: Config, mesh: Mesh) -> Pipeline:
    """The backend's pipeline for this process of the launch that ``mesh`` describes."""
    check_sizes(cfg)
    m, c = cfg.model, cfg.chunk
    comps = make_components(m, seed=cfg.seed, parallel=dit_plan(cfg.dist, mesh), text_shard=text_plan(cfg.dist, mesh),
                            device=mesh.device,
                            stream_dit=max(1, cfg.dist.prefetch_blocks) if cfg.dist.offload.get("dit") == "offloaded" else 0)
    context_latents = latents_in(c.context_frames)
    new_latents = c.chunk_frames // TIME_STRIDE + 1  # N0 holds the reference latent too
    max_latents = max(context_latents + new_latents, c.transition_frames // TIME_STRIDE + 2)
    fps = cfg.fps
    sampler = SamplerConfig(steps=m.steps, shift=m.shift, text_scale=m.text_scale, audio_scale=m.audio_scale)
    at_once = len(passes(sampler)) if cfg.dist.cfg_parallel else 1  # passes of a step the replicas can share
    spare = spare_replicas(mesh, at_once, architectures(m.size).dit.num_heads) if mesh.distributed else None
    return Pipeline(
        init=ModelInit(vae=comps.vae, text=comps.text, image=comps.image, prompt=m.prompt,
                       negative_prompt=m.negative_prompt, max_latents=max_latents, face_box=cfg.face.box),
        generate=(
            AudioContext(audio=comps.audio, context_latents=context_latents,
                         latent_hw=(cfg.video.height // 8, cfg.video.width // 8)),
            A2VStage(dit=comps.dit, vae=comps.vae, context_frames=c.context_frames, context_mode=m.context_mode,
                     evaluate=split_passes(mesh, serial) if cfg.dist.cfg_parallel else serial, sampler=sampler),
        ),
        decode=LatentDecode(vae=comps.vae, colour_guard=m.colour_guard,
                            split=RowSplit(mesh) if mesh.distributed and cfg.dist.split_decode else None, writes=mesh.is_writer),
        sizes=ChunkSizes(c.chunk_frames, c.context_frames, c.transition_frames, lead_frames=1),
        fps=fps,
        audio_rate=comps.audio.features.sample_rate,  # wav2vec2's input rate
        audio_pad_s=(frames_in(context_latents) + 2 * TIME_STRIDE) / float(fps) + AUDIO_MARGIN_S,
        notes=(spare,) if spare else (),
    )
