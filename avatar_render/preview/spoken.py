"""A transcript as it is spoken, for the English dictionary the aligner knows (``preview/script.py``).

Real scripts carry numbers ("platform 4 at 10:30", "in 1984", "the 3rd", "5 %", "$20") and names the
dictionary lacks, or come as subtitles; each made the whole transcript fall back to the phone recogniser.
Subtitles are read for their words (``captions``), numbers and a few signs are written out as words
(num2words), and a word the dictionary does not know gets its phones guessed from its letters
(``guess_phones``): rough, but a name's m, b and p still close the lips, and the words around it keep their
own phones.
"""

from __future__ import annotations

import re
import unicodedata

from num2words import num2words

# Digits of the longest number said as one, written plain and with thousands' commas: longer ones (a phone
# number, an id) are read a digit at a time
LONGEST_PLAIN, LONGEST_GROUPED = 9, 15
_CURRENCY = {"$": ("dollar", "dollars"), "€": ("euro", "euros"), "£": ("pound", "pounds")}
_SIGNS = {"&": "and", "+": "plus", "=": "equals", "@": "at", "°": "degrees", "%": "percent"}
# (a cue's start, as the formats write it and as hand-made files do: no milliseconds, or fewer digits)
_CUE_TIMING = re.compile(r"^\s*(\d+:)*\d+([.,]\d+)?\s*-->.*$", re.MULTILINE)
_TAG = re.compile(r"<[^>]*>|\{[^}]*\}")  # <i>, <c.yellow>, <v Speaker>, {\an8}
_TIME = re.compile(r"\b(\d{1,2}):(\d{2})\b")
_NUMBER = re.compile(r"([$€£])?\s?(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(\.\d+)?(st\b|nd\b|rd\b|th\b)?", re.IGNORECASE)


def spoken(text: str) -> str:
    """``text`` (or a subtitle file's: ``captions``) with its times, numbers (ordinals, years, decimals, amounts)
    and signs written out in words."""
    text = _TIME.sub(_time, captions(text))
    text = _NUMBER.sub(_number, text)
    for sign, word in _SIGNS.items():
        text = text.replace(sign, f" {word} ")
    return text


def captions(text: str) -> str:
    """The words of subtitles (SubRip .srt, WebVTT .vtt): cue numbers, timings, headers and tags left out, each
    cue's end a new line (a mark that may be a pause); any other text as it is."""
    if not _CUE_TIMING.search(text):
        return text
    lines = [line.strip() for line in text.splitlines()]
    out = []
    for line, after in zip(lines, lines[1:] + [""]):
        header = line.startswith(("WEBVTT", "NOTE", "STYLE", "REGION", "Kind:", "Language:"))
        cue = _CUE_TIMING.match(line) or _CUE_TIMING.match(after)  # (a timing, or the cue's name above it)
        out.append("" if header or cue else _TAG.sub("", line))
    return "\n".join(out)


def _words(n: float, **how) -> str:
    return " " + num2words(n, lang="en", **how).replace(",", "").replace("-", " ") + " "


def _time(m: re.Match) -> str:
    hours, minutes = int(m.group(1)), int(m.group(2))
    if minutes == 0:
        return _words(hours) + "o'clock "
    return _words(hours) + ("oh " if minutes < 10 else "") + _words(minutes)


def _digits(digits: str) -> str:
    return " " + " ".join(num2words(int(d), lang="en") for d in digits) + " "


def _number(m: re.Match) -> str:
    currency, digits, decimals, ordinal = m.groups()
    plain = digits.replace(",", "")
    if len(plain) > (LONGEST_GROUPED if "," in digits else LONGEST_PLAIN):
        return _digits(plain) + (_digits(decimals[1:]) if decimals else "")
    value = int(plain)
    if ordinal:
        said = _words(value, to="ordinal")
    elif decimals:
        said = _words(value) + "point" + _digits(decimals[1:])
    elif currency is None and "," not in digits and len(digits) == 4 and 1100 <= value <= 2099:
        said = _words(value, to="year")
    else:
        said = _words(value)
    if currency:
        one, many = _CURRENCY[currency]
        said += (one if value == 1 and not decimals else many) + " "
    return said


# Letters to phones (PocketSphinx's ARPAbet), longest first; a guess for a name, not a pronunciation dictionary.
_GROUPS = (
    ("ough", "AO"), ("tch", "CH"), ("igh", "AY"), ("ch", "CH"), ("sh", "SH"), ("th", "TH"), ("ph", "F"),
    ("wh", "W"), ("ck", "K"), ("ng", "NG"), ("qu", "K W"), ("kn", "N"), ("wr", "R"), ("gh", "G"),
    ("ee", "IY"), ("ea", "IY"), ("oo", "UW"), ("ou", "AW"), ("ow", "OW"), ("ai", "EY"), ("ay", "EY"),
    ("oi", "OY"), ("oy", "OY"), ("au", "AO"), ("aw", "AO"), ("ie", "IY"), ("ei", "EY"), ("ue", "UW"),
    ("er", "ER"), ("ir", "ER"), ("ur", "ER"), ("ar", "AA R"), ("or", "AO R"), ("x", "K S"),
)
_LETTERS = dict(zip("abcdefghijklmnopqrstuvwyz", (
    "AE B K D EH F G HH IH JH K L M N AA P K R S T AH V W IY Z".split())))
_VOWELS = set("aeiouy")


def guess_phones(word: str) -> str | None:
    """ARPAbet phones guessed from a word's letters ("zoe" -> "Z AA EH"), or None if it has letters other than
    a-z once accents are dropped (another script: nothing to guess from)."""
    letters = "".join(c for c in unicodedata.normalize("NFKD", word.lower()) if not unicodedata.combining(c))
    letters = letters.replace("'", "")
    if not letters or not letters.isascii() or not letters.isalpha():
        return None
    if len(letters) > 2 and letters.endswith("e") and letters[-2] not in _VOWELS:
        letters = letters[:-1]  # (a silent final e)
    phones: list[str] = []
    i = 0
    while i < len(letters):
        group = next((g for g in _GROUPS if letters.startswith(g[0], i)), None)
        if group is not None:
            phones += group[1].split()
            i += len(group[0])
            continue
        c, after = letters[i], letters[i + 1 : i + 2]
        if i > 0 and c == letters[i - 1] and c not in _VOWELS:
            i += 1  # (a doubled consonant is one sound)
            continue
        if c == "c" and after in ("e", "i", "y"):
            phones.append("S")
        elif c == "g" and after in ("e", "i", "y"):
            phones.append("JH")
        elif c == "y" and i == 0:
            phones.append("Y")
        else:
            phones += _LETTERS[c].split()
        i += 1
    return " ".join(phones)
