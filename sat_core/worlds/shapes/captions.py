"""Reference captions for the shapes world: every object named, count words, sizes where needed, relations.

"there are two small green stars below a big red circle", "a blue square to the left of a red cross".
Every count word, adjective and shape noun is linked to the ids of the objects it names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sat_core.worlds.references import CAPTIONS_PER_IMAGE, MAX_CAPTION_TOKENS, Token, caption_records, joined
from sat_core.worlds.shapes.scene import CONVERSE, NUMBER_WORDS, RELATION_PHRASES, RELATIONS, SHAPES, relation_holds

_OPENERS = ((), ("there", "is"), ("the", "image", "shows"), ("a", "picture", "of"),
            ("we", "can", "see"))
_OPENER_P = (0.4, 0.2, 0.15, 0.1, 0.15)


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
    opener = () if plain else _OPENERS[int(rng.choice(len(_OPENERS), p=_OPENER_P))]
    return joined(clauses, opener, NUMBER_WORDS.values())


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
