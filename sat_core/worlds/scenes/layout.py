"""Scenes of the scenes world: where 1–4 everyday objects stand in a place, and the picture of it.

    python -m sat_core.world --kind scenes --out data/scenes --train 8000 --val 500 --test 500 --seed 0

A 224×224 image shows 1–4 objects of the categories in ``catalog`` on a procedural place
(grass, beach, road, snow, water, room, table, sky; ``render``), each surface in one of its
styles. Objects vary in scale and may be cut by the image's left or right border.

The *shifted* split (``generate_layout(rng, shifted=True)``) draws only the styles that the other splits
never draw (``render.HELD_OUT``) and horizons outside their range (``HORIZONS``): a set for
measuring how a model holds up beyond the scenes it was trained and selected on. With
``held_out="validation"`` it draws a second held-out group (``render.HELD_OUT_VALIDATION``) instead: a
shifted set to choose on. Things standing on the ground follow perspective (further up = further away =
smaller), are drawn far to near so near ones occlude far ones, and cast a soft shadow; flying things are
drawn in the sky. Each object's mask is its sprite's alpha (>= 50 %) where no later object covers it.
Captions come from ``captions``. The dataset.json schema is the shapes world's (see ``sat_core.worlds.writer``), with
per-object ``category``, ``colour`` (or null), ``variant``, ``layer`` (ground | air), ``foot`` and
``full_bbox`` in place of shape/size, and a per-image ``place``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sat_core.data.masks import rle_encode
from sat_core.worlds.scenes.catalog import CATEGORIES, PLACE_P, Category
from sat_core.worlds.scenes.render import SIZE, TRAINING_ONLY_SHARE, background, light, shadow, styles_for

IMAGE_SIZE = SIZE
MIN_VISIBLE = 0.55  # an occluded object keeps at least this share of its pixels
_N_P = (0.2, 0.3, 0.3, 0.2)  # P(1..4 objects)
CUT_P = 0.15  # how often an object may be cut by the left or right border
MIN_INSIDE = 0.6  # a cut object keeps at least this share of its sprite inside the image
# The first ground row per kind of place: (low, high) for the usual splits, and for the shifted one
# (a camera looking further down). Sky scenes have no horizon.
HORIZONS = {"usual": {"table": (35, 70), "floor": (70, 105), "outdoor": (55, 105)},
            "shifted": {"table": (18, 32), "floor": (48, 66), "outdoor": (30, 52)}}


@dataclass
class Thing:
    """One placed object: what it is and where its sprite lands. Masks are (H, W) bool."""

    category: str
    colour: str | None
    variant: str  # emoji code point
    recolour: str | None  # colour the sprite was hue-shifted to, if any
    layer: str  # ground | air
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 of the resized sprite (exclusive ends)
    alpha: np.ndarray = field(repr=False)  # (h, w) float in [0, 1], the resized sprite's alpha
    rgb: np.ndarray = field(repr=False)  # (h, w, 3) float
    full_mask: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]
    mask: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]

    @property
    def foot(self) -> int:
        return self.box[3]


@dataclass
class SceneLayout:
    place: str
    horizon: int  # first ground row (SIZE for an all-sky scene)
    things: list[Thing]  # drawing order: far to near, flying things last
    seed: int  # for the background and lighting
    styles: dict[str, str] = field(default_factory=dict)  # ground / sky / wall style (scenes_render)


def _resized(code: str, colour: str | None, longest: float) -> tuple[np.ndarray, np.ndarray]:
    """The sprite scaled so its longest side is ``longest`` px: (alpha (h, w), rgb (h, w, 3))."""
    from PIL import Image

    from sat_core.worlds.scenes.sprites import sprite  # here: ``python -m …sprites`` runs before any sprite exists

    rgba = sprite(code, colour)
    h, w = rgba.shape[:2]
    k = longest / max(h, w)
    size = (max(2, round(w * k)), max(2, round(h * k)))
    out = np.asarray(Image.fromarray(rgba, "RGBA").resize(size, Image.Resampling.BILINEAR), dtype=np.float32)
    return out[..., 3] / 255.0, out[..., :3]


def _choose_objects(rng: np.random.Generator, place: str, n: int) -> list[tuple[Category, Any, str | None]]:
    """(category, variant, recolour) per object; repeats are likely so counts occur in captions."""
    ground = [c for c in CATEGORIES.values() if place in c.places and not c.air]
    air = [c for c in CATEGORIES.values() if place in c.places and c.air]
    picks: list[tuple[Category, Any, str | None]] = []
    for k in range(n):
        if k > 0 and rng.random() < 0.3:
            picks.append(picks[int(rng.integers(k))])
            continue
        pool = air if (not ground or (air and k > 0 and rng.random() < 0.2)) else ground
        cat = pool[int(rng.integers(len(pool)))]
        variant = cat.variants[int(rng.integers(len(cat.variants)))]
        recolour = None
        if variant.recolour and rng.random() < 0.8:
            recolour = str(rng.choice(variant.recolour))
        picks.append((cat, variant, recolour))
    return picks


def _place_one(rng: np.random.Generator, cat: Category, variant: Any, recolour: str | None,
               place: str, horizon: int) -> Thing | None:
    if cat.air:
        scale = rng.uniform(0.45, 1.05) if place != "sky" else rng.uniform(0.5, 1.2)
        bottom_max = min(horizon + 5, SIZE) if place != "sky" else SIZE
    else:
        foot = rng.uniform(horizon + 8, SIZE - 2)
        depth = (foot - horizon) / (SIZE - horizon)  # 0 at the horizon, 1 at the bottom edge
        scale = (0.4 + 0.6 * depth) * rng.uniform(0.7, 1.25)
    alpha, rgb = _resized(variant.code, recolour, cat.height * scale)
    h, w = alpha.shape
    if w >= SIZE - 4 or h >= SIZE - 4:
        return None
    if rng.random() < CUT_P:  # past the left or right border, keeping MIN_INSIDE of it inside
        out = int(rng.integers(1, max(2, int(w * (1 - MIN_INSIDE)))))
        x0 = -out if rng.random() < 0.5 else SIZE - w + out
    else:
        x0 = int(rng.integers(2, SIZE - w - 1))
    if cat.air:
        if bottom_max - h - 2 < 2:
            return None
        y0 = int(rng.integers(2, bottom_max - h))
    else:
        y0 = int(round(foot)) - h
        if y0 < 2:
            return None
    return Thing(cat.name, recolour or variant.colour, variant.code, recolour,
                 "air" if cat.air else "ground", (x0, y0, x0 + w, y0 + h), alpha, rgb)


def _layout_masks(things: list[Thing]) -> bool:
    """Set full/visible masks (later things cover earlier ones); False if one is too hidden or
    two things of the same kind overlap (they would read as one)."""
    for t in things:
        full = np.zeros((SIZE, SIZE), bool)
        (ys, xs), (ss, cs) = _clipped(t.box)
        full[ys, xs] = t.alpha[ss, cs] >= 0.5
        t.full_mask = full
        if full.sum() < MIN_INSIDE * (t.alpha >= 0.5).sum():
            return False
    covered = np.zeros((SIZE, SIZE), bool)
    for t in reversed(things):
        t.mask = t.full_mask & ~covered
        covered |= t.full_mask
        if t.mask.sum() < MIN_VISIBLE * t.full_mask.sum():
            return False
    for k, a in enumerate(things):
        for b in things[:k]:
            if (a.category, a.colour) == (b.category, b.colour) and (a.full_mask & b.full_mask).any():
                return False
    return True


def _clipped(box: tuple[int, int, int, int]) -> tuple[tuple[slice, slice], tuple[slice, slice]]:
    """The part of a sprite's box inside the image: (rows, cols) in the image, (rows, cols) in the sprite."""
    x0, y0, x1, y1 = box
    cx0, cy0, cx1, cy1 = max(x0, 0), max(y0, 0), min(x1, SIZE), min(y1, SIZE)
    return ((slice(cy0, cy1), slice(cx0, cx1)),
            (slice(cy0 - y0, cy1 - y0), slice(cx0 - x0, cx1 - x0)))


def generate_layout(rng: np.random.Generator, shifted: bool = False, held_out: str = "test",
                    split: str = "test") -> SceneLayout:
    """A random place and 1–4 objects on it (each at least MIN_VISIBLE visible); ``shifted`` draws the
    held-out styles of ``held_out``'s side ("test", the shifted split, or "validation") and the shifted
    horizons; a share of the training ``split``'s scenes also draws the training-only styles."""
    places = list(PLACE_P)
    place = str(rng.choice(places, p=[PLACE_P[p] for p in places]))
    wider = split == "train" and not shifted and rng.random() < TRAINING_ONLY_SHARE
    choices = styles_for(place, shifted, held_out, training_only=wider)
    styles = {surface: str(rng.choice(names)) for surface, names in choices.items() if names}
    ranges = HORIZONS["shifted" if shifted else "usual"]
    low, high = ranges.get(place, ranges["outdoor"])
    horizon = SIZE if place == "sky" else int(rng.integers(low, high))
    n = int(rng.choice([1, 2, 3, 4], p=_N_P))
    while True:
        picks = _choose_objects(rng, place, n)
        for _ in range(40):
            things = [_place_one(rng, *pick, place, horizon) for pick in picks]
            if any(t is None for t in things):
                continue
            ground = sorted((t for t in things if t.layer == "ground"), key=lambda t: t.foot)
            things = ground + [t for t in things if t.layer == "air"]
            if _layout_masks(things):
                return SceneLayout(place, horizon, things, int(rng.integers(2**32)), styles)
        n = max(1, n - 1)  # crowded: fewer objects


def render_layout(layout: SceneLayout) -> np.ndarray:
    """The scene as (224, 224, 3) uint8 RGB; a pure function of the layout."""
    rng = np.random.default_rng(layout.seed)
    image = background(layout.place, layout.horizon, rng, layout.styles)  # (H, W, 3) float
    shift = rng.uniform(-0.25, 0.25)  # where the light comes from: shadows lean the same way
    strength = rng.uniform(0.25, 0.5)
    for t in layout.things:
        x0, y0, x1, y1 = t.box
        if t.layer == "ground":
            shadow(image, (x0 + x1) / 2, y1 - 1, x1 - x0, shift, strength)
        (ys, xs), (ss, cs) = _clipped(t.box)
        a = t.alpha[ss, cs][..., None]
        image[ys, xs] = image[ys, xs] * (1 - a) + t.rgb[ss, cs] * a
    return light(image, rng)


def _bbox(mask: np.ndarray) -> list[int]:
    ys, xs = np.nonzero(mask)
    return [int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)]


def layout_objects(layout: SceneLayout) -> list[dict[str, Any]]:
    """JSON records of the objects (the shapes world's schema, scenes fields): bbox/centroid/area/mask of
    the visible part; full_bbox and foot (bottom row) of the whole sprite for relations."""
    out = []
    for oid, t in enumerate(layout.things):
        ys, xs = np.nonzero(t.mask)
        out.append({
            "id": oid, "category": t.category, "colour": t.colour, "variant": t.variant,
            "layer": t.layer, "bbox": _bbox(t.mask), "full_bbox": _bbox(t.full_mask),
            "foot": int(t.box[3]), "centroid": [round(float(xs.mean()), 2), round(float(ys.mean()), 2)],
            "area": int(t.mask.sum()), "mask": rle_encode(t.mask),
        })
    return out


# ---- relations: the one definition, for references (strict) and grounding (lenient) ----

def relation_holds(relation: str, a: dict[str, Any], b: dict[str, Any], *, strict: bool = False) -> bool:
    """Whether "a <relation> b" holds for two object records (y grows downwards).

    Strict (references state it only then): clear cases. Lenient (grounding judges a generated
    caption): the right direction, for pairs the relation can describe.
    """
    if relation in ("right_of", "behind", "below"):
        converse = {"right_of": "left_of", "behind": "in_front_of", "below": "above"}[relation]
        return relation_holds(converse, b, a, strict=strict)
    ax, ay, aw, ah = a["full_bbox"]
    bx, by, bw, bh = b["full_bbox"]
    (acx, acy), (bcx, bcy) = (ax + aw / 2, ay + ah / 2), (bx + bw / 2, by + bh / 2)
    both_ground = a["layer"] == b["layer"] == "ground"
    if relation == "left_of":
        return acx <= bx and ax + aw <= bcx if strict else acx < bcx
    if relation == "above":
        if not strict:
            return acy < bcy
        return not both_ground and ay + ah <= bcy and acy <= by and abs(acx - bcx) < (bcy - acy)
    if relation == "in_front_of":
        if not strict:
            return a["foot"] > b["foot"]
        overlap = min(ax + aw, bx + bw) - max(ax, bx)
        return both_ground and a["foot"] >= b["foot"] + 10 and overlap >= 0.3 * min(aw, bw)
    if relation == "next_to":
        gap = max(bx - (ax + aw), ax - (bx + bw))  # < 0: the boxes overlap horizontally
        same_row = a["layer"] == b["layer"] and abs(a["foot"] - b["foot"]) <= (0.25 if strict else 0.5) * max(ah, bh)
        if strict:
            return same_row and -0.15 * min(aw, bw) <= gap <= 0.35 * max(aw, bw)
        return same_row and gap <= 0.6 * max(aw, bw)
    raise ValueError(f"unknown relation {relation!r}")


# ---- training-time variety of the picture itself ----

# How often a training scene is degraded, and how: (name, probability). The ranges differ from the
# transformation suite's fixed settings (``transforms``) so that the suite stays a measurement.
PHOTOMETRIC = (("jpeg", 0.10), ("grayscale", 0.07), ("blur", 0.08), ("dark", 0.06), ("bright", 0.04))


def photometric(pixels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, str | None]:
    """One random degradation of a rendered scene (or none): JPEG at quality 10–50, grayscale, a Gaussian
    blur of radius 0.6–1.6 px, or a darker (×0.4–0.75) or brighter (×1.2–1.4) exposure. Returns the
    (224, 224, 3) uint8 picture and what was done, for the image's record."""
    import io

    from PIL import Image, ImageFilter

    draw = rng.random()
    for name, p in PHOTOMETRIC:
        if draw >= p:
            draw -= p
            continue
        image = Image.fromarray(pixels)
        if name == "jpeg":
            quality = int(rng.integers(10, 51))
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=quality)
            return np.asarray(Image.open(buffer).convert("RGB")), f"jpeg {quality}"
        if name == "grayscale":
            return np.asarray(image.convert("L").convert("RGB")), name
        if name == "blur":
            radius = float(rng.uniform(0.6, 1.6))
            return np.asarray(image.filter(ImageFilter.GaussianBlur(radius))), f"blur {radius:.1f}"
        gain = float(rng.uniform(0.4, 0.75) if name == "dark" else rng.uniform(1.2, 1.4))
        return np.clip(np.rint(pixels * gain), 0, 255).astype(np.uint8), f"exposure {gain:.2f}"
    return pixels, None
