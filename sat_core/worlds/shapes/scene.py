"""The shapes world's scenes: 1–4 coloured shapes on a textured background, 112×112 px.

Every image (the encoder's 14×14 grid of 8×8-px cells) holds 1–4 objects; each object keeps its visible
mask, so generated captions and attention maps can be checked against the truth. This module holds the
world's vocabulary (the one source for its captions and its grounding), the generator and the renderer;
``captions`` writes the references, ``grounding`` reads captions back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sat_core.data.masks import rle_encode

IMAGE_SIZE = 112
CELL = 8  # one encoder grid cell (14×14 grid over 112 px)
MIN_VISIBLE = 0.6  # an occluded object keeps at least this share of its pixels
RELATION_MARGIN = 12.0  # px: references state a relation only with this margin on a dominant axis

# ---- vocabulary: the one source for the captions' grammar and the grounding's parser ----
SHAPES = {
    "circle": "circles", "square": "squares", "triangle": "triangles", "star": "stars",
    "cross": "crosses", "diamond": "diamonds", "hexagon": "hexagons",
}  # singular -> plural
SHAPE_WORDS = {**{s: (s, False) for s in SHAPES}, **{p: (s, True) for s, p in SHAPES.items()}}
COLOURS = {
    "red": (215, 35, 35), "green": (40, 170, 50), "blue": (35, 75, 225),
    "yellow": (235, 215, 30), "purple": (140, 50, 200), "orange": (250, 135, 20),
}
SIZES = ("small", "big")
SIZE_WORDS = {"small": "small", "big": "big", "large": "big"}
COUNT_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4}
NUMBER_WORDS = {2: "two", 3: "three", 4: "four"}
RELATIONS = ("left_of", "right_of", "above", "below")
CONVERSE = {"left_of": "right_of", "right_of": "left_of", "above": "below", "below": "above"}
RELATION_PHRASES: dict[tuple[str, ...], str] = {
    ("left", "of"): "left_of", ("to", "the", "left", "of"): "left_of",
    ("on", "the", "left", "of"): "left_of",
    ("right", "of"): "right_of", ("to", "the", "right", "of"): "right_of",
    ("on", "the", "right", "of"): "right_of",
    ("above",): "above", ("over",): "above", ("below",): "below", ("under",): "below",
}
RELATION_WORDS = frozenset({"left", "right", "above", "over", "below", "under"})

# Unit polygons (x, y), y down; scaled by the radius. Rotation ranges keep a square from turning
# into a diamond and a cross into an x.
_ROTATION = {"circle": 0.0, "square": 20.0, "cross": 20.0, "diamond": 20.0,
             "triangle": 180.0, "star": 180.0, "hexagon": 180.0}
_RADIUS = {"small": (8.0, 10.0), "big": (14.0, 17.0)}  # 16–20 px and 28–34 px across


def _ring(n: int, radius: float | list[float], start_deg: float) -> np.ndarray:
    angles = np.deg2rad(start_deg + 360.0 * np.arange(n) / n)
    r = np.resize(np.asarray(radius, float), n)
    return np.stack([r * np.cos(angles), r * np.sin(angles)], axis=1)  # (n, 2)


_POLYGONS = {
    "square": _ring(4, 1.2, 45.0),  # half side 0.85
    "triangle": _ring(3, 1.15, -90.0),
    "star": _ring(10, [1.15, 0.48], -90.0),
    "cross": np.array([(-.33, -1), (.33, -1), (.33, -.33), (1, -.33), (1, .33), (.33, .33),
                       (.33, 1), (-.33, 1), (-.33, .33), (-1, .33), (-1, -.33), (-.33, -.33)]),
    "diamond": np.array([(0, -1.1), (0.65, 0), (0, 1.1), (-0.65, 0)]),
    "hexagon": _ring(6, 1.0, 0.0),
}


@dataclass
class SceneObject:
    """One drawn object: its attributes, geometry and (visible) mask."""

    shape: str
    colour: str
    size: str
    center: tuple[float, float]  # (x, y) px
    radius: float
    rotation: float  # degrees
    rgb: tuple[int, int, int]
    full_mask: np.ndarray = field(repr=False)  # (H, W) bool, before occlusion
    mask: np.ndarray = field(repr=False)  # (H, W) bool, visible pixels


@dataclass
class Scene:
    """Objects in drawing order (later ones occlude earlier ones) and the background recipe."""

    objects: list[SceneObject]
    background: dict[str, Any]
    noise_seed: int


def relation_holds(relation: str, a: tuple[float, float], b: tuple[float, float], *,
                   strict: bool = False) -> bool:
    """Whether "a <relation> b" holds for centroids (x, y), y down.

    Lenient (grounding): the centroids differ in the right direction. Strict (references): by at
    least RELATION_MARGIN px, and more along the stated axis than across it.
    """
    dx, dy = b[0] - a[0], b[1] - a[1]
    along, across = {"left_of": (dx, dy), "right_of": (-dx, dy),
                     "above": (dy, dx), "below": (-dy, dx)}[relation]
    if not strict:
        return along > 0
    return along >= RELATION_MARGIN and along > abs(across)


def shape_mask(shape: str, center: tuple[float, float], radius: float, rotation: float,
               size: int = IMAGE_SIZE) -> np.ndarray:
    """Rasterise one shape into a (size, size) bool mask."""
    from skimage.draw import disk, polygon

    out = np.zeros((size, size), bool)
    cx, cy = center
    if shape == "circle":
        rr, cc = disk((cy, cx), radius, shape=out.shape)
    else:
        t = np.deg2rad(rotation)
        rot = np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
        pts = _POLYGONS[shape] @ rot.T * radius + (cx, cy)  # (n, 2) as (x, y)
        rr, cc = polygon(pts[:, 1], pts[:, 0], shape=out.shape)
    out[rr, cc] = True
    return out


def _sample_attributes(rng: np.random.Generator, n: int) -> list[tuple[str, str, str]]:
    """(shape, colour, size) per object; repeats are made likely so counts occur in captions."""
    attrs: list[tuple[str, str, str]] = []
    for k in range(n):
        if k > 0 and rng.random() < 0.3:
            attrs.append(attrs[int(rng.integers(k))])
        else:
            attrs.append((str(rng.choice(list(SHAPES))), str(rng.choice(list(COLOURS))),
                          str(rng.choice(SIZES))))
    return attrs


def _place(rng: np.random.Generator, attrs: list[tuple[str, str, str]]) -> list[SceneObject] | None:
    """One random layout; None when some object would be less than MIN_VISIBLE visible."""
    objs = []
    for shape, colour, size in attrs:
        radius = float(rng.uniform(*_RADIUS[size]))
        lo, hi = radius + 2.0, IMAGE_SIZE - radius - 3.0
        center = (float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi)))
        rotation = float(rng.uniform(-_ROTATION[shape], _ROTATION[shape]))
        jitter = rng.integers(-15, 16, size=3)
        rgb = tuple(int(v) for v in np.clip(np.add(COLOURS[colour], jitter), 0, 255))
        full = shape_mask(shape, center, radius, rotation)
        objs.append(SceneObject(shape, colour, size, center, radius, rotation, rgb, full, full))
    for k, a in enumerate(objs):  # same-colour objects never touch: they would merge into one blob
        for b in objs[:k]:
            gap = np.hypot(a.center[0] - b.center[0], a.center[1] - b.center[1])
            if a.colour == b.colour and gap < 1.2 * (a.radius + b.radius) + 1:
                return None
    covered = np.zeros((IMAGE_SIZE, IMAGE_SIZE), bool)
    for obj in reversed(objs):  # later objects are drawn on top
        obj.mask = obj.full_mask & ~covered
        covered |= obj.full_mask
        if obj.mask.sum() < MIN_VISIBLE * obj.full_mask.sum():
            return None
    return objs


def generate_scene(rng: np.random.Generator) -> Scene:
    """Draw a random scene of 1–4 objects (each at least 60 % visible) and a background recipe."""
    n = int(rng.choice([1, 2, 3, 4], p=[0.2, 0.3, 0.3, 0.2]))
    objects = None
    while objects is None:
        attrs = _sample_attributes(rng, n)
        for _ in range(50):
            objects = _place(rng, attrs)
            if objects is not None:
                break
        n = max(1, n - 1)  # crowded: try again with fewer objects
    background = {
        "base": [float(v) for v in rng.uniform(70, 190) + rng.uniform(-15, 15, size=3)],
        "gradient_angle": float(rng.uniform(0, 2 * np.pi)),
        "gradient_amp": float(rng.uniform(0, 35)),
        "stripe_angle": float(rng.uniform(0, np.pi)),
        "stripe_period": float(rng.uniform(5, 20)),
        "stripe_amp": float(rng.choice([0.0, rng.uniform(5, 14)])),
        "noise_std": float(rng.uniform(4, 10)),
    }
    return Scene(objects, background, int(rng.integers(2**32)))


def _background(bg: dict[str, Any], rng: np.random.Generator) -> np.ndarray:
    """Low-saturation texture: tinted grey + gradient + stripes + colour noise. (H, W, 3) float."""
    ys, xs = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE] / IMAGE_SIZE - 0.5  # (H, W) each
    grad = np.cos(bg["gradient_angle"]) * xs + np.sin(bg["gradient_angle"]) * ys
    phase = (np.cos(bg["stripe_angle"]) * xs + np.sin(bg["stripe_angle"]) * ys) * IMAGE_SIZE
    stripes = np.sin(2 * np.pi * phase / bg["stripe_period"])
    grey = bg["gradient_amp"] * 2 * grad + bg["stripe_amp"] * stripes  # (H, W)
    noise = rng.normal(0, bg["noise_std"], size=(IMAGE_SIZE, IMAGE_SIZE, 3))
    return np.asarray(bg["base"]) + grey[..., None] + noise  # (H, W, 3)


def render(scene: Scene) -> np.ndarray:
    """The scene as a (112, 112, 3) uint8 RGB image; a pure function of the scene."""
    rng = np.random.default_rng(scene.noise_seed)
    img = _background(scene.background, rng)
    for obj in scene.objects:
        img[obj.full_mask] = obj.rgb
    img += rng.normal(0, 4, size=img.shape)  # mild sensor noise over objects too
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def scene_objects(scene: Scene) -> list[dict[str, Any]]:
    """JSON records of a scene's objects: attributes, bbox [x, y, w, h], centroid, area, mask."""
    records = []
    for oid, obj in enumerate(scene.objects):
        ys, xs = np.nonzero(obj.mask)
        records.append({
            "id": oid, "shape": obj.shape, "colour": obj.colour, "size": obj.size,
            "bbox": [int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1),
                     int(ys.max() - ys.min() + 1)],
            "centroid": [round(float(xs.mean()), 2), round(float(ys.mean()), 2)],
            "area": int(obj.mask.sum()),
            "mask": rle_encode(obj.mask),
        })
    return records
