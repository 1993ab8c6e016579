"""The shapes world: 1–4 coloured shapes on textured backgrounds, 112×112 px — the fast test world.

Its face (``sat_core.worlds.World``): generation (``scene``), references (``captions``), grounding of a
caption against the scene's objects (``grounding``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sat_core.worlds import Made, Options
from sat_core.worlds.shapes.captions import describe
from sat_core.worlds.shapes.grounding import ERROR_LABELS, ground, word_kind
from sat_core.worlds.shapes.scene import IMAGE_SIZE, generate_scene, render, scene_objects

__all__ = ["NAME", "DATASET", "IMAGE_SIZE", "ERROR_LABELS", "make_image", "header", "owns", "ground", "word_kind"]

NAME = "shapes"
DATASET = "sat_world"


def make_image(rng: np.random.Generator, split: str, options: Options) -> Made:
    """One scene, its pixels, object records and five references (the options do not apply here)."""
    scene = generate_scene(rng)
    objects = scene_objects(scene)
    return Made(render(scene), objects, describe(objects, rng), {})


def header(options: Options) -> dict[str, Any]:
    return {}


def owns(objects: Sequence[dict[str, Any]]) -> bool:
    return all("shape" in o for o in objects)
