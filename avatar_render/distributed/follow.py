"""The chunk loop of a process that does not write: the same pipeline, inputs and seed as the writing
process, so that its collectives (FSDP all-gathers, sequence-parallel all-to-alls) match; its frames
are dropped."""

from __future__ import annotations


def follow(request) -> None:
    """Run ``request``'s pipeline to its end without writing anything."""
    from avatar_render.api import build_pipeline, request_input
    from avatar_render.distributed.launch import share_resume_point
    from avatar_render.io.audio import AudioReader
    from avatar_render.io.reference import load_reference

    cfg = request.config
    pipeline = build_pipeline(cfg)
    reference = load_reference(request.reference)
    with AudioReader(request.audio, fps=cfg.fps, model_rate=pipeline.audio_rate) as audio:
        static = pipeline.prepare(request_input(cfg, reference, request.reference))
        del reference
        resume = share_resume_point(None)  # the writer's, read from its journal
        for _ in pipeline.stream(static, audio, seed=cfg.seed, resume=resume):
            pass
