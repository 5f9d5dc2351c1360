"""Phones -> mouth shapes over time, with co-articulation.

Each phone has a target shape ``(open, width)`` (see ``shapes``) in the manner of the classic
animation mouth sets: closed for m/b/p, lower lip to the teeth for f/v, rounded for oo/w/oh, spread
for ee/i, open for a, slightly open with the teeth together for most consonants, lips together in a pause. Its
pull on the mouth over time is a dominance curve (Cohen and Massaro's model of co-articulation): a
bump centred a little before the sound (the mouth anticipates it), wider ahead than behind, higher for
sounds the lips must make (a closure beats its neighbours; a k or an h takes theirs). The shape at
time t is the dominance-weighted mean of the targets: smooth, with in-between shapes and no
one-frame flicker. Loudness scales the opening later (``motion``).
"""

from __future__ import annotations

import numpy as np

from avatar_render.preview.phones import CLOSURE_S, Phone, in_pieces

LEAD_S = 0.015  # the mouth's shape leads the sound
AHEAD_S = 0.075  # extra reach of a phone's dominance before it (anticipation: 50-100 ms with LEAD_S)
BEHIND_S = 0.04  # and after it
MIN_PHONE_S = 0.02
CLOSURE_REACH = 0.25  # closures pull hard but briefly: their reach is this fraction of the others'
# longest time the lips stay pressed together for one m, b or p (a longer lip phone is shut in pieces of this length)
CLOSURE_HOLD_S = CLOSURE_S

# phone: (open, width, pull on open, pull on width)
_CLASSES: dict[tuple[str, ...], tuple[float, float, float, float]] = {
    ("M", "B", "P"): (-1.0, 0.0, 6.0, 0.4),  # lips closed
    ("F", "V"): (-0.15, 0.1, 2.0, 0.6),  # lower lip to the upper teeth (a smile shows them already: barely moves)
    ("UW", "W"): (0.12, -1.0, 1.0, 4.0),  # rounded, puckered
    ("UH",): (0.25, -0.6, 1.0, 2.0),
    ("OW",): (0.45, -0.8, 1.0, 2.5),
    ("OY",): (0.45, -0.5, 1.0, 1.5),
    ("AO",): (0.7, -0.45, 1.2, 1.5),
    ("R",): (0.2, -0.5, 0.8, 1.5),
    ("ER",): (0.3, -0.4, 0.8, 1.5),
    ("SH", "ZH", "CH", "JH"): (0.1, -0.5, 0.8, 1.5),
    ("IY",): (0.14, 1.0, 1.0, 3.0),  # spread
    ("IH",): (0.25, 0.6, 1.0, 2.0),
    ("EY",): (0.35, 0.6, 1.0, 2.0),
    ("Y",): (0.1, 0.7, 0.8, 2.0),
    ("EH",): (0.5, 0.35, 1.2, 1.0),  # open
    ("AE",): (0.72, 0.4, 1.3, 1.0),
    ("AH",): (0.55, 0.0, 1.2, 0.8),
    ("AA",): (0.9, 0.0, 1.5, 0.8),
    ("AW",): (0.8, -0.2, 1.3, 1.0),
    ("AY",): (0.8, 0.2, 1.3, 1.0),
    ("S", "Z"): (0.08, 0.35, 0.7, 0.8),  # teeth together
    ("T", "D", "N"): (0.14, 0.1, 0.5, 0.3),
    ("TH", "DH"): (0.2, 0.1, 0.6, 0.3),
    ("L",): (0.32, 0.1, 0.6, 0.3),
    ("K", "G", "NG", "HH"): (0.22, 0.0, 0.25, 0.2),  # shaped by their neighbours
    # A pause inside speech pulls the lips together, gently (a stop's closure the recogniser heard as silence,
    # a breath); in long silences ``motion.pause_track`` closes them and later goes back to the reference's.
    ("SIL",): (-1.0, 0.0, 0.4, 0.8),
}
TARGETS = {phone: shape for phones, shape in _CLASSES.items() for phone in phones}
REST = (0.0, 0.0, 0.8, 0.8)  # the reference's own mouth: where nothing is said, or an unknown phone


def mouth_targets(phones: tuple[Phone, ...], times: np.ndarray) -> np.ndarray:
    """(n,) times in seconds (same origin as the phones) -> (n, 2) float32 (open, width) before loudness."""
    num = np.zeros((len(times), 2))
    den = np.full((len(times), 2), 1e-3)
    num += den * REST[:2]  # where nothing is said, rest
    for ph in _pieces(phones):
        if ph.end - ph.start < MIN_PHONE_S:
            continue
        o, w, pull_o, pull_w = TARGETS.get(ph.label, REST)
        half = (ph.end - ph.start) / 2
        closure = _closure(ph.label)
        # (lips shut for an m, b or p are shut over its segment, which a stop's release ends: no lead)
        centre = ph.start + half - (0.0 if closure else LEAD_S)
        reach = CLOSURE_REACH if closure else 1.0
        ahead, behind = 0.5 * half + AHEAD_S * reach, 0.5 * half + BEHIND_S * reach
        near = np.flatnonzero(np.abs(times - centre) < 3 * max(ahead, behind))
        if len(near) == 0:
            continue
        dt = times[near] - centre
        sigma = np.where(dt < 0, ahead, behind)
        # Long sounds hold their shape: the bump is flat over the middle half of the phone.
        bump = np.exp(-((np.maximum(np.abs(dt) - 0.5 * half, 0.0) / sigma) ** 2))
        num[near, 0] += pull_o * bump * o
        num[near, 1] += pull_w * bump * w
        den[near, 0] += pull_o * bump
        den[near, 1] += pull_w * bump
    return (num / den).astype(np.float32)


def _closure(label: str) -> bool:
    return TARGETS.get(label, REST)[0] < -0.3 and label != "SIL"  # (a pause holds its shape for as long as it lasts)


def _pieces(phones: tuple[Phone, ...]) -> list[Phone]:
    """The phones with each lip closure longer than CLOSURE_HOLD_S cut into equal pieces no longer than that: one
    closure's dominance is brief, and a long one (a stop's silent closure, a murmur) is shut all along, up to the
    release that ends it, not only around its middle."""
    return [piece for ph in phones for piece in (in_pieces(ph, CLOSURE_HOLD_S) if _closure(ph.label) else [ph])]
