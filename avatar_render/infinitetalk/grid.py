"""Frames <-> latents on the Wan VAE's time grid: latent 0 holds frame 0, latent j >= 1 holds frames
4j-3 .. 4j. Chunks of this backend start on latent boundaries (frame 0 or 1 + 4k)."""

from __future__ import annotations

TIME_STRIDE = 4


def latent_of(frame: int) -> int:
    return 0 if frame == 0 else (frame - 1) // TIME_STRIDE + 1


def first_frame(latent: int) -> int:
    return 0 if latent == 0 else TIME_STRIDE * (latent - 1) + 1


def latents_for(start: int, end: int) -> tuple[int, int]:
    """Latent range [a, b) covering frames [start, end); start must be on a latent boundary."""
    assert start == 0 or (start - 1) % TIME_STRIDE == 0, start
    return latent_of(start), latent_of(end - 1) + 1


def frames_in(num_latents: int) -> int:
    """Frames decoded from a sequence of latents that starts with a one-frame latent."""
    return 1 + TIME_STRIDE * (num_latents - 1)
