"""The words spoken, when the user gives them (``preview.transcript``): the phones by forced alignment.

The phone recogniser hears many m/b/p as k/t/g (docs/preview.md); a user who iterates on a script knows its
words. PocketSphinx's English dictionary (it ships in its wheel) gives each word's phones and its aligner
places them: the audio's stretches of speech (between pauses) each take a run of the words (``_share``), and
each stretch is aligned with its words alone (one alignment over a whole file went astray on texts of several
sentences, or failed, and its phone pass held 2.7 GB for five minutes of speech), when the first chunk whose
window reaches it asks (``Script.window``: the set-up aligns the first stretch only, so an hour of audio does
not hold back the first frame). Numbers are written out as words (``spoken``); a word the dictionary lacks
(a name) gets phones guessed from its letters, with one line naming it. Many such words (another language),
words that do not fit the audio (MISMATCH_SCORE), or audio that arrives as a stream: no script, and one line
saying why (the recogniser's phones are used instead).
"""

from __future__ import annotations

import bisect
import re
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np

from avatar_render.errors import AvatarRenderError
from avatar_render.io.audio import AudioReader
from avatar_render.preview.phones import FRAME_S, RATE, Phone, frame_levels, model_dir
from avatar_render.preview.spoken import guess_phones, spoken

PAUSE_S = 0.2  # quiet this long parts two stretches of speech
QUIET_DB = 30.0  # a 10-ms frame this far under the audio's loudest is quiet
EDGE_S = 0.1  # each stretch is aligned with this much of the quiet either side
MAX_WORDS = 80  # words one stretch may take
BREAK_BONUS = 1.0  # a stretch that ends where the text has a mark (, . ! ? ; : or a new line): its cost lowered by this
EMPTY_COST = 2.0  # a stretch that takes no words (a cough, a breath)
RATE_RANGE = (2.5, 30.0)  # phones a second of speech a transcript may make (see/sue slowly: 5; fast speech: 15)
BAND_S = 60.0  # how far (seconds of speech) the words through a stretch may be from where the mean rate puts them
# The aligned phones' mean score a frame (PocketSphinx's log units, 0 for the best state in each frame) under which
# the words are taken for others than those spoken: the recordings of docs/preview.md with their own texts
# score -14 to -35, with another recording's text -54 to -75.
MISMATCH_SCORE = -50.0
# At most this share of the words, or this many, may be missing from the dictionary (names, not a language; a
# short text in another language that gets through is caught by its alignment: MISMATCH_SCORE)
UNKNOWN_SHARE = 0.1
UNKNOWN_WORDS = 2
# The aligner's settings, tried in turn until one aligns a stretch's words: the default beams, then wider ones,
# then pauses allowed between words (fillers).
_TRIES = (
    dict(fsgusefiller=False),
    dict(beam=1e-120, wbeam=1e-100, pbeam=1e-120, fsgusefiller=False),
    dict(beam=1e-120, wbeam=1e-100, pbeam=1e-120, fsgusefiller=True),
)
_FALLBACK = "the mouth follows the phones heard instead"
STREAM_NOTE = "A transcript is aligned with an audio file, not a stream: the mouth follows the phones heard."
NO_SPHINX_NOTE = "A transcript needs PocketSphinx (pip install pocketsphinx): the mouth follows the loudness."


class Script:
    """The phones of the transcript, placed in the audio (seconds from its start), in order: those given, and
    (``aligner``) each later stretch of speech aligned with its words when a window first reaches it."""

    def __init__(self, phones: tuple[Phone, ...] = (), *, aligner: _Aligner | None = None) -> None:
        self._phones: list[Phone] = []
        self._ends: list[float] = []  # each phone's end (for bisecting)
        self._add(phones)
        self._aligner = aligner
        self._lock = threading.Lock()

    @property
    def phones(self) -> tuple[Phone, ...]:
        """The phones placed so far."""
        return tuple(self._phones)

    @property
    def stretches_aligned(self) -> int:
        """How many stretches of speech have been aligned so far."""
        return 0 if self._aligner is None else self._aligner.aligned

    def window(self, start: float, end: float) -> tuple[Phone, ...] | None:
        """The phones over [start, end) seconds, relative to ``start``, clipped to it; gaps between them SIL.
        None when the words stopped fitting the audio before ``end`` (a stretch that did not align)."""
        with self._lock:
            if self._aligner is not None and self._aligner.reach(start, end, self._add) is not None:
                return None
            out: list[Phone] = []
            at = 0.0
            for p in self._phones[bisect.bisect_right(self._ends, start) :]:
                a, b = max(p.start, start) - start, min(p.end, end) - start
                if p.start >= end:
                    break
                if b <= a:
                    continue
                if a > at:
                    out.append(Phone("SIL", at, a))
                out.append(Phone(p.label, a, b))
                at = b
            if at < end - start:
                out.append(Phone("SIL", at, end - start))
            return tuple(out)

    def close(self) -> None:
        """Lets go of the audio file (a script is still read up to where it was aligned)."""
        if self._aligner is not None:
            self._aligner.close()

    def _add(self, phones) -> None:
        self._phones += phones
        self._ends += [p.end for p in phones]


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
    """The text's words as spoken (numbers written out: ``spoken``), lower-case, each with whether a mark that
    may be a pause follows it (, . ! ? ; : or a new line)."""
    out: list[tuple[str, bool]] = []
    for token in re.findall(r"[\w'-]+|[,.!?;:\n]", spoken(text).lower().replace("_", " ")):
        if token in ",.!?;:\n":
            if out:
                out[-1] = (out[-1][0], True)
            continue
        out += [(w, False) for w in (part.strip("'") for part in token.split("-")) if w]
    return out


def align_script(audio: Path, text: str) -> tuple[Script | None, str]:
    """(the script, "" or a line for the user) or (None, the one line that says why there is none). audio: the
    audio file. Words the dictionary lacks get their phones guessed from their letters (``guess_phones``), a
    name or two; more of them (another language: ``_spelled``) and there is no script.

    The audio's stretches of speech (between pauses of PAUSE_S or more) each take a run of the words, those
    whose phones (the dictionary's) fill it at the audio's own rate of phones, preferably ending at a mark
    (``_share``): this reads the file's loudness only. Each stretch is then aligned with its words alone as the
    chunks reach it (``Script.window``); here only the first, whose score tells words that are not those
    spoken (MISMATCH_SCORE)."""
    words = words_of(text)
    spellings, note, usable = _spelled(words)
    if not usable:
        return None, note
    first = _decoder(_TRIES[0], spellings)
    spelled = [first.lookup_word(w) for w, _ in words]
    level = _file_levels(audio)
    stretches = _stretches(level)
    if not stretches:
        return None, _FAILED
    counts = np.array([len(p.split()) for p in spelled], float)
    rate = counts.sum() / (sum(b - a for a, b in stretches) * FRAME_S)  # phones a second of speech
    if not RATE_RANGE[0] <= rate <= RATE_RANGE[1]:
        return None, (f"The transcript has {int(counts.sum())} sounds for {len(stretches)} stretches of speech "
                      f"({rate:.1f} a second; speech has some 5 to 15): it is not the words spoken, or only part of "
                      f"them: {_FALLBACK}.")
    shares = _share(stretches, counts, np.array([b for _, b in words]))
    edge = round(EDGE_S / FRAME_S)
    spans = [(max(0, a - edge), min(len(level), b + edge), " ".join(w for w, _ in words[i:j]))
             for (a, b), (i, j) in zip(stretches, shares) if i < j]
    if not spans:
        return None, _FAILED
    script = Script(aligner=_Aligner(audio, spans, first, spellings))
    if script.window(0.0, spans[0][0] * FRAME_S + FRAME_S) is None:  # (aligns the first stretch)
        script.close()
        return None, _FAILED
    return script, note


def transcript_plan(path: str | Path, *, stream: bool) -> str:
    """What a render will do with a transcript file, for the dry run (the alignment itself is not run)."""
    words = words_of(read_transcript(path))
    if stream:
        note, usable = STREAM_NOTE, False
    elif model_dir() is None:
        note, usable = NO_SPHINX_NOTE, False
    else:
        _, note, usable = _spelled(words)
    clause = note[:1].lower() + note[1:].rstrip(".")
    if not usable:
        return f"{len(words)} words; {clause}"
    said = f"{len(words)} words, aligned with the audio as the render reaches them"
    return f"{said}; {clause}" if note else said


def _spelled(words: list[tuple[str, bool]]) -> tuple[list[tuple[str, str]], str, bool]:
    """(the words' spellings for the aligner, a line for the user or "", whether they can be aligned): the
    dictionary's, and phones guessed from the letters of the few it lacks (``guess_phones``); more of them
    lacking (UNKNOWN_SHARE, UNKNOWN_WORDS: another language) or a word with no letters to guess from: not usable."""
    spellings = _spellings({w for w, _ in words})
    known = {w.split("(", 1)[0] for w, _ in spellings}
    unknown = sorted({w for w, _ in words if w not in known})
    if not unknown:
        return spellings, "", True
    guesses = [(w, guess_phones(w)) for w in unknown]
    shown = ", ".join(f"'{w}'" for w in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
    lacking = f"The transcript has words the English dictionary does not know ({shown})"
    lacked = sum(w not in known for w, _ in words)
    if lacked > max(UNKNOWN_WORDS, UNKNOWN_SHARE * len(words)) or any(p is None for _, p in guesses):
        # (another language, another script)
        return spellings, f"{lacking}: {_FALLBACK}.", False
    return spellings + guesses, f"{lacking}: their sounds are guessed from their letters.", True


def _spellings(words: set[str]) -> list[tuple[str, str]]:
    """(word, phones) of each of ``words`` that PocketSphinx's English dictionary has, its other pronunciations
    ("read(2)") included, in the dictionary's order. The aligner's decoders hold these alone: the whole
    dictionary and the default language model (which alignment does not use) cost some 90 MB a decoder."""
    root = model_dir()
    if root is None:
        raise AvatarRenderError("PocketSphinx is not installed: pip install pocketsphinx.")
    entries = []
    with open(root / "cmudict-en-us.dict", encoding="utf-8") as lines:
        for line in lines:
            word, _, phones = line.partition(" ")
            if word.split("(", 1)[0] in words:
                entries.append((word, phones.strip()))
    return entries


def _decoder(settings: dict, spellings: list[tuple[str, str]]):
    """An aligner with ``settings`` (one of _TRIES) that knows the words ``spellings`` (``_spellings``)."""
    from pocketsphinx import Decoder

    decoder = Decoder(samprate=RATE, bestpath=False, loglevel="FATAL", lm=None, dict=None, **settings)
    for word, phones in spellings:
        decoder.add_word(word, phones, False)
    return decoder


_FAILED = f"The transcript could not be aligned with the audio (other words spoken?): {_FALLBACK}."
_BLOCK = 250  # 25-fps frames of audio read at a time (10 s)


class _Aligner:
    """Aligns the stretches of speech one after another, reading the audio file forward (what is behind the
    stretch aligned is let go of). spans: [first, end) 10-ms frames and the words of each stretch."""

    def __init__(self, audio: Path, spans: list[tuple[int, int, str]], decoder,
                 spellings: list[tuple[str, str]]) -> None:
        self.spans, self._spellings = spans, spellings
        self.done = 0  # stretches aligned or passed over
        self.aligned = 0
        self.lost: float | None = None  # where (seconds) the words stopped fitting the audio
        self._decoders = [decoder]  # the next of _TRIES made only when one is needed
        self._audio = audio
        self._reader: AudioReader | None = None
        self._score, self._frames = 0.0, 0

    def reach(self, start: float, end: float, add) -> float | None:
        """Aligns every stretch that starts before ``end`` seconds, handing their phones to ``add``, but those
        that end before ``start`` (a resumed render's first window: the chunks before it are not made again);
        returns where the words stopped fitting the audio, when that is before ``end``."""
        while self.lost is None and self.done < len(self.spans) and self.spans[self.done][0] * FRAME_S < end:
            first, last, text = self.spans[self.done]
            if last * FRAME_S <= start:  # (each stretch has its own words: no need to align those before)
                self.done += 1
                continue
            got = self._align(first, last, text)
            if got is not None:
                self._score, self._frames = self._score + sum(q[3] for q in got), self._frames + last - first
            if got is None or self._score / self._frames < MISMATCH_SCORE:
                self.lost = first * FRAME_S
                self.close()
                break
            add([Phone(label, (first + x) * FRAME_S, (first + y) * FRAME_S) for label, x, y, _ in got])
            self.done, self.aligned = self.done + 1, self.aligned + 1
        if self.done == len(self.spans):
            self.close()
        return self.lost if self.lost is not None and self.lost < end else None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _align(self, first: int, last: int, text: str) -> list[tuple[str, int, int, int]] | None:
        pcm = (np.clip(self._samples(first * _HOP, last * _HOP), -1.0, 1.0) * 32767).astype(np.int16)
        for t in range(len(_TRIES)):
            if t == len(self._decoders):
                self._decoders.append(_decoder(_TRIES[t], self._spellings))
            if (got := _aligned_phones(self._decoders[t], pcm, text)) is not None:
                return got
        return None

    def _samples(self, a: int, b: int) -> np.ndarray:
        """Samples [a, b) at 16 kHz of the audio (zeros past its end), read as set-up read them."""
        if self._reader is None:
            self._reader = AudioReader(self._audio, fps=_FPS, model_rate=RATE, lookahead_s=0.0)
        per = RATE // _FPS.numerator  # samples a 25-fps frame
        f0, f1 = a // per, -(-b // per)
        self._reader.release(f0)
        return self._reader.model_audio(f0, f1)[a - f0 * per : b - f0 * per]


def _file_levels(audio: Path) -> np.ndarray:
    """(n,) dB of the audio file's 10-ms frames, read _BLOCK frames at a time (n: 4 a 25-fps frame, the last
    one's missing samples zeros)."""
    out = []
    with AudioReader(audio, fps=_FPS, model_rate=RATE, lookahead_s=0.0) as reader:
        at = 0
        while (upto := reader.probe(at + _BLOCK)) > at:
            out.append(frame_levels(reader.model_audio(at, upto)))
            reader.release(upto)
            at = upto
    return np.concatenate(out) if out else np.zeros(0)


_FPS = Fraction(25)


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
    after the run's last word lowering the cost by BREAK_BONUS; a stretch may take none (EMPTY_COST).

    The words through each stretch are looked for only within BAND_S of speech of where the mean rate puts
    them (an hour's stretches and words otherwise make a table of 15 million costs, 20 s to fill)."""
    n, w = len(stretches), len(counts)
    seconds = np.array([(b - a) * FRAME_S for a, b in stretches])
    rate = counts.sum() / seconds.sum()  # phones a second
    cum = np.concatenate([[0.0], np.cumsum(counts)])
    expected = np.concatenate([[0.0], np.cumsum(seconds)]) * rate  # phones through each stretch at the mean rate
    k = np.arange(min(MAX_WORDS, w) + 1)[:, None]  # words taken (0: none)
    cost, lo = np.zeros(1), 0  # the costs of taking words [0, j) through the stretches so far, for j in [lo, ...)
    takes: list[tuple[int, np.ndarray]] = []  # each stretch's band start and words taken for each j in it
    for s in range(n):
        last = s == n - 1
        first = 0 if last and w == 0 else int(np.searchsorted(cum, expected[s + 1] - BAND_S * rate))
        end = w + 1 if last else int(np.searchsorted(cum, expected[s + 1] + BAND_S * rate, side="right"))
        j = np.arange(first, end)[None, :]
        i = j - k  # (K, J)
        at = i - lo
        ok = (at >= 0) & (at < len(cost))
        c = np.full(i.shape, np.inf)
        c[0, ok[0]] = cost[at[0, ok[0]]] + EMPTY_COST
        ok[0] = False
        ratio = (cum[np.broadcast_to(j, i.shape)[ok]] - cum[i[ok]]) / rate / seconds[s]
        c[ok] = cost[at[ok]] + np.log(ratio) ** 2 - BREAK_BONUS * marks[np.broadcast_to(j, i.shape)[ok] - 1]
        arg = np.argmin(c, axis=0)  # (the fewest words among equal costs)
        cost, lo = c[arg, np.arange(c.shape[1])], first
        takes.append((first, arg.astype(np.int16)))
    out, at = [], w
    for first, arg in reversed(takes):
        taken = int(arg[at - first]) if 0 <= at - first < len(arg) else 0
        out.append((at - taken, at))
        at -= taken
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
