"""The VAE decode split across the processes of a launch, so that it does not leave all but one
GPU idle: each process decodes a strip of latent rows (the decoder's stem and middle block, whose
attention sees the whole frame, run on the whole frame; the upsampling blocks on the strip and a halo
of ``decoder_halo`` rows) with its own causal cache, then the strips are gathered into whole frames.
Equal to the whole decode up to float32 rounding."""

from __future__ import annotations

import torch

from avatar_render.dist.mesh import Mesh


def strip(height: int, parts: int, index: int) -> tuple[int, int]:
    """Latent rows [lo, hi) of strip ``index`` of ``parts`` (sizes differ by one row at most)."""
    return height * index // parts, height * (index + 1) // parts


class RowSplit:
    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh

    def rows(self, height: int) -> tuple[int, int]:
        return strip(height, self.mesh.world, self.mesh.rank)

    def gather(self, part: torch.Tensor, height: int, scale: int) -> torch.Tensor:
        """Every process's strip [B, C, T, scale * rows, W] -> whole frames [B, C, T, scale * height, W]."""
        import torch.distributed as dist

        bounds = [strip(height, self.mesh.world, r) for r in range(self.mesh.world)]
        tallest = scale * max(hi - lo for lo, hi in bounds)
        padded = torch.nn.functional.pad(part, (0, 0, 0, tallest - part.shape[-2])).contiguous()
        parts = [torch.empty_like(padded) for _ in bounds]
        dist.all_gather(parts, padded)
        return torch.cat([p[..., : scale * (hi - lo), :] for p, (lo, hi) in zip(parts, bounds)], dim=-2)
