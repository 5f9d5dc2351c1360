"""wav2vec2 audio features per video frame, as the InfiniteTalk family builds them, one chunk at a time.

The family's recipe (whole file at once): 16 kHz audio, zero-mean unit-variance normalised; the
convolutional features (one per 20 ms) are linearly interpolated to the video frame rate *before* the
transformer, so the transformer runs on one token per video frame; the features are the outputs of
every transformer layer (``hidden_states[1:]``, 12 x 768 for wav2vec2-base); video frame t gets
frames t-2 .. t+2 (indices clamped to the file). Here the same runs on a chunk's window with margins:
frame k of the chunk (starting at window sample ``pad + k * rate / fps``) sits at convolutional
position ``start_sample / 320``, which is exactly the family's ``align_corners`` interpolation when
the audio lasts a whole number of frames. The family's loudness normalisation to -23 LUFS is a pure
gain, which the zero-mean unit-variance step (and the first layer's group norm) cancel, so it is not
repeated here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import Wav2Vec2Config, Wav2Vec2Model

from avatar_render.models.weights import TorchModule, load_checkpoint, read_json

# Heads of pre-training / CTC checkpoints: present in published files, unused for features.
_UNUSED_PREFIXES = ("quantizer.", "project_q.", "project_hid.", "lm_head.", "dropout_features.")
TINY_WAV2VEC2 = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    conv_dim=(16,) * 7,
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)


@dataclass(frozen=True)
class AudioStats:
    """Sums over some audio of what wav2vec2 normalises over its whole input.

    wav2vec2-base normalises the input (zero mean, unit variance) and, in its first convolution, each
    channel over time (a group norm). On a chunk's window both use the window's statistics; these
    sums let them use longer audio instead (the whole file, or everything heard so far: ``merge`` the
    statistics of disjoint spans).
    """

    count: int  # samples
    total: float  # sum of the samples
    total_sq: float  # sum of their squares
    conv_count: int  # first-convolution outputs per channel
    conv_sum: torch.Tensor  # [C] float64: sum of the bias-free first convolution of the raw audio
    conv_sum_sq: torch.Tensor  # [C] float64: sum of its squares

    def merge(self, other: AudioStats) -> AudioStats:
        return AudioStats(
            self.count + other.count,
            self.total + other.total,
            self.total_sq + other.total_sq,
            self.conv_count + other.conv_count,
            self.conv_sum + other.conv_sum,
            self.conv_sum_sq + other.conv_sum_sq,
        )

    def input_moments(self) -> tuple[float, float]:
        """mean, std (with the feature extractor's 1e-7) of the samples."""
        mean = self.total / self.count
        var = max(self.total_sq / self.count - mean * mean, 0.0)
        return mean, math.sqrt(var + 1e-7)


@dataclass(frozen=True)
class AudioFeatureConfig:
    fps: float = 25.0
    sample_rate: int = 16000
    window: int = 2  # frame t sees frames t - window .. t + window


def wav2vec2_name(key: str) -> str | None:
    """The ``Wav2Vec2Model`` name of a published tensor name; None for unused heads."""
    key = key.removeprefix("wav2vec2.")
    if key.startswith(_UNUSED_PREFIXES):
        return None
    # Older checkpoints store the positional convolution's weight norm as weight_g / weight_v.
    key = key.replace("pos_conv_embed.conv.weight_g", "pos_conv_embed.conv.parametrizations.weight.original0")
    return key.replace("pos_conv_embed.conv.weight_v", "pos_conv_embed.conv.parametrizations.weight.original1")


class AudioEncoder(TorchModule):
    """wav2vec2 (transformers) from a local folder in the Hugging Face layout.

    ``path``: a folder with ``config.json``, ``model.safetensors`` (or ``pytorch_model.bin``) and
    optionally ``preprocessor_config.json``; None = random weights of ``config`` (Wav2Vec2Config
    keyword arguments; default wav2vec2-base).
    """

    name = "audio_encoder"
    what = "wav2vec2 audio encoder"

    def __init__(
        self,
        *,
        path: Path | str | None = None,
        config: dict | None = None,
        features: AudioFeatureConfig = AudioFeatureConfig(),
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> None:
        super().__init__(device=device, dtype=dtype, seed=seed)
        self.path = Path(path) if path is not None else None
        self.features = features
        self._config_kwargs = dict(config or {})
        self.do_normalize = True

    def weight_files(self) -> list[Path]:
        if self.path is None:
            return []
        weights = self.path / "model.safetensors"
        if not weights.is_file() and (self.path / "pytorch_model.bin").is_file():
            weights = self.path / "pytorch_model.bin"
        return [self.path / "config.json", weights]

    def _load(self) -> None:
        if self.path is not None and not self.missing_files():
            self._config_kwargs = read_json(self.path / "config.json")
            pre = self.path / "preprocessor_config.json"
            if pre.is_file():
                self.do_normalize = bool(read_json(pre).get("do_normalize", True))
        super()._load()

    def build(self) -> nn.Module:
        cfg = Wav2Vec2Config.from_dict(self._config_kwargs)
        cfg._attn_implementation = "sdpa"
        return Wav2Vec2Model(cfg)

    def read_weights(self, net: nn.Module) -> None:
        def convert(key: str, t: torch.Tensor):
            name = wav2vec2_name(key)
            return [] if name is None else [(name, t)]

        files = self.weight_files()[1:]
        load_checkpoint(net, files, convert, what=self.what, dtype=self.dtype, optional=["masked_spec_embed"])

    @property
    def num_layers(self) -> int:
        return self.net.config.num_hidden_layers

    @property
    def hidden_size(self) -> int:
        return self.net.config.hidden_size

    @torch.no_grad()
    def encode(
        self,
        audio: np.ndarray,
        *,
        num_frames: int,
        pad_s: float,
        first_frame: int | None = None,
        total_frames: int | None = None,
        stats: AudioStats | None = None,
        fps: float | None = None,
    ) -> torch.Tensor:
        """Features of a chunk's ``num_frames`` frames: [num_frames, 2 window + 1, num_layers, hidden] float32.

        ``audio``: (n,) float32 mono at 16 kHz covering [start - pad_s, end + pad_s) of the chunk, as
        the pipeline cuts it (zeros outside the file). With ``first_frame`` (the chunk's first frame
        in the file) the window's part before the file start is dropped, and with ``total_frames``
        its part from the file's end on; the +-2 frame windows are then clamped to the file, as the
        family does for the whole file. Otherwise they are clamped to the window. ``stats``: normalise
        with these statistics instead of the window's own. ``fps``: the video frame rate the features
        are made for (default: the encoder's own, 25).
        """
        rate, w = self.features.sample_rate, self.features.window
        fps = self.features.fps if fps is None else fps
        hop = rate / fps  # samples per video frame
        x = torch.as_tensor(np.asarray(audio, dtype=np.float32))
        start = float(round(pad_s * rate))  # window sample where chunk frame 0 starts
        k_lo = -math.floor(start / hop + 1e-9)
        k_hi = num_frames + math.floor((len(x) - start - num_frames * hop) / hop + 1e-9)
        if first_frame is not None:
            k_lo = max(k_lo, -first_frame)
            cut = max(0, round(start - first_frame * hop))  # samples before the file's start
            x, start = x[cut:], start - cut
            if total_frames is not None:
                k_hi = min(k_hi, total_frames - first_frame)
                x = x[: max(0, round(start + (total_frames - first_frame) * hop))]
        k_hi = max(k_hi, num_frames)
        net = self.net
        dev = self.compute_device
        stride = math.prod(net.config.conv_stride)
        reach = 1 + sum((k - 1) * math.prod(net.config.conv_stride[:i]) for i, k in enumerate(net.config.conv_kernel))
        if len(x) < reach:
            raise ValueError(f"wav2vec2 needs at least {reach} samples, the audio window has {len(x)}")
        conv = self._conv_features(x.to(dev), stats)[0].float()  # [C, L], one per 320 samples
        pos = (start + torch.arange(k_lo, k_hi, dtype=torch.float64) * hop) / stride
        pos = pos.clamp(0, conv.shape[1] - 1)
        i0 = pos.floor().long()
        i1 = (i0 + 1).clamp(max=conv.shape[1] - 1)
        frac = (pos - i0).to(dev, torch.float32)
        i0, i1 = i0.to(dev), i1.to(dev)
        per_frame = conv[:, i0] * (1 - frac) + conv[:, i1] * frac  # [C, S] at the video frame rate
        hidden, _ = net.feature_projection(per_frame.T[None].to(self.dtype))
        layers = self._layer_outputs(hidden)[0]  # [S, num_layers, hidden]

        k = torch.arange(num_frames)[:, None] + torch.arange(-w, w + 1)[None, :]
        idx = (k.clamp(k_lo, k_hi - 1) - k_lo).to(dev)  # [F, 2w + 1]
        return layers[idx].float()

    @torch.no_grad()
    def statistics(self, audio: np.ndarray) -> AudioStats:
        """The normalisation statistics of ``audio`` ((n,) float32 mono at 16 kHz)."""
        x = torch.as_tensor(np.asarray(audio, dtype=np.float32)).to(self.compute_device)
        conv = self.net.feature_extractor.conv_layers[0].conv
        h = nn.functional.conv1d(x[None, None].to(self.dtype), conv.weight, stride=conv.stride)[0].double()  # [C, L]
        xd = x.double()
        return AudioStats(
            len(x), float(xd.sum()), float((xd * xd).sum()), h.shape[1], h.sum(1).cpu(), (h * h).sum(1).cpu()
        )

    def _conv_features(self, x: torch.Tensor, stats: AudioStats | None) -> torch.Tensor:
        """x (n,) raw samples -> convolutional features [1, C, L] (the feature encoder, normalised as asked)."""
        if stats is None:
            mean, std = x.mean(), torch.sqrt(x.var(unbiased=False) + 1e-7)
        else:
            mean, std = stats.input_moments()
        if self.do_normalize:
            x = (x - mean) / std
        layers = list(self.net.feature_extractor.conv_layers)
        h = x[None, None].to(self.dtype)
        norm = getattr(layers[0], "layer_norm", None)
        if stats is not None and isinstance(norm, nn.GroupNorm):
            # The group norm with the given statistics: the first convolution is linear, so its
            # moments on the normalised input follow from those of the raw audio.
            first = layers.pop(0)
            w = first.conv.weight.double()  # [C, 1, k]
            scale, shift = (std, mean) if self.do_normalize else (1.0, 0.0)
            raw_mean = (stats.conv_sum / stats.conv_count).to(w.device)
            raw_var = (stats.conv_sum_sq / stats.conv_count).to(w.device) - raw_mean**2
            mu = (raw_mean - shift * w.sum(dim=(1, 2))) / scale
            if first.conv.bias is not None:
                mu = mu + first.conv.bias.double()
            var = raw_var.clamp(min=0) / scale**2
            h = first.conv(h)
            h = (h - mu[:, None].to(h.dtype)) * torch.rsqrt(var[:, None] + norm.eps).to(h.dtype)
            h = first.activation(h * norm.weight[:, None] + norm.bias[:, None])
        for layer in layers:
            h = layer(h)
        return h

    def _layer_outputs(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [B, S, C] after the feature projection -> every layer's output [B, S, num_layers, C]."""
        outs: list[torch.Tensor] = []
        hooks = [
            layer.register_forward_hook(lambda _m, _i, out: outs.append(out[0] if isinstance(out, tuple) else out))
            for layer in self.net.encoder.layers
        ]
        try:
            self.net.encoder(hidden)
        finally:
            for h in hooks:
                h.remove()
        return torch.stack(outs, dim=2)
