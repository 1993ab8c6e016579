"""The embedded synthetic worlds: pictures whose every object is known, with captions linked to the objects.

Two worlds, each a package behind the same small interface (``World``): ``shapes`` (112 px coloured
shapes, the fast test world) and ``scenes`` (224 px everyday objects in places, the shipped models' world).
``writer.generate`` writes either as a Karpathy-format dataset (``python -m sat_core.world``); evaluation
and the explorer reach a world only through ``get(name)``/``of(objects)`` and the functions below.

Nothing here is imported by ``sat_core.models`` or ``sat_core.decoding``: the paper's model and its decoding
know no world (tests/test_architecture.py holds that).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, Sequence

import numpy as np

NAMES = ("shapes", "scenes")
# Word kinds in the order a word that two worlds both know is classified by (a shape noun before a colour…).
WORD_KINDS = ("shape", "category", "colour", "size", "count", "relation", "place", "function")


@dataclass(frozen=True)
class Options:
    """How a world draws a dataset (the scenes world reads all three; the shapes world none)."""

    caption_order: str = "largest_first"
    shifted: bool = False  # draw only what the usual splits never draw: a generalisation set
    augment: bool = True  # degrade some training pictures
    held_out: str = "test"  # with shifted: whose held-out styles, "test" (the shifted split) or "validation"


class Made(NamedTuple):
    """One generated image: pixels (H, W, 3) uint8, object records, reference records, extra record fields."""

    pixels: np.ndarray
    objects: list[dict[str, Any]]
    captions: list[dict[str, Any]]
    extra: dict[str, Any]


class World(Protocol):
    """What a world offers: a package ``sat_core.worlds.<NAME>`` with these names."""

    NAME: str
    DATASET: str  # the dataset.json's "dataset" field
    IMAGE_SIZE: int
    ERROR_LABELS: tuple[str, ...]  # what ``ground`` can find wrong in a caption

    def make_image(self, rng: np.random.Generator, split: str, options: Options) -> Made: ...

    def header(self, options: Options) -> dict[str, Any]: ...  # extra dataset.json fields

    def owns(self, objects: Sequence[dict[str, Any]]) -> bool: ...  # object records this world wrote

    def ground(self, tokens: Sequence[Any], objects: list[dict[str, Any]], place: str | None = None) -> Any: ...

    def word_kind(self, token: str) -> str | None: ...  # one of WORD_KINDS, None: not this world's word


def get(name: str) -> World:
    """The world called ``name`` (ValueError for another name)."""
    if name not in NAMES:
        raise ValueError(f"world must be one of {', '.join(NAMES)}, not {name!r}")
    return importlib.import_module(f"sat_core.worlds.{name}")  # type: ignore[return-value]


def of(objects: Sequence[dict[str, Any]]) -> World:
    """The world whose generator wrote these object records (the shapes world's when none claims them)."""
    for name in reversed(NAMES):
        world = get(name)
        if world.owns(objects):
            return world
    return get("shapes")


def word_kind(token: str) -> str:
    """The kind of a caption word in any world: 'shape' | 'category' | 'colour' | 'size' | 'count' |
    'relation' | 'place' | 'function' (a word no world names)."""
    kinds = [kind for name in NAMES if (kind := get(name).word_kind(token)) is not None]
    return min(kinds, key=WORD_KINDS.index, default="function")


def error_labels() -> tuple[str, ...]:
    """Every error label any world's grounding can give, each once, the shapes world's first."""
    return tuple(dict.fromkeys(label for name in NAMES for label in get(name).ERROR_LABELS))
