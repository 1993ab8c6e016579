"""The scenes world: 1–4 everyday objects (Fluent Emoji 3D sprites) in procedural places, 224×224 px.

Its face (``sat_core.worlds.World``): what it holds (``catalog``), the sprites (``sprites``), places
(``render``), layouts and pictures (``layout``), references (``captions``), grounding (``grounding``) and
the transformation suite over its test split (``transforms``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sat_core.worlds import Made, Options
from sat_core.worlds.scenes import layout
from sat_core.worlds.scenes.captions import describe
from sat_core.worlds.scenes.grounding import ERROR_LABELS, ground, word_kind

__all__ = ["NAME", "DATASET", "IMAGE_SIZE", "VERSION", "ERROR_LABELS", "make_image", "header", "owns", "ground",
           "word_kind"]

NAME = "scenes"
DATASET = "sat_scenes"
IMAGE_SIZE = layout.IMAGE_SIZE
# The generator's version, kept in its dataset.json: 2 added surface styles, the shifted split, objects cut by
# the border, wider scales and degraded training pictures; 3 added styles that only training pictures draw.
VERSION = 3


def make_image(rng: np.random.Generator, split: str, options: Options) -> Made:
    """One scene: a place and its objects, its picture (a training one sometimes degraded) and references."""
    drawn = layout.generate_layout(rng, shifted=options.shifted, held_out=options.held_out, split=split)
    objects = layout.layout_objects(drawn)
    pixels = layout.render_layout(drawn)
    captions = describe(objects, drawn.place, rng, caption_order=options.caption_order)
    extra: dict[str, Any] = {"place": drawn.place, "styles": drawn.styles}
    if options.augment and split == "train":
        pixels, done = layout.photometric(pixels, rng)
        if done:
            extra["degraded"] = done
    return Made(pixels, objects, captions, extra)


def header(options: Options) -> dict[str, Any]:
    return {"caption_order": options.caption_order, "version": VERSION, "shifted": options.shifted,
            "augment": options.augment, **({"held_out": options.held_out} if options.shifted else {})}


def owns(objects: Sequence[dict[str, Any]]) -> bool:
    return any("category" in o for o in objects)
