"""A mouth interior for a reference that shows none (closed lips): teeth, tongue and the mouth's dark,
generated once from the person's own face and painted inside the opened lips on every frame.

Made once (``build_interior``): rows of upper and lower teeth as textures over the mouth's width (teeth
of human proportions on an arch: narrower and darker towards the corners, where they turn away; the
gaps between them dark lines), coloured from the face (an off-white from the skin's tint, a cavity and
tongue from the lips' colour), and the photo's own blur and grain, measured on the face, so the mouth
is not sharper or cleaner than the picture around it.

Painted per frame (``paint``), in face coordinates (s along the mouth from its centre, t down the face;
pixels): the upper teeth hang from the reference's lip line (fixed to the skull: a raised upper lip shows
more of them), the lower teeth and the tongue ride on the jaw, all under the shadow of the lips' inner
edges; rounded lips close over the teeth (an "oo" shows hardly any of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from avatar_render.face import mesh as fm
from avatar_render.preview.warp import Rect

LUMA = np.array([0.299, 0.587, 0.114], np.float32)
# Teeth widths along the arch from the middle outwards (central incisor, lateral, canine, premolars), in
# mouth widths (a resting mouth is about 40 mm from corner to corner where the canines sit under its corners).
UPPER_TEETH = (8.5 / 40, 6.5 / 40, 7.5 / 40, 7.0 / 40, 6.5 / 40)
LOWER_TEETH = (5.5 / 40, 6.0 / 40, 7.0 / 40, 7.0 / 40, 7.0 / 40)
UPPER_SHOW = (0.075, 0.068, 0.07, 0.055, 0.05)  # how far each upper tooth reaches below the lip line, mouth widths
LOWER_SHOW = 0.022  # how far the lower incisors rise above the lower lip's line with the jaw, mouth widths
TONGUE_RISE = 0.02  # the tongue's back above the lower teeth's edge, mouth widths
ARCH = 0.5  # radius of the dental arch, mouth widths
# Lips rounded (0..1) less than the first leave the teeth as they are (an "aw", an "oy", the lips of an "r"); from
# there to the second the lips close over them (an "oh" shows their edges, an "oo" hardly any)
ROUND_COVER = (0.6, 1.0)
# Shade in a mouth is lit by what the lips, gums and tongue reflect: a darkened tooth or lining takes this much of
# the lips' hue for each unit of light it lost (its grey level kept; greys beside a warm face read green).
WARM_SHADE = 0.7
MAX_TURN = np.radians(40.0)  # the most the mouth's turn (yaw) is read as, from its midline's offset
MIDLINE = (0, 13, 14, 17)  # the lips' middle points, outer and inner
_PAD = 0.08  # texture rows above the lip line (behind a raised upper lip), mouth widths


@dataclass(frozen=True, eq=False)
class MouthInterior:
    """Textures over columns s0, s0 + 1, ... (pixels along the mouth from its centre) and rows of depth: for the
    upper teeth from ``pad`` pixels above the lip line down, for the lower ones from ``pad`` above their edge."""

    upper: np.ndarray  # (h, w, 4) float32: RGB and coverage
    lower: np.ndarray  # (h, w, 4) float32
    s0: float
    pad: float
    lower_top: np.ndarray  # (w,) float32 the lower teeth's edge above the lower lip's line at rest, pixels
    midline: float  # s of the lips' midline (where the incisors meet), pixels: off 0 on a turned face
    warm: np.ndarray  # (3,) float32 the hue shade takes in the mouth, RGB over its grey level (grey level 1)
    cavity: np.ndarray  # (3,) float32 RGB
    tongue: np.ndarray  # (3,) float32 RGB
    blur: float  # Gaussian sigma, pixels, that makes the painted interior as soft as the photo
    noise: np.ndarray  # (h, w, 3) float32 grain over ``noise_rect`` (reference pixels), the photo's
    noise_rect: Rect
    width: float  # mouth width, pixels


def build_interior(image: np.ndarray, mesh: fm.FaceMesh, rect: Rect, *, skin: np.ndarray,
                   colour: float = 1.0) -> MouthInterior:
    """colour: how far the photo has colours at all (``colour_spread``)."""
    width = max(mesh.mouth_width(), 1.0)
    lips = lip_colour(image, mesh, fallback=skin)
    sigma, grain = photo_softness(image, mesh)
    skin_luma = float(skin @ LUMA)
    # Teeth: an off-white brighter than the skin, tinted like the skin (a grey photo gives grey teeth)
    tint = skin / max(skin_luma, 1.0)
    ivory = np.array([1.0, 0.97, 0.86], np.float32) ** min(saturation(skin), colour)
    tint = 0.75 * ivory / float(ivory @ LUMA) + 0.25 * tint
    # (and clearly brighter than the lips: pale lips on a pale face are nearly as light as teeth)
    teeth = tint * min(240.0, max(1.4 * skin_luma + 20.0, float(lips @ LUMA) + 95.0))
    # The lips' hue for shade, as far as the photo has colours (a toned photo's tint where it has none).
    warm = colour * lips / max(float(lips @ LUMA), 1.0) + (1 - colour) * tint / float(tint @ LUMA)
    pad = _PAD * width
    half = int(np.ceil(0.62 * width))
    s = np.arange(-half, half + 1, dtype=np.float32)
    arch = _Arch.of(mesh, width)
    rows_up = int(np.ceil(pad + max(UPPER_SHOW) * width + 3))
    rows_low = int(np.ceil(pad + 0.2 * width))
    upper = _row(s, np.arange(rows_up, dtype=np.float32) - pad, arch, UPPER_TEETH, teeth, warm, upper=True)
    lower = _row(s, np.arange(rows_low, dtype=np.float32) - pad, arch, LOWER_TEETH, teeth, warm, upper=False)
    rng = np.random.default_rng(0)  # the same grain on every render of this reference
    noise = rng.standard_normal((rect.h, rect.w, 1)).astype(np.float32) * grain
    tinted = 0.35 * grain * min(max(saturation(skin), saturation(lips)), colour)  # (a grey photo's grain is grey)
    noise = noise + tinted * rng.standard_normal((rect.h, rect.w, 3)).astype(np.float32)
    return MouthInterior(
        upper=upper,
        lower=lower,
        s0=float(s[0]),
        pad=pad,
        lower_top=(LOWER_SHOW * width * arch.fall(s)).astype(np.float32),
        midline=arch.midline,
        warm=warm.astype(np.float32),
        cavity=(lips * np.float32(0.38)).astype(np.float32),
        tongue=(lips * np.float32(0.8) * np.array([1.0, 0.8, 0.8], np.float32) ** min(saturation(lips), colour)
                ).astype(np.float32),
        blur=float(np.sqrt(max(sigma * sigma - 0.6 * 0.6, 0.0))),  # the textures' own softness taken off
        noise=noise,
        noise_rect=rect,
        width=width,
    )


def colour_spread(image: np.ndarray) -> float:
    """How far a photo has colours at all, 0-1: 0 for a black-and-white or a toned one (sepia, cyanotype: at each
    brightness a single tint), 1 for a colour photo. The median, over 16 bands of brightness, of how far the
    pixels' chroma (Cr + Cb, 8-bit) lies from their band's own: 0-1 on such photos, 4.5-18 on the colour photos
    measured (docs/preview.md); 2 and under reads 0, 4 and over 1. image: (H, W, 3) uint8 RGB."""
    small = cv2.resize(image, (256, max(1, round(256 * image.shape[0] / image.shape[1]))), interpolation=cv2.INTER_AREA)
    ycc = cv2.cvtColor(small, cv2.COLOR_RGB2YCrCb).reshape(-1, 3).astype(np.float32)
    band = np.minimum(ycc[:, 0] // 16, 15)
    spreads = []
    for b in range(16):
        chroma = ycc[band == b, 1:]
        if len(chroma) >= 50:
            spreads.append(float(np.median(np.abs(chroma - np.median(chroma, axis=0)).sum(axis=1))))
    return float(np.clip((np.median(spreads) - 2.0) / 2.0, 0, 1)) if spreads else 1.0


def saturation(rgb: np.ndarray) -> float:
    """0 for a grey, 1 for a colour as saturated as a ruddy skin or more."""
    return float(np.clip((rgb.max() - rgb.min()) / max(float(rgb.max()), 1.0) / 0.25, 0, 1))


@dataclass(frozen=True)
class _Arch:
    """The dental arch as the photo sees it: a half circle of radius ARCH front mouth widths behind the lips, its
    ends at the mouth's corners, turned by ``turn`` (radians, yaw) so that its middle, where the incisors meet,
    lies at ``midline`` (pixels along the mouth from the corners' middle; the lips' own midline)."""

    width: float  # the mouth's width in the photo, pixels
    turn: float
    midline: float

    @classmethod
    def of(cls, mesh: fm.FaceMesh, width: float) -> _Arch:
        ex, _ = mesh.axes()
        c = (mesh.points[61] + mesh.points[291]) / 2
        mid = float(np.mean((mesh.at(MIDLINE) - c) @ ex))
        # Turned by psi, the corners show at +-R cos(psi) and the middle at R sin(psi): tan(psi) = mid / (width / 2)
        turn = float(np.clip(np.arctan2(mid, 0.5 * width), -MAX_TURN, MAX_TURN))
        return cls(width=width, turn=turn, midline=0.5 * width * float(np.tan(turn)))

    @property
    def front(self) -> float:
        """The mouth's width seen from the front, pixels."""
        return self.width / float(np.cos(self.turn))

    def angles(self, s: np.ndarray, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(angle to the camera, angle from the arch's middle), radians, of the columns s on an arch ``scale`` times
        as large: the first is how far the surface there faces away, the second which tooth it is."""
        seen = np.arcsin(np.clip(s / (ARCH * scale * self.front), -0.999, 0.999))
        return seen, seen - self.turn

    def fall(self, s: np.ndarray) -> np.ndarray:
        """1 in the middle of the arch, falling to 0 where it turns away at the mouth's corners."""
        u = np.sin(np.minimum(np.abs(self.angles(s)[1]), np.pi / 2))
        return np.sqrt(np.clip(1 - u**4, 0, 1))


def _shaded(colour: np.ndarray, light: np.ndarray, warm: np.ndarray) -> np.ndarray:
    """colour (..., 3) RGB lit by ``light`` (..., 0..1): darker, and as much warmer as it lost light (``warm``: the
    hue it takes, grey level 1), its grey level kept."""
    out = colour * light[..., None]
    return out + (WARM_SHADE * (1 - light))[..., None] * ((out @ LUMA)[..., None] * warm - out)


def _row(s: np.ndarray, depth: np.ndarray, arch: _Arch, sizes, colour: np.ndarray, warm: np.ndarray, *,
         upper: bool) -> np.ndarray:
    """One row of teeth as RGBA: columns along the mouth (s, pixels), rows of depth (pixels): below the lip line
    for the upper row, below the teeth's edge for the lower."""
    width = arch.front
    seen, theta = arch.angles(s, 1.0 if upper else 0.92)  # columns near the sides see the teeth edge-on
    arc = np.abs(theta) * ARCH * (1.0 if upper else 0.92)  # front mouth widths along the arch from its middle
    edges = np.concatenate([[0.0], np.cumsum(sizes)])
    k = np.clip(np.searchsorted(edges, arc, side="right") - 1, 0, len(sizes) - 1)
    f = np.clip((arc - edges[k]) / np.asarray(sizes)[k], 0, 1)  # 0..1 across each tooth
    # The gaps between teeth: dark lines about a pixel wide on screen (an arc's length shows as length * cos seen).
    dist = np.minimum(f, 1 - f) * np.asarray(sizes)[k] * width * np.cos(seen)
    gap = np.exp(-((dist / 0.6) ** 2))
    # Each tooth is convex: lit in its middle, darker at its sides; the arch darkens as it turns from the camera.
    away = np.abs(seen) / (np.pi / 2)
    side = np.minimum(np.abs(theta) / (np.pi / 2), 1.0)  # how far back along the arch (the teeth shorten)
    shade = (1 - 0.15 * (2 * f - 1) ** 2) * (1 - 0.5 * away**1.5) * (1 - 0.25 * gap)
    rng = np.random.default_rng(1 if upper else 2)
    shade *= (1 + 0.04 * rng.standard_normal(len(sizes)))[k]  # no two teeth quite alike
    if upper:
        reach = np.asarray(UPPER_SHOW)[k] * width * (1 - 0.25 * (2 * f - 1) ** 4) * (1 - 0.5 * side**2)
        reach = np.where(k == 2, reach * (1 + 0.08 * (1 - np.abs(2 * f - 1))), reach)  # the canine's point
        cover = np.clip(reach[None] - depth[:, None] + 0.5, 0, 1)
        along = depth[:, None] / np.maximum(reach[None], 1.0)
        # The incisal edge is translucent: darker and greyer in its last fifth.
        light = 1 - 0.15 * np.clip((along - 0.8) / 0.2, 0, 1)
    else:
        top = 0.008 * width * (1 - (2 * f - 1) ** 2)  # rounded tops
        cover = np.clip(depth[:, None] + top[None] + 0.5, 0, 1)
        # lower down, deeper in the lip's shadow; the whole row in the upper teeth's and the lips' shade
        light = 0.8 * (1 - 0.25 * np.clip(depth[:, None] / (0.06 * width), 0, 1))
    rgba = np.empty((len(depth), len(s), 4), np.float32)
    rgba[..., :3] = _shaded(colour[None, None], np.clip(shade[None] * light, 0, 1), warm)
    rgba[..., 3] = cover
    return rgba


def lip_colour(image: np.ndarray, mesh: fm.FaceMesh, *, fallback: np.ndarray) -> np.ndarray:
    """Median RGB of the lips (between their outer and inner contours)."""
    mask = np.zeros(image.shape[:2], np.uint8)
    outer = mesh.at(fm.LIPS_OUTER_UPPER + fm.LIPS_OUTER_LOWER[::-1])
    inner = mesh.at(fm.LIPS_INNER_UPPER + fm.LIPS_INNER_LOWER[::-1])
    cv2.fillPoly(mask, [np.round(outer * 16).astype(np.int32)], 1, cv2.LINE_8, 4)
    cv2.fillPoly(mask, [np.round(inner * 16).astype(np.int32)], 0, cv2.LINE_8, 4)
    px = image[mask > 0]
    if len(px) < 10:
        return fallback.astype(np.float32)
    return np.median(px.astype(np.float32), axis=0).astype(np.float32)


def photo_softness(image: np.ndarray, mesh: fm.FaceMesh) -> tuple[float, float]:
    """(blur sigma, grain) of the photo around the mouth, pixels and grey levels.

    Blur: at an edge blurred by sigma, blurring again by b lowers the steepest gradient by sqrt(sigma^2 + b^2) /
    sigma; that ratio, on the strongest edges of the lower face, gives sigma. Grain: the robust spread of
    what a one-pixel blur takes away on the lower face (sensor noise and the skin's finest texture)."""
    width = max(mesh.mouth_width(), 1.0)
    centre = mesh.points[[61, 291]].mean(axis=0)
    h, w = image.shape[:2]
    x0, x1 = int(max(0, centre[0] - 1.2 * width)), int(min(w, centre[0] + 1.2 * width))
    y0, y1 = int(max(0, centre[1] - 1.1 * width)), int(min(h, centre[1] + 0.9 * width))
    if x1 - x0 < 8 or y1 - y0 < 8:
        return 1.0, 0.0
    y = image[y0:y1, x0:x1].astype(np.float32) @ LUMA
    b = 1.5

    def grad(a: np.ndarray) -> np.ndarray:
        return np.hypot(cv2.Sobel(a, cv2.CV_32F, 1, 0, ksize=3), cv2.Sobel(a, cv2.CV_32F, 0, 1, ksize=3))

    g0 = grad(y)
    g1 = grad(cv2.GaussianBlur(y, (0, 0), b))
    strong = g0 >= np.quantile(g0, 0.98)
    ratio = float(np.median(g0[strong] / np.maximum(g1[strong], 1e-3)))
    # Sobel on a one-pixel grid reads a perfect step as already blurred by about 0.7 px.
    sigma = b / np.sqrt(max(ratio * ratio - 1, 1e-3))
    sigma = float(np.clip(np.sqrt(max(sigma * sigma - 0.7 * 0.7, 0.0)), 0.4, 6.0))
    hi = y - cv2.GaussianBlur(y, (0, 0), 1.0)
    grain = float(1.4826 * np.median(np.abs(hi - np.median(hi))))
    return sigma, grain


def paint(
    mi: MouthInterior,
    s: np.ndarray,
    t: np.ndarray,
    *,
    lip_up: np.ndarray,
    lip_low: np.ndarray,
    moved_up: np.ndarray,
    moved_low: np.ndarray,
    jaw: float,
    rounded: float,
    sources: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """The interior at face coordinates (s, t) -> (h, w, 3) float32 RGB.

    lip_up, lip_low: where the reference's inner lip contours lie (t at each s); moved_up, moved_low: where the
    frame's lie; jaw: how far the jaw has dropped, pixels; rounded: 0..1 lips rounded (closing over the
    teeth); sources: reference pixel coordinates of each point (for the photo's grain)."""
    width = mi.width
    rest = 0.5 * (lip_up + lip_low)  # the lips' line at rest (closed lips: both contours on it)
    gap = np.maximum(moved_low - moved_up, 1e-3)
    r = np.clip(np.abs(s) / (0.5 * width), 0, 1)  # 0 in the middle, 1 at the corners
    rt = np.clip(np.abs(s - mi.midline) / (0.5 * width), 0, 1)  # the same from the arch's middle (the tongue's)
    # The cavity: darkest just under the upper lip and towards the corners, a little light from the front below.
    q = np.clip((t - moved_up) / gap, 0, 1)
    out = mi.cavity[None, None] * (0.7 + 0.3 * q * (1 - r * r))[..., None]
    # Rounded lips push forward and close over the teeth: the upper lip down over the upper row, the lower lip
    # up over the lower (as far as each row shows below or above its lip), and the tongue draws back into the
    # dark, so an "oo" is a dark opening. (Teeth shaded grey instead read as lips, and looked like dark stripes.)
    k = min(max((rounded - ROUND_COVER[0]) / (ROUND_COVER[1] - ROUND_COVER[0]), 0.0), 1.0)
    k = k * k * (3 - 2 * k)
    # (the lower lip pushed out and down past the jaw's travel takes the lower teeth's edge down with it)
    low_edge = rest + jaw - _lower_top(mi, s) * (1 - k) + k * np.maximum(moved_low - (rest + jaw), 0)
    # The tongue's back, riding on the jaw behind the lower teeth, lit along its top.
    tongue_top = low_edge - mi.width * TONGUE_RISE * (1 - (rt / 0.7) ** 2)
    above = t - tongue_top
    cover = np.clip(above / max(0.6, 0.01 * width) + 0.5, 0, 1) * np.clip((0.7 - rt) / 0.15, 0, 1) * (1 - 0.8 * k)
    ridge = 0.85 + 0.35 * np.exp(-((above / max(1.0, 0.02 * width)) ** 2))
    out = out + (mi.tongue[None, None] * ridge[..., None] - out) * cover[..., None]
    # The lower teeth, with the jaw; then the upper teeth, fixed to the skull, over everything.
    col = (s - mi.s0).astype(np.float32)
    low = cv2.remap(mi.lower, col, (t - low_edge + mi.pad).astype(np.float32), cv2.INTER_LINEAR,
                    borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    out = out + (low[..., :3] - out) * low[..., 3:]
    up = cv2.remap(mi.upper, col, (t - lip_up + k * UPPER_SHOW[0] * width + mi.pad).astype(np.float32),
                   cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    out = out + (up[..., :3] - out) * up[..., 3:]
    # The lips' inner edges cast soft shadows: deep under the upper lip, lighter over the lower.
    below_up = np.maximum(t - moved_up, 0) / max(0.8, 0.025 * width)
    above_low = np.maximum(moved_low - t, 0) / max(0.8, 0.02 * width)
    light = (1 - 0.22 * np.exp(-below_up)) * (1 - 0.35 * np.exp(-above_low)) * (1 - 0.5 * r**3)
    out = _shaded(out, light, mi.warm)
    if mi.blur > 0.3:
        out = cv2.GaussianBlur(out, (0, 0), mi.blur)
    nr = mi.noise_rect
    sx, sy = sources
    grain = cv2.remap(mi.noise, sx - nr.x0, sy - nr.y0, cv2.INTER_NEAREST, borderMode=cv2.BORDER_REFLECT)
    return out + grain


def _lower_top(mi: MouthInterior, s: np.ndarray) -> np.ndarray:
    return np.interp(s, mi.s0 + np.arange(len(mi.lower_top)), mi.lower_top)
