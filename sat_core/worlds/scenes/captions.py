"""Reference captions for the scenes world, in the style of Flickr8k, every content word linked.

"a brown dog sitting next to a red car on the road", "two sheep in front of a house in a field",
"there is a kite above a person on the beach". A caption names every group of identical objects
(same category and colour) once, with its count; pairs of groups are joined by a relation when one
holds clearly (``layout.relation_holds(strict=True)``); most captions end with the place. The groups
come the largest first and equal ones left to right (``caption_order="largest_first"``, the shipped
world: "two trucks and an umbrella", so the first count word says how many the largest group holds, not
how many the leftmost one does), all left to right (``"left_to_right"``: by their leftmost member), so in
both "left of" is the one horizontal relation stated, or in random order (``"random"``).
Each count word, colour and noun is linked to the ids of the objects it names (``references``' ``links``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sat_core.worlds.references import CAPTIONS_PER_IMAGE, MAX_CAPTION_TOKENS, Token, caption_records, joined
from sat_core.worlds.scenes.catalog import (
    ACTIONS, CATEGORIES, CONVERSE, NUMBER_WORDS, PLACES, RELATION_PHRASES, RELATION_WORDS, RELATIONS,
)
from sat_core.worlds.scenes.layout import relation_holds

RELATION_P = 0.85  # try to join two groups by a relation (when one holds clearly)
PLACE_P = 0.8  # end the caption with the place
_OPENERS = ((), ("there", "is"), ("a", "photo", "of"), ("a", "picture", "of"), ("we", "can", "see"))
_OPENER_P = (0.5, 0.15, 0.12, 0.1, 0.13)
# Relations other than left/right say more about the scene: prefer them when several hold.
_RELATION_WEIGHT = {"left_of": 1.0, "right_of": 1.0, "in_front_of": 2.0, "behind": 2.0,
                    "above": 2.5, "below": 1.5, "next_to": 2.0}

def groups(objects: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Objects grouped by (category, colour), in first-appearance order."""
    out: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for o in objects:
        out.setdefault((o["category"], o["colour"]), []).append(o)
    return list(out.values())


def _mention(group: list[dict[str, Any]], colour: bool, action: bool, rng: np.random.Generator) -> list[Token]:
    """'a red car' / 'two sheep' (+ 'parked'): count, colour and noun linked to the group's ids."""
    ids = [o["id"] for o in group]
    cat = CATEGORIES[group[0]["category"]]
    words = ([group[0]["colour"]] if colour else []) + [cat.plural if len(group) > 1 else cat.name]
    count = NUMBER_WORDS[len(group)] if len(group) > 1 else ("an" if words[0][0] in "aeiou" else "a")
    tokens: list[Token] = [(w, ids) for w in [count, *words]]
    if action and cat.name in ACTIONS:
        options = ACTIONS[cat.name]
        tokens.append((options[int(rng.integers(len(options)))], None))
    return tokens


def _relations(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[str]:
    """Relations holding strictly between every object of a and every object of b."""
    return [r for r in RELATIONS if all(relation_holds(r, x, y, strict=True) for x in a for y in b)]


def _phrase(relation: str, rng: np.random.Generator) -> list[Token]:
    options = [p for p, r in RELATION_PHRASES.items() if r == relation]
    return [(w, None) for w in options[int(rng.integers(len(options)))]]


def caption(gs: list[list[dict[str, Any]]], place: str, rng: np.random.Generator,
            caption_order: str = "largest_first") -> list[Token]:
    """One caption naming every group, with relations where they hold and (usually) the place."""
    cats = [g[0]["category"] for g in gs]
    need_colour = [cats.count(c) > 1 for c in cats]  # colour tells same-category groups apart

    def mention(i: int, action: bool) -> list[Token]:
        say = gs[i][0]["colour"] is not None and (
            need_colour[i] or rng.random() < CATEGORIES[cats[i]].say_colour)
        return _mention(gs[i], say, action, rng)

    left_to_right = caption_order in ("left_to_right", "largest_first")  # then never "right of"
    if left_to_right:  # as a reader scans the picture, each group where its leftmost member stands
        largest = caption_order == "largest_first"
        order = sorted(range(len(gs)), key=lambda g: (-len(gs[g]) if largest else 0,
                                                      min(o["centroid"][0] for o in gs[g])))
    else:
        order = [int(i) for i in rng.permutation(len(gs))]
    clauses: list[list[Token]] = []
    k = 0
    while k < len(order):
        i = order[k]
        if k + 1 < len(order) and rng.random() < RELATION_P:
            if not left_to_right:
                # the first later group that stands in a clear relation to this one becomes its partner
                partner = next((m for m in range(k + 1, len(order)) if _relations(gs[i], gs[order[m]])), None)
                if partner is not None:
                    order.insert(k + 1, order.pop(partner))
            j = order[k + 1]
            # left to right, the order of the mentions says where things are: never "right of"
            rels = [r for r in _relations(gs[i], gs[j]) if not (left_to_right and r == "right_of")]
            if rels:
                w = np.array([_RELATION_WEIGHT[r] for r in rels])
                rel = rels[int(rng.choice(len(rels), p=w / w.sum()))]
                if not left_to_right and rng.random() < 0.3:  # the same fact with the mentions swapped
                    i, j, rel = j, i, CONVERSE[rel]
                clauses.append(mention(i, rng.random() < 0.25) + _phrase(rel, rng) + mention(j, False))
                k += 2
                continue
        clauses.append(mention(i, len(order) == 1 and rng.random() < 0.5))
        k += 1
    tokens = joined(clauses, _OPENERS[int(rng.choice(len(_OPENERS), p=_OPENER_P))], NUMBER_WORDS.values())
    if rng.random() < PLACE_P:
        options = PLACES[place]
        tokens += [(w, None) for w in options[int(rng.integers(len(options)))].split()]
    return tokens


def describe(objects: list[dict[str, Any]], place: str, rng: np.random.Generator,
             n: int = CAPTIONS_PER_IMAGE, caption_order: str = "largest_first") -> list[dict[str, Any]]:
    """n reference captions (distinct where the grammar allows): {"tokens", "raw", "links"}."""
    gs = groups(objects)
    found: dict[tuple[str, ...], list[Token]] = {}
    for _ in range(10 * n):
        cap = caption(gs, place, rng, caption_order)
        if len(cap) <= MAX_CAPTION_TOKENS:
            found.setdefault(tuple(w for w, _ in cap), cap)
        if len(found) == 2 * n:
            break
    # Captions that state a relation first: beam search imitates the most common pattern, and bare
    # enumerations would win over relations if they were as common (the shapes models never state one).
    caps = sorted(found.values(), key=lambda cap: not any(w in RELATION_WORDS for w, _ in cap))[:n]
    if not caps:  # four groups with long phrases: name them plainly
        plain: list[Token] = []
        for c, g in enumerate(gs):
            plain += ([("and", None)] if c else []) + _mention(g, False, False, rng)
        caps = [plain]
    return caption_records(caps, n)
