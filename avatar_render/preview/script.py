"""The words spoken, when the user gives them (``preview.transcript``): the phones by forced alignment.

The phone recogniser hears many m/b/p as k/t/g (docs/preview.md); a user who iterates on a script knows its
words. PocketSphinx's English dictionary (it ships in its wheel) gives each word's phones and its aligner
places them in the audio: first the words over the whole file (an FSG of the text, short pauses allowed
between words, ``<sil>`` at each sentence's end), then the phones of pieces of at most PIECE_S between
word boundaries (the phone pass over a whole file held 2.7 GB for five minutes of speech). A word the
dictionary lacks, text that cannot be aligned, or audio that arrives as a stream: no script, and one line
saying why (the recogniser's phones are used instead).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.preview.phones import FRAME_S, RATE, Phone

PIECE_S = 15.0  # the phone pass aligns pieces of at most this much audio (cut at word boundaries)
# The aligner's settings, tried in turn until one aligns the text (PocketSphinx 5 with its defaults fails on
# most texts of several sentences; each of these failed on one of the recordings of docs/preview.md and the
# next one aligned it): the beams, pauses between any two words (fillers) or not, and a pause at the end of
# each sentence or not.
_TRIES = (
    (dict(beam=1e-80, wbeam=1e-60, pbeam=1e-80, fsgusefiller=False), " "),
    (dict(beam=1e-120, wbeam=1e-100, pbeam=1e-120, fsgusefiller=False), " "),
    (dict(beam=1e-120, wbeam=1e-100, pbeam=1e-120, fsgusefiller=True), " <sil> "),
)
_FALLBACK = "the mouth follows the phones heard instead"


@dataclass(frozen=True)
class Script:
    """The phones of the transcript, placed in the audio (seconds from its start), in order."""

    phones: tuple[Phone, ...]

    def window(self, start: float, end: float) -> tuple[Phone, ...]:
        """The phones over [start, end) seconds, relative to ``start``, clipped to it; gaps between them SIL."""
        out: list[Phone] = []
        at = 0.0
        for p in self.phones:
            a, b = max(p.start, start) - start, min(p.end, end) - start
            if b <= a:
                continue
            if a > at:
                out.append(Phone("SIL", at, a))
            out.append(Phone(p.label, a, b))
            at = b
        if at < end - start:
            out.append(Phone("SIL", at, end - start))
        return tuple(out)


def read_transcript(path: str | Path) -> str:
    """The text of a transcript file (UTF-8)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AvatarRenderError(f"The transcript file '{p}' was not found (preview.transcript).") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AvatarRenderError(f"The transcript file '{p}' could not be read as UTF-8 text ({e}).") from None
    if not words_of(text):
        raise AvatarRenderError(f"The transcript file '{p}' has no words in it (preview.transcript).")
    return text


def words_of(text: str) -> list[list[str]]:
    """The text's sentences (split at . ! ? ; : and new lines), each a list of lower-case words."""
    sentences = (re.sub(r"[^\w' -]", " ", s.lower()).replace("_", " ") for s in re.split(r"[.!?;:\n]", text))
    out = []
    for s in sentences:
        words = [w.strip("'-") for w in re.split(r"[\s-]+", s)]
        if any(words):
            out.append([w for w in words if w])
    return out


def align_script(audio: np.ndarray, text: str) -> tuple[Script | None, str]:
    """(the script, "") or (None, the one line that says why there is none). audio: (n,) float32 at 16 kHz."""
    from pocketsphinx import Decoder

    sentences = words_of(text)
    decoders: list = []  # made as they are needed (each loads the dictionary: about 0.7 s)

    def decoder(i: int):
        while len(decoders) <= i:
            decoders.append(Decoder(samprate=RATE, bestpath=False, loglevel="FATAL", **_TRIES[len(decoders)][0]))
        return decoders[i]

    unknown = sorted({w for s in sentences for w in s if decoder(0).lookup_word(w) is None})
    if unknown:
        shown = ", ".join(f"'{w}'" for w in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        return None, (f"The transcript has words the English dictionary does not know ({shown}): {_FALLBACK}.")
    failed = f"The transcript could not be aligned with the audio (other words spoken?): {_FALLBACK}."
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
    words = next((w for i, (_, join) in enumerate(_TRIES)
                  if (w := _aligned_words(decoder(i), pcm, join.join(" ".join(s) for s in sentences))) is not None),
                 None)
    if words is None:
        return None, failed
    phones: list[Phone] = []
    for first, last, piece in _pieces(words):
        got = next((p for i in range(len(_TRIES))
                    if (p := _aligned_phones(decoder(i), pcm[first * _HOP : (last + 1) * _HOP], " ".join(piece)))
                    is not None), None)
        if got is None:
            return None, failed
        phones += [Phone(label, (first + a) * FRAME_S, (first + b) * FRAME_S) for label, a, b in got]
    return Script(tuple(phones)), ""


_HOP = round(FRAME_S * RATE)  # samples per PocketSphinx frame


def _aligned_words(decoder, pcm: np.ndarray, text: str) -> list[tuple[str, int, int]] | None:
    """(word, first frame, last frame) of each word of the text in the audio (pauses left out), or None."""
    decoder.set_align_text(text)
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), full_utt=True)
    decoder.end_utt()
    if decoder.hyp() is None:
        return None
    return [(re.sub(r"\(\d+\)$", "", s.word), s.start_frame, s.end_frame) for s in decoder.seg()
            if not s.word.startswith("<") and not s.word.startswith("[")]


def _pieces(words: list[tuple[str, int, int]]) -> list[tuple[int, int, list[str]]]:
    """Consecutive words grouped into pieces of at most PIECE_S: (first frame, last frame, words)."""
    out: list[tuple[int, int, list[str]]] = []
    for word, a, b in words:
        if out and (b - out[-1][0]) * FRAME_S <= PIECE_S:
            out[-1] = (out[-1][0], b, out[-1][2] + [word])
        else:
            out.append((a, b, [word]))
    return out


def _aligned_phones(decoder, pcm: np.ndarray, text: str) -> list[tuple[str, int, int]] | None:
    """(phone, first frame, end frame) of each phone of the text in a piece of audio, or None."""
    decoder.set_align_text(text)
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), full_utt=True)
    decoder.end_utt()
    if decoder.hyp() is None:
        return None
    decoder.set_alignment()
    decoder.start_utt()
    decoder.process_raw(pcm.tobytes(), full_utt=True)
    decoder.end_utt()
    alignment = decoder.get_alignment()  # (kept referenced while its phones are read: the binding needs it)
    return [("SIL" if p.name.startswith(("SIL", "+")) else p.name, p.start, p.start + p.duration)
            for p in alignment.phones()]
