"""Frames <-> latents on the Wan VAE's time grid: latent 0 holds frame 0, latent j >= 1 holds frames
4j-3 .. 4j. Chunks of the diffusion backend start on latent boundaries (frame 0 or 1 + 4k). The one
place this arithmetic is written: the DiT, the VAE and the backend's stages all use it."""

from __future__ import annotations

TIME_STRIDE = 4  # frames per latent after the first (the VAE's temporal downsampling)


def latent_of(frame: int, stride: int = TIME_STRIDE) -> int:
    return 0 if frame == 0 else (frame - 1) // stride + 1


def first_frame(latent: int, stride: int = TIME_STRIDE) -> int:
    return 0 if latent == 0 else stride * (latent - 1) + 1


def latents_for(start: int, end: int) -> tuple[int, int]:
    """Latent range [a, b) covering frames [start, end); start must be on a latent boundary."""
    assert start == 0 or (start - 1) % TIME_STRIDE == 0, start
    return latent_of(start), latent_of(end - 1) + 1


def frames_in(num_latents: int, stride: int = TIME_STRIDE) -> int:
    """Frames decoded from a sequence of latents that starts with a one-frame latent (0 for none)."""
    return 0 if num_latents == 0 else 1 + stride * (num_latents - 1)


def latents_in(num_frames: int, stride: int = TIME_STRIDE) -> int:
    """Latents that hold ``num_frames`` frames (1 + 4k) starting with a one-frame latent: frames_in's inverse."""
    return latent_of(num_frames - 1, stride) + 1
