"""The VAE decode split across the processes of a launch, so that it does not leave all but one
GPU idle: each process decodes a strip of latent rows (the decoder's stem and middle block, whose
attention sees the whole frame, run on the whole frame; the upsampling blocks on the strip and a halo
of ``decoder_halo`` rows) with its own causal cache. Each process turns its strip into 8-bit pixels
(per-frame colour statistics summed over all strips where the colour guard needs them) and only the
writing process gathers the strips into whole frames. Equal to the whole decode up to float32 rounding."""

from __future__ import annotations

import torch

from avatar_render.distributed.device_mesh import Mesh


def strip(height: int, parts: int, index: int) -> tuple[int, int]:
    """Latent rows [lo, hi) of strip ``index`` of ``parts`` (sizes differ by one row at most)."""
    return height * index // parts, height * (index + 1) // parts


class RowSplit:
    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh

    def rows(self, height: int) -> tuple[int, int]:
        return strip(height, self.mesh.world, self.mesh.rank)

    def moments(self, sums: torch.Tensor) -> torch.Tensor:
        """Per-strip sums of any statistics -> the sums over the whole frames (every process)."""
        import torch.distributed as dist

        dist.all_reduce(sums)
        return sums

    def gather(self, part: torch.Tensor, height: int, scale: int) -> torch.Tensor | None:
        """Every process's strip of pixels [T, scale * rows, W, 3] -> whole frames [T, scale * height, W, 3]
        on the writing process; None elsewhere (the others drop their frames)."""
        import torch.distributed as dist

        bounds = [strip(height, self.mesh.world, r) for r in range(self.mesh.world)]
        padded = part.new_zeros((part.shape[0], scale * max(hi - lo for lo, hi in bounds), *part.shape[2:]))
        padded[:, : part.shape[1]] = part
        if not self.mesh.is_writer:
            dist.gather(padded, None, dst=0)
            return None
        parts = [torch.empty_like(padded) for _ in bounds]
        dist.gather(padded, parts, dst=0)
        return torch.cat([p[:, : scale * (hi - lo)] for p, (lo, hi) in zip(parts, bounds)], dim=1)
