"""Check a caption against a scenes-world scene: categories, colours, counts, relations and the place.

The scenes counterpart of ``worlds.shapes.grounding``. ``parse`` reads mentions ``[count] [colour] noun``
(vocabulary from ``catalog``), relations between adjacent mentions (participles such as "standing" may sit
between a mention and its relation) and place words; ``ground`` matches mentions to objects
one-to-one and scores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from sat_core.worlds.matching import Labelled, OneToOne, Relation, mean, phrase_at
from sat_core.worlds.scenes.catalog import (
    COLOURS, COUNT_WORDS, NOUNS, PARTICIPLES, PLACE_WORDS, RELATION_PHRASES, RELATION_WORDS,
)
from sat_core.worlds.scenes.layout import relation_holds

ERROR_LABELS = ("wrong_category", "wrong_colour", "wrong_count", "wrong_relation", "wrong_place",
                "missed_object", "hallucinated_object")
_MAX_PHRASE = max(len(p) for p in RELATION_PHRASES)


def word_kind(token: str) -> str | None:
    """'category' | 'colour' | 'count' | 'relation' | 'place' for this world's words; None for any other."""
    if token in NOUNS:
        return "category"
    if token in COLOURS:
        return "colour"
    if token in COUNT_WORDS:
        return "count"
    if token in RELATION_WORDS:
        return "relation"
    if token in PLACE_WORDS:
        return "place"
    return None


@dataclass
class Mention:
    """'two red cars': count None = a plural noun without a number."""

    count: int | None
    colour: str | None
    category: str
    tokens: list[int]  # indices of the count word, colour and noun


@dataclass
class Parsed:
    mentions: list[Mention] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)
    places: list[tuple[int, str]] = field(default_factory=list)  # (token index, place)


def parse(tokens: Sequence[Any]) -> Parsed:
    """Mentions, relations and place words of any token list (unknown words break a mention)."""
    toks = [str(t).lower() for t in tokens]
    out = Parsed()
    pending: dict[str, Any] = {"idx": []}
    rel_wait: tuple[int, str, list[int]] | None = None
    last_end = -2  # token index where the last mention (plus its participles) ended
    i = 0
    while i < len(toks):
        found = phrase_at(toks, i, RELATION_PHRASES, _MAX_PHRASE)
        if found:
            rel, n = found
            left = len(out.mentions) - 1
            rel_wait = (left, rel, list(range(i, i + n))) if left >= 0 and last_end == i - 1 else None
            pending = {"idx": []}
            i += n
            continue
        tok = toks[i]
        if tok in COUNT_WORDS:
            pending = {"idx": [i], "count": COUNT_WORDS[tok]}
        elif tok in COLOURS:
            pending["colour"] = tok
            pending["idx"].append(i)
        elif tok in NOUNS:
            category, plural = NOUNS[tok]
            count = pending.get("count", None if plural else 1)
            idx = pending["idx"] + [i]
            out.mentions.append(Mention(count, pending.get("colour"), category, idx))
            if rel_wait is not None and idx[0] == rel_wait[2][-1] + 1:
                out.relations.append(Relation(rel_wait[0], rel_wait[1], len(out.mentions) - 1, rel_wait[2]))
            rel_wait, pending, last_end = None, {"idx": []}, i
        elif tok in PARTICIPLES and last_end == i - 1:
            last_end = i  # "a dog standing next to ..."
        else:
            if tok in PLACE_WORDS:
                out.places.append((i, PLACE_WORDS[tok]))
            rel_wait, pending = None, {"idx": []}
        i += 1
    return out


def _colour_ok(m: Mention, o: dict[str, Any]) -> bool:
    return m.colour is None or m.colour == o["colour"]


def _match(mentions: list[Mention], objects: list[dict[str, Any]]) -> list[list[int]]:
    """One-to-one: right category and colour, then right category (wrong colour), then, for
    mentions still unmatched, an object of the stated colour (wrong category). Mentions stating a
    colour go first so 'a car' does not take the object 'a red car' needs."""
    one = OneToOne(len(mentions))
    matches, take = one.matches, one.take
    order = sorted(range(len(mentions)), key=lambda k: (mentions[k].colour is None, k))
    limit = [m.count if m.count is not None else len(objects) for m in mentions]

    for k in order:
        m = mentions[k]
        take(k, [o for o in objects if o["category"] == m.category and _colour_ok(m, o)], limit[k])
    for k in order:
        take(k, [o for o in objects if o["category"] == mentions[k].category], limit[k])
    for k in order:
        m = mentions[k]
        if not matches[k] and m.colour is not None:
            take(k, [o for o in objects if o["colour"] == m.colour], m.count or 1)
    return matches


@dataclass
class CountItem:
    """One scored count: what the caption said of a kind of object against how many the scene holds.

    ``said`` is the stated number (None: a plural without one, "dogs"), or, for a group of identical
    objects named without one plural mention covering it ("a dog and a dog", "two dogs" of three),
    the most of the group any one mention named. ``scene``: how many of that kind the scene holds.
    ``colour``: the mention's stated colour (None when it states none), or the group's colour.
    """

    category: str
    colour: str | None
    said: int | None
    scene: int
    right: bool


def _count_items(mentions: list[Mention], matches: list[list[int]], objects: list[dict[str, Any]]) -> list[CountItem]:
    """Plural mentions (right iff the scene holds that many of what they matched), and scene groups
    of >= 2 identical objects that were named but not by one plural mention covering them all."""
    by_id = {o["id"]: o for o in objects}
    groups = {key: ids for key, ids in _kinds(objects).items() if len(ids) > 1}
    items, covered = [], set()
    for m, ids in zip(mentions, matches):
        if m.count == 1 or not ids:
            continue
        ref = by_id[ids[0]]
        n_scene = sum(o["category"] == ref["category"] and _colour_ok(m, o) for o in objects)
        right = n_scene == m.count if m.count is not None else n_scene >= 2
        items.append(CountItem(ref["category"], m.colour, m.count, n_scene, right))
        covered |= {key for key, g in groups.items() if g <= set(ids)}
    for (category, colour), g in groups.items():
        named = [len(g & set(ids)) for ids in matches]
        if (category, colour) not in covered and any(named):
            items.append(CountItem(category, colour, max(named), len(g), False))
    return items


@dataclass
class SceneGrounding(Labelled):
    """A caption matched against a scene. Scores are None where nothing could be scored."""

    LABELS: ClassVar[tuple[str, ...]] = ERROR_LABELS
    parsed: Parsed
    matches: list[list[int]]
    precision: float | None  # right mention units (category and colour) / mention units
    recall: float | None  # objects named with the right category and colour / objects
    category_accuracy: float | None  # over matched (mention unit, object) pairs
    colour_accuracy: float | None  # over matched pairs that state a colour
    count_accuracy: float | None  # over ``counts``
    relation_accuracy: float | None  # over stated relations whose mentions both matched
    place_accuracy: float | None  # over place words (needs the scene's place)
    errors: dict[str, int]
    token_objects: dict[int, list[int]]
    counts: list[CountItem] = field(default_factory=list)  # every scored count, right or wrong
    groups: list[int] = field(default_factory=list)  # the scene's groups of identical objects, sizes largest first


def ground(tokens: Sequence[Any], objects: list[dict[str, Any]], place: str | None = None) -> SceneGrounding:
    """Match a caption's mentions to the scene's objects (records of ``layout.layout_objects``)
    and score categories, colours, counts, relations (leniently) and the place."""
    parsed = parse(tokens)
    mentions = parsed.mentions
    matches = _match(mentions, objects)
    by_id = {o["id"]: o for o in objects}
    pairs = [(m, by_id[i]) for m, ids in zip(mentions, matches) for i in ids]
    right = [(m, o) for m, o in pairs if o["category"] == m.category and _colour_ok(m, o)]
    units = sum(m.count if m.count is not None else max(1, len(ids)) for m, ids in zip(mentions, matches))
    named = {o["id"] for _, o in right}
    category_ok = [m.category == o["category"] for m, o in pairs]
    colour_ok = [m.colour == o["colour"] for m, o in pairs if m.colour is not None]
    counts = _count_items(mentions, matches, objects)
    count_ok = [item.right for item in counts]
    relations = [all(relation_holds(r.relation, by_id[a], by_id[b]) for a in matches[r.a] for b in matches[r.b])
                 for r in parsed.relations if matches[r.a] and matches[r.b]]
    flying = any(o.get("layer") == "air" for o in objects)
    places = [] if place is None else [p == place or (p == "sky" and flying) for _, p in parsed.places]
    matched = {i for ids in matches for i in ids}
    errors = {
        "wrong_category": category_ok.count(False), "wrong_colour": colour_ok.count(False),
        "wrong_count": count_ok.count(False), "wrong_relation": relations.count(False),
        "wrong_place": places.count(False),
        "missed_object": sum(o["id"] not in matched for o in objects),
        "hallucinated_object": sum(not ids for ids in matches),
    }
    return SceneGrounding(
        parsed=parsed, matches=[sorted(ids) for ids in matches],
        precision=len(right) / units if units else None,
        recall=len(named) / len(objects) if objects else None,
        category_accuracy=mean(category_ok), colour_accuracy=mean(colour_ok),
        count_accuracy=mean(count_ok), relation_accuracy=mean(relations), place_accuracy=mean(places),
        errors={k: v for k, v in errors.items() if v},
        token_objects={t: sorted(ids) for m, ids in zip(mentions, matches) for t in m.tokens},
        counts=counts, groups=scene_groups(objects),
    )


def scene_groups(objects: list[dict[str, Any]]) -> list[int]:
    """How many objects each kind (category and colour) of the scene holds, largest first: [2, 1] for
    two trucks and an umbrella."""
    return sorted((len(ids) for ids in _kinds(objects).values()), reverse=True)


def _kinds(objects: list[dict[str, Any]]) -> dict[tuple[str, Any], set[int]]:
    """The ids of the scene's objects by kind: (category, colour)."""
    kinds: dict[tuple[str, Any], set[int]] = {}
    for o in objects:
        kinds.setdefault((o["category"], o["colour"]), set()).add(o["id"])
    return kinds
