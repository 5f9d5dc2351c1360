"""The diffusion backend: Wan2.1 I2V + audio cross-attention (InfiniteTalk family), wired as a Pipeline."""

from __future__ import annotations

from contextlib import nullcontext

from avatar_render.backends import INFINITETALK
from avatar_render.config import Config
from avatar_render.distributed.cfg_parallel import spare_replicas, split_passes
from avatar_render.distributed.device_mesh import Mesh
from avatar_render.errors import AvatarRenderError
from avatar_render.infinitetalk.a2v import A2VStage
from avatar_render.infinitetalk.components import architectures, make_components
from avatar_render.infinitetalk.parallel import dit_plan, text_plan
from avatar_render.infinitetalk.publish import build_publish, publish_notes
from avatar_render.infinitetalk.stages import AUDIO_MARGIN_S, AudioContext, ModelInit, reference_lead, side_stream
from avatar_render.models.grid import TIME_STRIDE, frames_in, latents_in
from avatar_render.models.sampler import SamplerConfig, passes, serial
from avatar_render.pipeline.pipeline import ChunkSizes, Pipeline

SPATIAL_STRIDE = 16  # VAE 8x8 times the DiT's 2x2 patches


def check_sizes(cfg: Config) -> None:
    c = cfg.chunk
    width, height = cfg.gen_size
    size_key = "model.gen_width" if cfg.model.gen_width else "video.width"
    checks = [
        (c.chunk_frames % TIME_STRIDE == 0, "chunk.chunk_frames",
         "must be a multiple of 4 for this backend (the VAE packs 4 frames per latent)"),
        (c.context_frames >= 1 and (c.context_frames - 1) % TIME_STRIDE == 0, "chunk.context_frames",
         "must be 1 + 4k for this backend (e.g. 1, 5, 9)"),
        (c.transition_frames % (2 * TIME_STRIDE) == 0, "chunk.transition_frames",
         "must be a multiple of 8 for this backend"),
        (frames_in(latents_in(c.context_frames)) <= c.chunk_frames + 1, "chunk.context_frames",
         "must not exceed chunk.chunk_frames + 1"),
        (c.first_frames % TIME_STRIDE == 0, "chunk.first_frames",
         "must be a multiple of 4 for this backend (0: as long as chunk.chunk_frames; 4 is the shortest)"),
        (c.first_frames == 0 or frames_in(latents_in(c.context_frames)) <= c.first_frames + 1, "chunk.first_frames",
         f"must be at least chunk.context_frames - 1 ({c.context_frames - 1}) for this backend: "
         "the second chunk takes its context from the first"),
        (width % SPATIAL_STRIDE == 0 and height % SPATIAL_STRIDE == 0, size_key,
         "and its height must be multiples of 16 for this backend "
         f"(it is the size the model generates at: {width}x{height})"),
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
                            stream_dit=max(1, cfg.dist.prefetch_blocks)
                            if cfg.dist.offload.get("dit") == "offloaded" else 0)
    context_latents = latents_in(c.context_frames)
    new_latents = c.chunk_frames // TIME_STRIDE + 1  # N0 holds the reference latent too
    first_latents = (c.first_frames or c.chunk_frames) // TIME_STRIDE + 1
    max_latents = max(context_latents + new_latents, first_latents, c.transition_frames // TIME_STRIDE + 2)
    fps = cfg.fps
    sampler = SamplerConfig(steps=m.steps, shift=m.shift, text_scale=m.text_scale, audio_scale=m.audio_scale)
    at_once = len(passes(sampler)) if cfg.dist.cfg_parallel else 1  # passes of a step the replicas can share
    spare = spare_replicas(mesh, at_once, architectures(m.size).dit.num_heads) if mesh.distributed else None
    return Pipeline(
        init=ModelInit(vae=comps.vae, text=comps.text, image=comps.image, prompt=m.prompt,
                       negative_prompt=m.negative_prompt, max_latents=max_latents, face_box=cfg.face.box,
                       size=cfg.gen_size, face_index=cfg.face.index),
        generate=(
            AudioContext(audio=comps.audio, context_latents=context_latents,
                         latent_hw=(cfg.gen_size[1] // 8, cfg.gen_size[0] // 8), vae=comps.vae, image=comps.image),
            A2VStage(dit=comps.dit, vae=comps.vae, context_frames=c.context_frames, context_mode=m.context_mode,
                     evaluate=split_passes(mesh, serial) if cfg.dist.cfg_parallel else serial, sampler=sampler),
        ),
        decode=build_publish(cfg, comps, mesh),  # the decode, and the SR stage with model.sr
        sizes=ChunkSizes(c.chunk_frames, c.context_frames, c.transition_frames, lead_frames=INFINITETALK.lead_frames,
                         first_frames=c.first_frames),
        lead=reference_lead,  # frame 0 is the reference latent's: it goes out before N0 is sampled
        overlap_decode=cfg.run.overlap_decode,
        decode_context=side_stream(comps.vae.device) if cfg.run.overlap_decode else nullcontext,
        fps=fps,
        audio_rate=comps.audio.features.sample_rate,  # wav2vec2's input rate
        audio_pad_s=(frames_in(context_latents) + 2 * TIME_STRIDE) / float(fps) + AUDIO_MARGIN_S,
        notes=tuple(n for n in (spare, publish_notes(cfg, mesh)) if n),
    )
