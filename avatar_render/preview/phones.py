"""Phone recognition ("allphone") with PocketSphinx 5: its English acoustic model and phone language
model ship in its wheel, so this runs offline, on one core, many times faster than real time.

Each call decodes one audio window as its own utterance (batch cepstral mean), after a fixed primer,
so that the result depends on that window only: a resumed render recognises the same phones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.pipeline.module import Module

RATE = 16_000  # the acoustic model's sample rate
FRAME_S = 0.01  # PocketSphinx's frame shift
_ACOUSTIC = ("mdef", "means", "variances", "transition_matrices", "sendump", "feat.params", "noisedict")
# Wide beams and every other frame: about 3x faster than the defaults, same phone classes in most frames.
_SEARCH = dict(lw=2.0, pip=0.3, beam=1e-10, pbeam=1e-10, ds=2)
_PRIMER_S = 0.1


@dataclass(frozen=True)
class Phone:
    label: str  # CMU phone (AA, B, ...) or SIL; noise fillers are reported as SIL
    start: float  # seconds from the start of the window
    end: float


def model_dir() -> Path | None:
    """PocketSphinx's bundled English model folder, or None when PocketSphinx is not installed."""
    try:
        from pocketsphinx import get_model_path
    except ImportError:
        return None
    return Path(get_model_path("en-us"))


class PhoneRecognizer(Module):
    name = "phone_recognizer"

    def __init__(self) -> None:
        super().__init__()
        self._decoder = None
        self._primer = b""

    def weight_files(self) -> list[Path]:
        root = model_dir()
        if root is None:
            return []
        return [*(root / "en-us" / f for f in _ACOUSTIC), root / "en-us-phone.lm.bin"]

    def _load(self) -> None:
        root = model_dir()
        if root is None:
            raise AvatarRenderError("PocketSphinx is not installed: pip install pocketsphinx.")
        missing = self.missing_files()
        if missing:
            raise AvatarRenderError(f"PocketSphinx's model file '{missing[0]}' is missing; reinstall pocketsphinx.")
        from pocketsphinx import Decoder

        self._decoder = Decoder(hmm=str(root / "en-us"), allphone=str(root / "en-us-phone.lm.bin"), samprate=RATE,
                                loglevel="FATAL", **_SEARCH)
        # A fixed, quiet primer utterance before each window resets what the decoder keeps between utterances.
        primer = np.random.default_rng(0).standard_normal(int(_PRIMER_S * RATE)) * 30
        self._primer = primer.astype(np.int16).tobytes()

    def recognize(self, audio: np.ndarray) -> tuple[Phone, ...]:
        """Phones of an (n,) float32 window at 16 kHz, in order, covering it."""
        self.load()
        assert self._decoder is not None
        pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16).tobytes()
        d = self._decoder
        for data in (self._primer, pcm):
            d.start_utt()
            d.process_raw(data, full_utt=True)
            d.end_utt()
        out = []
        for seg in d.seg():
            label = seg.word if seg.word.isalpha() and seg.word.isupper() else "SIL"
            out.append(Phone(label, seg.start_frame * FRAME_S, (seg.end_frame + 1) * FRAME_S))
        return tuple(out)
