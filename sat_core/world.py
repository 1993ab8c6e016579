"""The embedded synthetic dataset: coloured shapes on textured backgrounds, with grounded captions.

    python -m sat_core.world --out data/world --train 8000 --val 500 --test 500 --seed 0
    python -m sat_core.world --kind scenes --out data/scenes ...   (sat_core.scenes: everyday objects)

Every image (112×112, i.e. the encoder's 14×14 grid of 8×8-px cells) holds 1–4 objects and gets
five reference captions from a small grammar that names every object; each object keeps its visible
mask, so generated captions and attention maps can be checked against the truth
(sat_core.grounding).

Output: ``DIR/dataset.json`` in Karpathy format (the loader that reads Flickr8k reads this) and
``DIR/<split>/<imgid:06d>.png``. Every reference sentence carries ``links``: ``[token_index,
[object ids]]`` for each count word, adjective and shape noun. Masks are run-length encoded in
ROW-MAJOR order (COCO's uncompressed RLE is column-major): ``counts`` alternate background /
foreground runs over the flattened (H, W) mask, starting with a possibly empty background run.

Determinism: image ``index`` of ``split`` draws from ``SeedSequence(seed, spawn_key=(split_no,
index))``, so any number of workers writes byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sat_core.data.masks import rle_decode, rle_encode  # noqa: F401  (rle_decode: the codec's other half)
from sat_core.errors import DatasetError, SatError

IMAGE_SIZE = 112
CELL = 8  # one encoder grid cell (14×14 grid over 112 px)
SPLITS = ("train", "val", "test")
KINDS = ("shapes", "scenes")
CAPTIONS_PER_IMAGE = 5
MAX_CAPTION_TOKENS = 22
MIN_VISIBLE = 0.6  # an occluded object keeps at least this share of its pixels
RELATION_MARGIN = 12.0  # px: references state a relation only with this margin on a dominant axis

# ---- vocabulary: the one source for world.py's grammar and grounding.py's parser ----
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
CAPTION_ORDERS = ("random", "left_to_right", "largest_first")  # the scenes world's references (sat_core.scenes_captions)
# The scenes world's generator version, kept in its dataset.json: 2 added surface styles, the shifted split,
# objects cut by the border, wider scales and degraded training pictures.
SCENES_VERSION = 2
SHIPPED_CAPTION_ORDER = "largest_first"  # the default world's order (the shipped scenes_soft was trained on it)
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
_OPENERS = ((), ("there", "is"), ("the", "image", "shows"), ("a", "picture", "of"),
            ("we", "can", "see"))
_OPENER_P = (0.4, 0.2, 0.15, 0.1, 0.15)

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


# ---- captions ----
Token = tuple[str, list[int] | None]  # word and the object ids it names


def _groups(objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Identical objects (shape, colour, size) grouped, in first-appearance order."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for o in objects:
        groups.setdefault((o["shape"], o["colour"], o["size"]), []).append(o)
    return list(groups.values())


def _mention(group: list[dict[str, Any]], with_size: bool, rng: np.random.Generator) -> list[Token]:
    """'a big red circle' / 'two small blue stars', every word linked to the group's ids."""
    ids = [o["id"] for o in group]
    o = group[0]
    words = []
    if with_size:
        words.append("small" if o["size"] == "small" else str(rng.choice(["big", "large"])))
    words += [o["colour"], SHAPES[o["shape"]] if len(group) > 1 else o["shape"]]
    article = "an" if words[0][0] in "aeiou" else "a"
    count = NUMBER_WORDS[len(group)] if len(group) > 1 else article
    return [(w, ids) for w in [count, *words]]


def _group_relations(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Relations that hold strictly between every object of a and every object of b."""
    return [r for r in RELATIONS if all(relation_holds(r, x["centroid"], y["centroid"], strict=True)
                                        for x in a for y in b)]


def _relation_phrase(relation: str, rng: np.random.Generator) -> list[str]:
    phrases = [list(p) for p, r in RELATION_PHRASES.items() if r == relation]
    return phrases[int(rng.integers(len(phrases)))]


def _caption(groups: list[list[dict[str, Any]]], rng: np.random.Generator,
             plain: bool = False) -> list[Token]:
    """One caption naming every group; plain = no opener, no relations, sizes only where needed."""
    keys = [(g[0]["shape"], g[0]["colour"]) for g in groups]
    need_size = [keys.count(k) > 1 for k in keys]  # size tells same-colour same-shape groups apart
    order = [int(i) for i in rng.permutation(len(groups))]

    def mention(i: int) -> list[Token]:
        return _mention(groups[i], need_size[i] or (not plain and rng.random() < 0.5), rng)

    clauses: list[list[Token]] = []
    k = 0
    while k < len(order):
        i = order[k]
        if not plain and k + 1 < len(order) and rng.random() < 0.6:
            j = order[k + 1]
            rels = _group_relations(groups[i], groups[j])
            if rels:
                rel = rels[int(rng.integers(len(rels)))]
                if rng.random() < 0.5:  # same fact, mentions swapped, converse relation
                    i, j, rel = j, i, CONVERSE[rel]
                phrase = [(w, None) for w in _relation_phrase(rel, rng)]
                clauses.append(mention(i) + phrase + mention(j))
                k += 2
                continue
        clauses.append(mention(i))
        k += 1
    tokens: list[Token] = []
    if not plain:
        opener = list(_OPENERS[int(rng.choice(len(_OPENERS), p=_OPENER_P))])
        if opener == ["there", "is"] and clauses[0][0][0] in NUMBER_WORDS.values():
            opener = ["there", "are"]
        tokens += [(w, None) for w in opener]
    for c, clause in enumerate(clauses):
        tokens += ([("and", None)] if c else []) + clause
    return tokens


def describe(objects: list[dict[str, Any]], rng: np.random.Generator,
             n: int = CAPTIONS_PER_IMAGE) -> list[dict[str, Any]]:
    """n reference captions (distinct where the grammar allows): {"tokens", "raw", "links"}."""
    groups = _groups(objects)
    found: dict[tuple[str, ...], list[Token]] = {}
    for _ in range(8 * n):
        cap = _caption(groups, rng)
        if len(cap) <= MAX_CAPTION_TOKENS:
            found.setdefault(tuple(w for w, _ in cap), cap)
        if len(found) == n:
            break
    caps = list(found.values()) or [_caption(groups, rng, plain=True)]  # plain is always short
    return caption_records(caps, n)


def caption_records(caps: list[list[tuple[str, list[int] | None]]], n: int) -> list[dict[str, Any]]:
    """n reference records {"tokens", "raw", "links"} cycling through captions of (word, object ids)."""
    out = []
    for cap in (caps[k % len(caps)] for k in range(n)):
        tokens = [w for w, _ in cap]
        links = [[t, sorted(ids)] for t, (_, ids) in enumerate(cap) if ids is not None]
        out.append({"tokens": tokens, "raw": " ".join(tokens), "links": links})
    return out


# ---- dataset writing ----
def _image_rng(seed: int, split: str, index: int, shifted: bool = False) -> np.random.Generator:
    key = (SPLITS.index(split), index, 1) if shifted else (SPLITS.index(split), index)
    seq = np.random.SeedSequence(seed, spawn_key=key)
    return np.random.default_rng(seq)


def _make_image(task: tuple[int, str, int, int, str, str, str, bool, bool]) -> dict[str, Any]:
    """Generate, render and save one image; return its Karpathy record."""
    from PIL import Image

    seed, split, index, imgid, out_dir, kind, caption_order, shifted, augment = task
    rng = _image_rng(seed, split, index, shifted)
    filename = f"{imgid:06d}.png"
    extra: dict[str, Any] = {}
    if kind == "scenes":
        from sat_core import scenes, scenes_captions

        layout = scenes.generate_layout(rng, shifted=shifted)
        objects = scenes.layout_objects(layout)
        pixels = scenes.render_layout(layout)
        captions = scenes_captions.describe(objects, layout.place, rng, caption_order=caption_order)
        extra = {"place": layout.place, "styles": layout.styles}
        if augment and split == "train":
            pixels, done = scenes.photometric(pixels, rng)
            if done:
                extra["degraded"] = done
    else:
        scene = generate_scene(rng)
        objects = scene_objects(scene)
        pixels = render(scene)
        captions = describe(objects, rng)
    Image.fromarray(pixels).save(Path(out_dir) / split / filename, format="PNG")
    sentences = []
    for k, cap in enumerate(captions):
        sentences.append({"tokens": cap["tokens"], "raw": cap["raw"], "imgid": imgid,
                          "sentid": imgid * CAPTIONS_PER_IMAGE + k, "links": cap["links"]})
    return {"filename": filename, "filepath": split, "split": split, "imgid": imgid,
            "sentids": [s["sentid"] for s in sentences], "sentences": sentences,
            "objects": objects, **extra}


def _prepare_out_dir(out_dir: Path) -> None:
    try:
        for split in SPLITS:
            (out_dir / split).mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DatasetError(
            f"Cannot create the output folder {out_dir} ({err.strerror or err}); "
            "pass a writable directory with --out."
        ) from err


def generate(out_dir: str | Path, n_train: int, n_val: int, n_test: int, seed: int = 0,
             workers: int = 2, kind: str = "shapes", caption_order: str = SHIPPED_CAPTION_ORDER,
             shifted: bool = False, augment: bool = True) -> Path:
    """Write the dataset (images + dataset.json) under out_dir; return the dataset.json path.

    kind: "shapes" (this module: 112 px coloured shapes, the fast test world) or "scenes"
    (sat_core.scenes: 224 px everyday objects in places). caption_order (scenes only): "largest_first"
    (the shipped world), "left_to_right" or "random" (sat_core.scenes_captions); a scenes dataset.json
    records it. shifted (scenes only): draw the held-out styles and horizons (``sat_core.scenes``) — the
    shifted split, written as a dataset of its own whose images no other split shares. augment (scenes
    only): degrade some training pictures (``scenes.photometric``); validation and test pictures never.
    """
    if kind not in KINDS:
        raise SatError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}.")
    if caption_order not in CAPTION_ORDERS:
        raise SatError(f"caption_order must be one of {', '.join(CAPTION_ORDERS)}, not {caption_order!r}.")
    out_dir = Path(out_dir)
    counts = {"train": n_train, "val": n_val, "test": n_test}
    if any(n < 0 for n in counts.values()) or workers < 1:
        raise SatError("Image counts must be >= 0 and workers >= 1.")
    _prepare_out_dir(out_dir)
    tasks, imgid = [], 0
    for split in SPLITS:
        for index in range(counts[split]):
            tasks.append((seed, split, index, imgid, str(out_dir), kind, caption_order, shifted, augment))
            imgid += 1
    try:
        if workers == 1 or len(tasks) < 2:
            images = [_make_image(t) for t in tasks]
        else:
            with multiprocessing.Pool(workers) as pool:
                chunk = max(1, min(64, len(tasks) // (4 * workers)))
                images = pool.map(_make_image, tasks, chunksize=chunk)
        path = out_dir / "dataset.json"
        name, size = ("sat_scenes", 224) if kind == "scenes" else ("sat_world", IMAGE_SIZE)
        data = {"dataset": name, "kind": kind, "seed": seed, "image_size": size,
                **({"caption_order": caption_order, "version": SCENES_VERSION, "shifted": shifted,
                    "augment": augment} if kind == "scenes" else {}), "images": images}
        path.write_text(json.dumps(data, separators=(",", ":")))
    except OSError as err:
        raise DatasetError(f"Cannot write the dataset under {out_dir} ({err}); "
                           "check free space and permissions.") from err
    return path


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    """CLI: generate the synthetic dataset and print its size and speed."""
    p = argparse.ArgumentParser(prog="python -m sat_core.world", description=__doc__.split("\n")[0])
    p.add_argument("--kind", choices=KINDS, default="shapes",
                   help="shapes: 112 px coloured shapes (fast); scenes: 224 px everyday objects in places")
    p.add_argument("--out", required=True, help="output folder (created if missing)")
    p.add_argument("--train", type=_count, default=8000)
    p.add_argument("--val", type=_count, default=500)
    p.add_argument("--test", type=_count, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=_positive, default=2)
    p.add_argument("--caption-order", choices=CAPTION_ORDERS, default=SHIPPED_CAPTION_ORDER,
                   help="scenes: name the largest group of identical objects first and equal ones left to right "
                        "(the shipped world: 'two trucks and an umbrella'; 'left of' is the one horizontal "
                        "relation), every group left to right, or in random order")
    p.add_argument("--shifted", action="store_true",
                   help="scenes: draw surface styles and horizons the other splits never draw (a generalisation "
                        "set; use --train 0 --val 0 --test N and its own --out)")
    p.add_argument("--no-augment", action="store_true",
                   help="scenes: keep every training picture as rendered (by default some are degraded: JPEG, "
                        "grayscale, blur, exposure)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    try:
        path = generate(args.out, args.train, args.val, args.test, args.seed, args.workers, args.kind,
                        args.caption_order, shifted=args.shifted, augment=not args.no_augment)
    except SatError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from err
    n = args.train + args.val + args.test
    elapsed = time.perf_counter() - start
    print(f"wrote {n} images and {path} in {elapsed:.1f} s ({n / max(elapsed, 1e-9):.0f} images/s, "
          f"{args.workers} workers)")


if __name__ == "__main__":
    main()
