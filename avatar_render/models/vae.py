"""The Wan2.1 video VAE (diffusers' ``AutoencoderKLWan``) with a chunk-by-chunk causal encode and decode.

4 frames -> 1 latent (the first latent holds 1 frame), 8x8 pixels -> 1 latent, 16 channels.
Latents outside this module are normalised with the published per-channel mean/std:
``z = (mu - mean) / std``. diffusers' own ``decode()`` clears its causal cache on every call, so it
cannot be called chunk by chunk; ``StreamingDecoder`` drives the decoder latent by latent and carries
the cache (a ``CausalCache``) from one call to the next, which gives exactly the full decode.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderKLWan
from diffusers.models.autoencoders.autoencoder_kl_wan import (
    CACHE_T,
    WanCausalConv3d,
    WanResample,
    WanUpsample,
)
from torch import nn

from avatar_render.models.grid import frames_in
from avatar_render.models.weights import (
    TorchModule,
    by_table,
    load_checkpoint,
    read_json,
    safetensors_shards,
)

# fmt: off
WAN21_LATENTS_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
                      0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)
WAN21_LATENTS_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
                     3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)
# fmt: on
NATIVE_FILE = "Wan2.1_VAE.pth"
DIFFUSERS_FILE = "diffusion_pytorch_model.safetensors"


@dataclass(frozen=True)
class VaeConfig:
    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    temperal_downsample: tuple[bool, ...] = (False, True, True)  # diffusers' spelling
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD
    out_channels: int = 3  # 12 for a decoder that emits 2x2 pixels per pixel (pixel-shuffled afterwards)

    @classmethod
    def tiny(cls) -> VaeConfig:
        """Same layout and compression (4x8x8, 16 channels), 4 base channels: about 240 k parameters."""
        return cls(base_dim=4)

    @classmethod
    def from_diffusers(cls, cfg: dict) -> VaeConfig:
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items() if k in cls.__dataclass_fields__}
        return cls(**fields)

    @property
    def temporal_factor(self) -> int:
        return 2 ** sum(self.temperal_downsample)

    @property
    def spatial_factor(self) -> int:
        return 2 ** (len(self.dim_mult) - 1)

    def num_frames(self, num_latents: int) -> int:
        """Frames decoded from ``num_latents`` latents of one stream: 1 + 4 (n - 1)."""
        return frames_in(num_latents, self.temporal_factor)


@dataclass(frozen=True)
class CausalCache:
    """What one direction of the VAE carries between calls (the decode stage's carry).

    ``feats``: per causal 3-D convolution, the last (at most two) frames it saw, ``None`` before its
    first call, or diffusers' "Rep" marker after the first latent of an upsampling layer.
    ``steps``: latents decoded (or frame groups encoded) so far. The size depends on the resolution,
    never on the number of calls.
    """

    feats: tuple[Any, ...]
    steps: int = 0

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.feats if isinstance(t, torch.Tensor))


def locate_vae(path: Path) -> tuple[str, list[Path]]:
    """(layout, files): ``("wan", [Wan2.1_VAE.pth])`` or ``("diffusers", [config.json, *safetensors])``.

    ``path`` is the .pth (or a Wan-native .safetensors) itself, a folder holding it, a diffusers VAE folder, or a
    diffusers model folder with a ``vae/`` subfolder. An unknown folder resolves to the Wan file (reported missing).
    """
    path = Path(path)
    if path.suffix in (".pth", ".pt", ".safetensors"):
        return "wan", [path]
    if (path / NATIVE_FILE).is_file():
        return "wan", [path / NATIVE_FILE]
    for folder in (path / "vae", path):
        cfg = folder / "config.json"
        if cfg.is_file() and read_json(cfg).get("_class_name") == "AutoencoderKLWan":
            return "diffusers", [cfg, *safetensors_shards(folder, DIFFUSERS_FILE)]
    return "wan", [path / NATIVE_FILE]


# diffusers residual-block part -> index in Wan's ``residual`` Sequential (norm, SiLU, conv, norm, SiLU, dropout, conv)
_RES_LEAF = {
    "norm1": "residual.0",
    "conv1": "residual.2",
    "norm2": "residual.3",
    "conv2": "residual.6",
    "conv_shortcut": "shortcut",
}
_MID = {"resnets.0": "0", "attentions.0": "1", "resnets.1": "2"}


def native_vae_key(key: str, num_res_blocks: int) -> str:
    """The Wan-native name of a diffusers ``AutoencoderKLWan`` tensor name (Wan2.1 layout)."""

    def res(leaf: str) -> str:
        head, _, rest = leaf.partition(".")
        return f"{_RES_LEAF[head]}.{rest}" if head in _RES_LEAF else leaf

    rules: list[tuple[str, Any]] = [
        (r"quant_conv\.(.+)", lambda m: f"conv1.{m[1]}"),
        (r"post_quant_conv\.(.+)", lambda m: f"conv2.{m[1]}"),
        (r"(encoder|decoder)\.conv_in\.(.+)", lambda m: f"{m[1]}.conv1.{m[2]}"),
        (r"(encoder|decoder)\.norm_out\.(.+)", lambda m: f"{m[1]}.head.0.{m[2]}"),
        (r"(encoder|decoder)\.conv_out\.(.+)", lambda m: f"{m[1]}.head.2.{m[2]}"),
        (r"(encoder|decoder)\.mid_block\.(\w+\.\d+)\.(.+)", lambda m: f"{m[1]}.middle.{_MID[m[2]]}.{res(m[3])}"),
        (r"encoder\.down_blocks\.(\d+)\.(.+)", lambda m: f"encoder.downsamples.{m[1]}.{res(m[2])}"),
        (
            r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)",
            lambda m: f"decoder.upsamples.{int(m[1]) * (num_res_blocks + 2) + int(m[2])}.{res(m[3])}",
        ),
        (
            r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.+)",
            lambda m: f"decoder.upsamples.{int(m[1]) * (num_res_blocks + 2) + num_res_blocks + 1}.{m[2]}",
        ),
    ]
    for pattern, fn in rules:
        m = re.fullmatch(pattern, key)
        if m:
            return fn(m)
    raise KeyError(key)


def native_vae_table(net: nn.Module, config: VaeConfig) -> dict[str, str]:
    """Wan-native name -> diffusers name, for every tensor of ``net``."""
    return {native_vae_key(k, config.num_res_blocks): k for k in net.state_dict()}


class WanVae(TorchModule):
    """The Wan2.1 VAE. ``path``: see ``locate_vae``; None = random weights."""

    name = "vae"
    what = "Wan2.1 VAE"

    def __init__(
        self,
        config: VaeConfig = VaeConfig(),
        *,
        path: Path | str | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> None:
        super().__init__(device=device, dtype=dtype, seed=seed)
        self.config = config
        self.path = Path(path) if path is not None else None
        self.layout, self._files = locate_vae(self.path) if self.path is not None else (None, [])

    def weight_files(self) -> list[Path]:
        return list(self._files)

    def build(self) -> AutoencoderKLWan:
        return AutoencoderKLWan(**{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self.config).items()})

    def _load(self) -> None:
        if self.layout == "diffusers" and not self.missing_files():
            self.config = VaeConfig.from_diffusers(read_json(self._files[0]))
        super()._load()

    def read_weights(self, net: nn.Module) -> None:
        if self.layout == "diffusers":
            files, table = self._files[1:], {name: name for name in net.state_dict()}
        else:
            files, table = self._files, native_vae_table(net, self.config)
        load_checkpoint(net, files, by_table(table), what=self.what, dtype=self.dtype)

    @property
    def model(self) -> AutoencoderKLWan:
        assert self.net is not None, "load the VAE first"
        return self.net  # type: ignore[return-value]

    def _stats(self) -> tuple[torch.Tensor, torch.Tensor]:
        """mean, std: [1, z_dim, 1, 1, 1] float32 on the compute device."""
        shape = (1, self.config.z_dim, 1, 1, 1)
        dev = self.compute_device
        mean = torch.tensor(self.config.latents_mean, dtype=torch.float32, device=dev).view(shape)
        std = torch.tensor(self.config.latents_std, dtype=torch.float32, device=dev).view(shape)
        return mean, std

    def encode(self, frames: torch.Tensor) -> torch.Tensor:
        """frames [B, 3, 1 + 4k, H, W] in [-1, 1] -> normalised latents [B, 16, 1 + k, H/8, W/8] float32."""
        enc = StreamingEncoder(self)
        return enc.encode(frames, enc.start())[0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """normalised latents [B, 16, n, h, w] -> frames [B, 3, 1 + 4 (n - 1), 8h, 8w] in [-1, 1] float32."""
        dec = StreamingDecoder(self)
        return dec.decode(latents, dec.start())[0]


def decoder_reach(decoder: nn.Module) -> int:
    """How many earlier latents the decoder's causal state depends on: its temporal receptive field,
    in latents, rounded up. Each causal convolution looks back ``kernel - 1`` frames at its own frame
    rate, which each 3-D upsampler doubles (children are visited in forward order)."""

    def walk(m: nn.Module, rate: int) -> tuple[float, int]:
        if isinstance(m, WanCausalConv3d):
            return (m.kernel_size[0] - 1) * m.dilation[0] / rate, rate
        if isinstance(m, WanResample):
            if m.mode == "upsample3d":  # its time convolution runs before the frame rate doubles
                return walk(m.time_conv, rate)[0], rate * 2
            return 0.0, rate
        reach = 0.0
        for child in m.children():
            r, rate = walk(child, rate)
            reach += r
        return reach, rate

    return math.ceil(walk(decoder, 1)[0])


def decoder_halo(decoder: nn.Module) -> int:
    """Latent rows beyond a strip that its decoded pixels depend on, past the middle block (whose
    attention sees the whole frame, so it runs on whole frames): the spatial receptive field of the
    upsampling blocks and the head, in latent rows, rounded up."""

    def walk(m: nn.Module, scale: int) -> tuple[float, int]:
        if isinstance(m, WanUpsample):
            return 0.0, scale * int(m.scale_factor[0])
        if isinstance(m, (nn.Conv2d, nn.Conv3d)):
            k, d = m.kernel_size[-2], m.dilation[-2]
            return (k - 1) // 2 * d / scale, scale
        reach = 0.0
        for child in m.children():
            r, scale = walk(child, scale)
            reach += r
        return reach, scale

    reach, scale = 0.0, 1
    for part in (decoder.up_blocks, decoder.conv_out):
        r, scale = walk(part, scale)
        reach += r
    return math.ceil(reach)


def _cached_conv(conv: nn.Module, x: torch.Tensor, feats: list, idx: list[int]) -> torch.Tensor:
    """One causal convolution with its cache entry, as the Wan decoder runs its first and last ones."""
    i = idx[0]
    keep = x[:, :, -CACHE_T:].clone()
    if keep.shape[2] < 2 and feats[i] is not None:
        keep = torch.cat([feats[i][:, :, -1:].to(keep.device), keep], dim=2)
    x = conv(x, feats[i])
    feats[i] = keep
    idx[0] += 1
    return x


def decode_rows(decoder: nn.Module, x: torch.Tensor, feats: list, first: bool, rows: tuple[int, int],
                halo: int) -> torch.Tensor:
    """The decoder's forward for one latent, keeping only output rows of latent rows ``[lo, hi)``:
    the stem and middle block on the whole frame, the rest on the strip and ``halo`` rows around it.
    x [B, C, 1, h, w] -> [B, 3, T, 8 (hi - lo), 8 w]."""
    idx = [0]
    x = _cached_conv(decoder.conv_in, x, feats, idx)
    x = decoder.mid_block(x, feat_cache=feats, feat_idx=idx)
    lo, hi = rows
    a, b = max(lo - halo, 0), min(hi + halo, x.shape[-2])
    x = x[..., a:b, :]
    for up in decoder.up_blocks:
        x = up(x, feat_cache=feats, feat_idx=idx, first_chunk=first)
    x = decoder.nonlinearity(decoder.norm_out(x))
    x = _cached_conv(decoder.conv_out, x, feats, idx)
    s = x.shape[-2] // (b - a)
    return x[..., (lo - a) * s : (hi - a) * s, :]


def _num_causal_convs(part: nn.Module) -> int:
    return sum(isinstance(m, WanCausalConv3d) for m in part.modules())


class StreamingDecoder:
    """Decodes one latent stream in pieces: ``decode(z[:, :, :a]) ++ decode(z[:, :, a:])`` == ``decode(z)``.

    The object holds no stream state; the cache goes in and comes out of every call.
    """

    def __init__(self, vae: WanVae, rows: tuple[int, int] | None = None) -> None:
        self.vae = vae
        self.rows = rows  # decode only the pixels of these latent rows [lo, hi) (a strip of a split decode)

    def start(self) -> CausalCache:
        return CausalCache(feats=(None,) * _num_causal_convs(self.vae.model.decoder))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, cache: CausalCache) -> tuple[torch.Tensor, CausalCache]:
        """latents [B, 16, f, h, w] (the next f of the stream) -> (frames [B, C, T, 8h, 8w], cache).

        C = ``config.out_channels`` (3, or 12 for the 2x decoder before its pixel shuffle).

        T = 4 f, or 1 + 4 (f - 1) when the stream starts here; frames in [-1, 1], float32.
        """
        net = self.vae.model
        mean, std = self.vae._stats()
        b, _, f, h, w = latents.shape
        rows = h if self.rows is None else self.rows[1] - self.rows[0]
        if f == 0 or rows == 0:  # nothing to decode (an empty strip: more processes than latent rows)
            s, n = self.vae.config.spatial_factor, self.vae.config.temporal_factor
            t = 0 if f == 0 else n * f - (n - 1) * (cache.steps == 0)
            empty = torch.zeros(b, self.vae.config.out_channels, t, rows * s, w * s, device=mean.device)
            return empty, CausalCache(feats=cache.feats, steps=cache.steps + f)
        z = (latents.to(mean.device, torch.float32) * std + mean).to(self.vae.dtype)
        x = net.post_quant_conv(z)  # 1x1x1: no temporal state
        feats = list(cache.feats)
        out = []
        halo = 0 if self.rows is None else decoder_halo(net.decoder)
        for i in range(f):
            first = cache.steps + i == 0
            if self.rows is None:
                out.append(net.decoder(x[:, :, i : i + 1], feat_cache=feats, feat_idx=[0], first_chunk=first))
            else:
                out.append(decode_rows(net.decoder, x[:, :, i : i + 1], feats, first, self.rows, halo))
        frames = torch.cat(out, dim=2).float().clamp_(-1.0, 1.0)
        return frames, CausalCache(feats=tuple(feats), steps=cache.steps + f)

    def window(self) -> int:
        """Latents from which ``restore`` rebuilds the cache exactly: the reach and the one decoded first."""
        return decoder_reach(self.vae.model.decoder) + 1

    @torch.no_grad()
    def restore(self, recent: torch.Tensor, decoded: int) -> CausalCache:
        """The cache after ``decoded`` latents of a stream, from its last ones (``recent`` [16, r, h, w]).

        The window is decoded again from an empty cache and its frames thrown away. The state
        depends on the last ``decoder_reach`` latents only, so it is exact once the window holds
        ``window()`` latents or the stream from its start. A checkpoint keeps these few latents
        instead of the cache (several GB of features at 480p)."""
        if decoded == 0:
            return self.start()
        if recent.shape[1] < min(decoded, self.window()):
            raise ValueError(
                f"{recent.shape[1]} latents cannot restore the decoder after {decoded} (it needs {self.window()})")
        cache = self.decode(recent[None], self.start())[1]
        return CausalCache(feats=cache.feats, steps=decoded)


class StreamingEncoder:
    """Encodes one frame stream in pieces: the first piece 1 + 4k frames, every later one 4k frames."""

    def __init__(self, vae: WanVae) -> None:
        self.vae = vae

    def start(self) -> CausalCache:
        return CausalCache(feats=(None,) * _num_causal_convs(self.vae.model.encoder))

    @torch.no_grad()
    def encode(self, frames: torch.Tensor, cache: CausalCache) -> tuple[torch.Tensor, CausalCache]:
        """frames [B, 3, T, H, W] in [-1, 1] -> (normalised latents [B, 16, t, H/8, W/8] float32, cache)."""
        net = self.vae.model
        n = self.vae.config.temporal_factor
        t = frames.shape[2]
        first = 1 if cache.steps == 0 else 0
        if t < first or (t - first) % n:
            need = "1 + 4k" if first else "4k"
            raise ValueError(f"the VAE encodes {need} frames per call here, got {t}")
        mean, std = self.vae._stats()
        x = frames.to(mean.device, self.vae.dtype)
        bounds = ([(0, 1)] if first else []) + [(a, a + n) for a in range(first, t, n)]
        if not bounds:
            b, _, _, h, w = frames.shape
            s = self.vae.config.spatial_factor
            return torch.zeros(b, self.vae.config.z_dim, 0, h // s, w // s, device=mean.device), cache
        feats = list(cache.feats)
        out = [net.encoder(x[:, :, a:b], feat_cache=feats, feat_idx=[0]) for a, b in bounds]
        mu = net.quant_conv(torch.cat(out, dim=2))[:, : self.vae.config.z_dim].float()
        return (mu - mean) / std, CausalCache(feats=tuple(feats), steps=cache.steps + len(bounds))
