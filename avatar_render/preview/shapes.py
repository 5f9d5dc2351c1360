"""How the face mesh moves: the lips and jaw for a mouth shape, the upper eyelids for a blink.

A mouth shape is ``(open, width)``: ``open`` is -1 for lips pressed shut, 0 for the reference's own
mouth, and up to 1 for the jaw dropped by ``JAW_DROP`` mouth widths; ``width`` is -1 for rounded lips
(oo), 0 neutral, 1 spread (ee). Displacements are linear in the amounts, so the moved mesh of any
shape is exact and cheap; only the image warp is precomputed (``rig.Bank``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from avatar_render.face import mesh as fm

JAW_DROP = 0.17  # lower lip travel at open = 1, in mouth widths (a loud open vowel)
# A reference with its lips closed parts them this much more (mouth widths) as soon as it speaks: a mouth that
# shows teeth at rest has them in view at any opening, a closed one showed nothing for its first few pixels.
PART = 0.06
PART_KNEE = 0.15  # the parting is complete from this opening on (a level of the rig's warp bank: exact there)
# Rounded lips close in around a smaller opening: at width -1 they take back this share of the parting (an "oo"
# is a small hole, not the open mouth of an "a" in the dark). Linear in the width: the bank's blend stays exact.
ROUND_PART = 0.7
# ... and meet towards the corners, from the first to the second distance from the middle (mouth widths): an "oo" is
# a round hole, not a slit as wide as the mouth
ROUND_HOLE = (0.2, 0.42)
ROUND_REST_HOLE = 0.08  # the most a rounded mouth that shows no teeth of its own leaves of its rest gap (mouth widths)
LIP_RAISE = 0.10  # upper lip travel up, as a fraction of the jaw's
SEAL_UPPER = 0.25  # share of the lip gap the upper lip closes when the lips press together
SPREAD = 0.12  # mouth widening at width = 1, as a fraction of the width
ROUND = 0.28  # mouth narrowing at width = -1
LIP_SKIN = 0.22  # how far (in mouth widths) the skin around the lips follows their width changes
LID_SKIN = 0.9  # how far the skin just above the lashes comes down with them, as a fraction of the lid's travel
LID_FOLD = (0.12, 0.6)  # over this band above the lid (in eye widths) that travel fades to nothing
LID_TRAVEL = 0.97  # fraction of the eye opening the upper lid covers at a full blink (the lower lid rises to meet it)
LOWER_LID_TRAVEL = 0.05
NOSE_FADE = 0.06  # the lips' width changes carry the skin fully from this far (in mouth widths) beside the nose
_SUBNASALE = 2  # landmark: the skin just under the nose
_NOSE_WINGS = (98, 327)  # landmarks: the outer edges of the nostrils


# (inner upper, inner lower, outer upper, outer lower) landmarks across the lips, corners left out
_LIP_PAIRS = tuple(
    zip(fm.LIPS_INNER_UPPER[1:-1], fm.LIPS_INNER_LOWER[1:-1], fm.LIPS_OUTER_UPPER[1:-1], fm.LIPS_OUTER_LOWER[1:-1])
)


def _smoothstep(x: np.ndarray, a: float, b: float) -> np.ndarray:
    t = np.clip((x - a) / (b - a), 0.0, 1.0)
    return t * t * (3 - 2 * t)


@dataclass(frozen=True, eq=False)
class MouthShape:
    """Displacements of every vertex (the 468 landmarks first, fixed helper vertices after) per unit of each motion."""

    base: np.ndarray  # (N, 2) float32, pixels
    down: np.ndarray  # (2,) the face's downward axis
    jaw: np.ndarray  # (N, 2) at open = 1: jaw drop, upper lip raise, corners drawn in a little
    spread: np.ndarray  # (N, 2) at width = 1
    round: np.ndarray  # (N, 2) at width = -1
    held: np.ndarray  # (N, 2) taken off the jaw's travel per unit of opening at width = -1 (the corners' lower lip)
    lower_teeth: np.ndarray  # (2,) travel of the lower teeth at open = 1 (with the jaw)
    upper_teeth: np.ndarray  # (2,) travel of the upper teeth at open = 1 (with the upper lip)
    width_px: float  # mouth width, pixels
    rest_gap_px: float  # the reference's lip gap
    part: float = 0.0  # the jaw's extra travel as soon as the mouth opens, in units of ``open`` (see PART)

    @staticmethod
    def build(mesh: fm.FaceMesh, vertices: np.ndarray, *, closed: bool = False) -> "MouthShape":
        """closed: the reference shows no teeth, its lips part by ``PART`` more as soon as they open, and rounded
        they close in to ``ROUND_REST_HOLE`` in the middle."""
        p = mesh.points
        n = len(vertices)
        ex, ey = mesh.axes()
        width = max(mesh.mouth_width(), 1.0)
        centre = (p[61] + p[291]) / 2
        u = ((p - centre) @ ex) / width  # (468,) across the face, in mouth widths
        v = ((p - centre) @ ey) / width  # down the face

        upper_lip = list(fm.LIPS_OUTER_UPPER[1:-1] + fm.LIPS_INNER_UPPER[1:-1])
        lower_lip = list(fm.LIPS_OUTER_LOWER[1:-1] + fm.LIPS_INNER_LOWER[1:-1])
        corners = [61, 291, 78, 308]
        lips = upper_lip + lower_lip + corners

        # Jaw: the chin and lower face move with it, less towards the hinge by the ears.
        jaw_w = _smoothstep(v, 0.05, 0.55) * np.clip(1 - (np.abs(u) - 0.5) / 1.2, 0.15, 1.0)
        jaw_w[upper_lip] = 0.0
        # The lower lip hangs from the corners: full travel in the middle, less towards them.
        jaw_w[lower_lip] = 0.08 + 0.92 * np.clip(1 - (2 * u[lower_lip]) ** 2, 0, 1) ** 1.2
        jaw_w[corners] = 0.08  # the corners hardly part: the opening is a lens, not a slot
        # Upper lip raise: the lip and a little of the skin above it.
        up_w = np.exp(-np.maximum(-v - 0.15, 0) / 0.15) * (v < 0.05) * (np.abs(u) < 0.75)
        up_w[upper_lip] = 0.1 + 0.9 * np.clip(1 - (2 * u[upper_lip]) ** 2, 0, 1) ** 1.2
        up_w[corners] = 0.1
        up_w[lower_lip] = 0.0
        # Lip width changes carry the skin around the lips along, fading over LIP_SKIN mouth widths.
        dist = np.min(np.linalg.norm(p[:, None] - p[lips][None], axis=2), axis=1) / width
        lip_w = 0.7 * np.exp(-((dist / LIP_SKIN) ** 2))
        # ... but not onto the nose, which is not skin over muscle: rounded lips narrowed it (its wings drawn
        # in by a pixel each at 512 px). Its lower part: between its wings, above the skin under it.
        sub = p[_SUBNASALE]
        wings = 0.5 * abs(float((p[_NOSE_WINGS[1]] - p[_NOSE_WINGS[0]]) @ ex))
        beyond = np.maximum(np.abs((p - sub) @ ex) - wings, (p - sub) @ ey) / (NOSE_FADE * width)
        lip_w *= _smoothstep(beyond, 0.0, 1.0)
        lip_w[lips] = 1.0

        def full(a: np.ndarray) -> np.ndarray:
            out = np.zeros((n, 2), np.float32)
            out[: len(a)] = a
            return out

        d = JAW_DROP * width
        jaw = (jaw_w * d)[:, None] * ey - (up_w * LIP_RAISE * d)[:, None] * ey
        jaw -= (0.05 * u * lip_w * width)[:, None] * ex  # opening wide draws the corners in a little
        spread = (SPREAD * u * lip_w * width)[:, None] * ex - (0.04 * np.abs(u) * lip_w * width)[:, None] * ey
        rnd = -(ROUND * u * lip_w * width)[:, None] * ex
        # Rounded lips push out: the outer contours part a little, the opening rounds.
        bulge = 0.035 * width * (1 - np.clip(np.abs(2 * u), 0, 1))
        # (The inner upper lip stays: above it there are no teeth of the reference's to show.)
        for idx, sign in ((fm.LIPS_OUTER_UPPER, -1), (fm.LIPS_OUTER_LOWER, 1), (fm.LIPS_INNER_LOWER, 0.6)):
            rnd[list(idx)] += (sign * bulge[list(idx)])[:, None] * ey
        # Towards the corners they meet: across the gap they leave at rest, and the lower lip holds there against
        # the jaw's drop (in proportion to the opening: bilinear in opening and width, so the bank's blend is exact).
        # A mouth open at rest with no teeth in view (its generated teeth are covered by rounded lips) also closes
        # in the middle, to ROUND_REST_HOLE: its "oo" was the whole dark opening of the photo.
        meet = _smoothstep(np.abs(u), *ROUND_HOLE)
        hole = ROUND_REST_HOLE * width if closed else np.inf
        for iu, il, _, _ in _LIP_PAIRS:
            gap = max(float((p[il] - p[iu] + rnd[il] - rnd[iu]) @ ey), 0.0)
            shut = gap - (1 - meet[iu]) * min(gap, hole)
            rnd[iu] += SEAL_UPPER * shut * ey
            rnd[il] -= (1 - SEAL_UPPER) * shut * ey
        held = np.zeros(len(p))
        held[lower_lip] = meet[lower_lip] * jaw_w[lower_lip] * d

        return MouthShape(
            base=vertices.astype(np.float32),
            down=ey.astype(np.float32),
            jaw=full(jaw),
            spread=full(spread),
            round=full(rnd),
            held=full(held[:, None] * ey),
            lower_teeth=(d * ey).astype(np.float32),
            upper_teeth=(-LIP_RAISE * d * ey).astype(np.float32),
            width_px=width,
            rest_gap_px=mesh.lip_gap(),
            part=PART / JAW_DROP if closed else 0.0,
        )

    def jaw_amount(self, open_: float, width: float = 0.0) -> float:
        """How far the jaw drops (in units of JAW_DROP mouth widths) at an opening ``open_`` >= 0: piecewise
        linear, steeper up to PART_KNEE by the parting, which rounded lips (``width`` < 0) take back."""
        return open_ + self.part * min(open_ / PART_KNEE, 1.0) * (1.0 - ROUND_PART * min(max(-width, 0.0), 1.0))

    def displacement(self, open_: float, width: float) -> np.ndarray:
        """(N, 2) vertex displacements of a mouth shape."""
        out = self.spread * width if width > 0 else self.round * -width
        if open_ >= 0:
            held = self.held * (open_ * -width) if width < 0 else 0.0
            return out + self.jaw * self.jaw_amount(open_, width) - held
        # Lips pressed shut (open < 0: this far): the jaw brings the lower lip up most of the way and the
        # upper lip comes down to meet it, across the gap the lips have in this width (rounded lips part
        # a little); each lip moves whole (stretching a lip over the teeth it showed reads as lips apart).
        out = out.copy()
        for iu, il, ou, ol in _LIP_PAIRS:
            gap = float((self.base[il] + out[il] - self.base[iu] - out[iu]) @ self.down)
            if gap > 0:
                up, low = -open_ * SEAL_UPPER * gap * self.down, open_ * (1 - SEAL_UPPER) * gap * self.down
                out[iu] += up
                out[ou] += up
                out[il] += low
                out[ol] += low
        return out

    def moved(self, open_: float, width: float) -> np.ndarray:
        return self.base + self.displacement(open_, width)

    def teeth(self, open_: float, width: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Travel of the upper and lower teeth (each (2,)): they move with the upper lip and the jaw, never
        with the lips pressing together (the lips close over them)."""
        o = self.jaw_amount(max(open_, 0.0), width)
        return self.upper_teeth * o, self.lower_teeth * o


@dataclass(frozen=True, eq=False)
class EyeShape:
    base: np.ndarray  # (N, 2)
    blink: np.ndarray  # (N, 2) displacements at a full blink

    @staticmethod
    def build(mesh: fm.FaceMesh, vertices: np.ndarray) -> "EyeShape":
        p = mesh.points
        ex, ey = mesh.axes()
        out = np.zeros((len(vertices), 2), np.float32)
        lids = set()
        for upper, lower in fm.EYES:
            lids.update(upper + lower)
            width = float(np.linalg.norm(p[upper[-1]] - p[upper[0]]))
            drops = []
            for k in range(1, len(upper) - 1):
                gap = p[lower[k]] - p[upper[k]]
                out[upper[k]] = LID_TRAVEL * gap
                out[lower[k]] = -LOWER_LID_TRAVEL * gap
                drops.append(float(gap @ ey))
            # The lid unfolds from under the brow: the skin just above the lashes comes down with them nearly
            # rigidly (stretching the lashes themselves smears them), and the stretch is taken up higher,
            # towards the brow, where the skin is smooth; the brow itself stays.
            lid = p[list(upper)]
            lid_s = lid @ ex
            travel = LID_TRAVEL * np.array([0.0, *drops, 0.0])  # how far the lid comes down, along it
            for i in range(len(p)):
                if i in lids:
                    continue
                s, t = float(p[i] @ ex), float(p[i] @ ey)
                if not lid_s.min() <= s <= lid_s.max():
                    continue
                above = (float(np.interp(s, lid_s, lid @ ey)) - t) / max(width, 1e-6)
                if 0 < above < LID_FOLD[1]:
                    fold = 1 - float(_smoothstep(np.array(above), *LID_FOLD))
                    out[i] += (LID_SKIN * fold * float(np.interp(s, lid_s, travel))) * ey
        return EyeShape(base=vertices.astype(np.float32), blink=out)

    def moved(self, amount: float) -> np.ndarray:
        return self.base + self.blink * amount
