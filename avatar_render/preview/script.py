"""The words spoken, when the user gives them (``preview.transcript``): the phones by forced alignment.

The phone recogniser hears many m/b/p as k/t/g (docs/preview.md); a user who iterates on a script knows its
words. PocketSphinx's English dictionary (it ships in its wheel) gives each word's phones and its aligner
places them: the audio's stretches of speech (between pauses) each take a run of the words (``_share``), and
each stretch is aligned with its words alone (one alignment over a whole file went astray on texts of several
sentences, or failed, and its phone pass held 2.7 GB for five minutes of speech). A word the dictionary
lacks, words that do not fit the audio (MISMATCH_SCORE), or audio that arrives as a stream: no script, and
one line saying why (the recogniser's phones are used instead).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.preview.phones import FRAME_S, RATE, Phone

PAUSE_S = 0.2  # quiet this long parts two stretches of speech
QUIET_DB = 30.0  # a 10-ms frame this far under the audio's loudest is quiet
EDGE_S = 0.1  # each stretch is aligned with this much of the quiet either side
MAX_WORDS = 80  # words one stretch may take
BREAK_BONUS = 1.0  # a stretch that ends where the text has a mark (, . ! ? ; : or a new line): its cost lowered by this
EMPTY_COST = 2.0  # a stretch that takes no words (a cough, a breath)
# The aligned phones' mean score a frame (PocketSphinx's log units, 0 for the best state in each frame) under which
# the words are taken for others than those spoken: the recordings of docs/preview.md with their own texts
# score -14 to -35, with another recording's text -54 to -75.
MISMATCH_SCORE = -50.0
# The aligner's settings, tried in turn until one aligns a stretch's words: the default beams, then wider ones,
# then pauses allowed between words (fillers).
_TRIES = (
    dict(fsgusefiller=False),
    dict(beam=1e-120, wbeam=1e-100, pbeam=1e-120, fsgusefiller=False),
    dict(beam=1e-120, wbeam=1e-100, pbeam=1e-120, fsgusefiller=True),
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
    except IsADirectoryError:
        raise AvatarRenderError(f"The transcript '{p}' is a folder, not a text file (preview.transcript).") from None
    except (OSError, UnicodeDecodeError) as e:
        raise AvatarRenderError(f"The transcript file '{p}' could not be read as UTF-8 text ({e}).") from None
    if not words_of(text):
        raise AvatarRenderError(f"The transcript file '{p}' has no words in it (preview.transcript).")
    return text


def words_of(text: str) -> list[tuple[str, bool]]:
    """The text's words, lower-case, each with whether a mark that may be a pause follows it (, . ! ? ; : or a
    new line)."""
    out: list[tuple[str, bool]] = []
    for token in re.findall(r"[\w'-]+|[,.!?;:\n]", text.lower().replace("_", " ")):
        if token in ",.!?;:\n":
            if out:
                out[-1] = (out[-1][0], True)
            continue
        out += [(w, False) for w in (part.strip("'") for part in token.split("-")) if w]
    return out


def align_script(audio: np.ndarray, text: str) -> tuple[Script | None, str]:
    """(the script, "") or (None, the one line that says why there is none). audio: (n,) float32 at 16 kHz.

    The audio's stretches of speech (between pauses of PAUSE_S or more) each take a run of the words, those
    whose phones (the dictionary's) fill it at the audio's own rate of phones, preferably ending at a mark
    (``_share``); each stretch is then aligned with its words alone."""
    from pocketsphinx import Decoder

    words = words_of(text)
    decoders: list = []  # made as they are needed (each loads the dictionary: about 0.7 s)

    def decoder(i: int):
        while len(decoders) <= i:
            decoders.append(Decoder(samprate=RATE, bestpath=False, loglevel="FATAL", **_TRIES[len(decoders)]))
        return decoders[i]

    spelled = [decoder(0).lookup_word(w) for w, _ in words]
    unknown = sorted({w for (w, _), p in zip(words, spelled) if p is None})
    if unknown:
        shown = ", ".join(f"'{w}'" for w in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        return None, (f"The transcript has words the English dictionary does not know ({shown}): {_FALLBACK}.")
    failed = f"The transcript could not be aligned with the audio (other words spoken?): {_FALLBACK}."
    level = 10 * np.log10(np.mean(audio[: len(audio) // _HOP * _HOP].reshape(-1, _HOP) ** 2, axis=1) + 1e-12)
    stretches = _stretches(level)
    if not stretches:
        return None, failed
    counts = np.array([len(p.split()) for p in spelled], float)
    shares = _share(stretches, counts, np.array([b for _, b in words]))
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
    edge = round(EDGE_S / FRAME_S)
    phones: list[Phone] = []
    score, frames = 0.0, 0
    for (a, b), (i, j) in zip(stretches, shares):
        if i == j:
            continue
        first, last = max(0, a - edge), min(len(level), b + edge)
        text_ = " ".join(w for w, _ in words[i:j])
        got = next((p for t in range(len(_TRIES))
                    if (p := _aligned_phones(decoder(t), pcm[first * _HOP : last * _HOP], text_)) is not None), None)
        if got is None:
            return None, failed
        phones += [Phone(label, (first + x) * FRAME_S, (first + y) * FRAME_S) for label, x, y, _ in got]
        score, frames = score + sum(q[3] for q in got), frames + last - first
    if score / frames < MISMATCH_SCORE:
        return None, failed
    return Script(tuple(phones)), ""


_HOP = round(FRAME_S * RATE)  # samples per PocketSphinx frame


def _stretches(level: np.ndarray) -> list[tuple[int, int]]:
    """[first, end) 10-ms frames of each stretch of speech: louder than QUIET_DB under the loudest frame,
    parted by PAUSE_S of quiet or more. level: (n,) dB."""
    loud = level > max(float(level.max()) - QUIET_DB, -70.0) if len(level) else np.zeros(0, bool)
    idx = np.flatnonzero(loud)
    if len(idx) == 0:
        return []
    cuts = np.flatnonzero(np.diff(idx) > round(PAUSE_S / FRAME_S))
    starts = [int(idx[0]), *(int(idx[c + 1]) for c in cuts)]
    ends = [*(int(idx[c]) + 1 for c in cuts), int(idx[-1]) + 1]
    return list(zip(starts, ends))


def _share(stretches: list[tuple[int, int]], counts: np.ndarray, marks: np.ndarray) -> list[tuple[int, int]]:
    """The words [i, j) each stretch takes, in order, all of them: the run whose phones (counts: (W,)) at the
    audio's mean rate last as long as the stretch (the squared log of the ratio), a mark (marks: (W,) bool)
    after the run's last word lowering the cost by BREAK_BONUS; a stretch may take none (EMPTY_COST)."""
    n, w = len(stretches), len(counts)
    seconds = np.array([(b - a) * FRAME_S for a, b in stretches])
    rate = counts.sum() / seconds.sum()  # phones a second
    cum = np.concatenate([[0.0], np.cumsum(counts)])
    cost = np.full((n + 1, w + 1), np.inf)
    take = np.zeros((n + 1, w + 1), int)
    cost[0, 0] = 0.0
    j = np.arange(w + 1)
    for s in range(n):
        best, arg = cost[s] + EMPTY_COST, np.zeros(w + 1, int)
        for k in range(1, min(MAX_WORDS, w) + 1):
            i = j - k
            ok = i >= 0
            c = np.full(w + 1, np.inf)
            ratio = (cum[j[ok]] - cum[i[ok]]) / rate / seconds[s]
            c[ok] = cost[s, i[ok]] + np.log(ratio) ** 2 - BREAK_BONUS * marks[j[ok] - 1]
            better = c < best
            best, arg = np.where(better, c, best), np.where(better, k, arg)
        cost[s + 1], take[s + 1] = best, arg
    out, at = [], w
    for s in range(n, 0, -1):
        out.append((at - take[s, at], at))
        at -= take[s, at]
    return out[::-1]


def _aligned_phones(decoder, pcm: np.ndarray, text: str) -> list[tuple[str, int, int, int]] | None:
    """(phone, first frame, end frame, score) of each phone of the text in a piece of audio, or None."""
    try:
        decoder.set_align_text(text)
        decoder.start_utt()
        decoder.process_raw(pcm.tobytes(), full_utt=True)
        decoder.end_utt()
        if decoder.hyp() is None:
            return None
        decoder.set_alignment()
        decoder.start_utt()
        decoder.process_raw(pcm.tobytes(), full_utt=True)
        decoder.end_utt()  # (raises when the phones cannot be placed in the words' frames)
    except RuntimeError:
        return None
    alignment = decoder.get_alignment()  # (kept referenced while its phones are read: the binding needs it)
    return [("SIL" if p.name.startswith(("SIL", "+")) else p.name, p.start, p.start + p.duration, p.score)
            for p in alignment.phones()]
