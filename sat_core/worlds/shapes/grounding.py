"""Check a caption against a shapes-world scene: shapes, colours, sizes, counts and relations.

``parse_caption`` reads the world's grammar (vocabulary from ``scene``) out of any token list, ``ground``
matches its mentions to the scene's objects one-to-one and scores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

from sat_core.worlds.matching import Labelled, OneToOne, Relation, mean, phrase_at
from sat_core.worlds.shapes.scene import (
    COLOURS, COUNT_WORDS, RELATION_PHRASES, RELATION_WORDS, SHAPE_WORDS, SIZE_WORDS, relation_holds,
)

ERROR_LABELS = ("wrong_colour", "wrong_shape", "wrong_size", "missed_object", "hallucinated_object",
                "wrong_relation", "wrong_count")
_MAX_PHRASE = max(len(p) for p in RELATION_PHRASES)


def word_kind(token: str) -> str | None:
    """'shape' | 'colour' | 'size' | 'count' | 'relation' for this world's words; None for any other."""
    if token in SHAPE_WORDS:
        return "shape"
    if token in COLOURS:
        return "colour"
    if token in SIZE_WORDS:
        return "size"
    if token in COUNT_WORDS:
        return "count"
    if token in RELATION_WORDS:
        return "relation"
    return None


@dataclass
class Mention:
    """'two small red circles': count None = a plural noun without a number."""

    count: int | None
    size: str | None
    colour: str | None
    shape: str
    tokens: list[int]  # indices of the count word, adjectives and noun


@dataclass
class Parsed:
    mentions: list[Mention] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)


def parse_caption(tokens: Sequence[Any]) -> Parsed:
    """Mentions ([count] [size] [colour] shape) and relations between adjacent mentions.

    Tolerates any token list: unknown words break a pending mention, modifiers without a noun are
    dropped, a repeated modifier keeps its last value. A relation needs a mention ending right
    before its phrase and one starting right after it.
    """
    toks = [str(t).lower() for t in tokens]
    out = Parsed()
    pending: dict[str, Any] = {"idx": []}
    rel_wait: tuple[int, str, list[int]] | None = None  # (left mention, relation, phrase tokens)
    i = 0
    while i < len(toks):
        found = phrase_at(toks, i, RELATION_PHRASES, _MAX_PHRASE)
        if found:
            rel, n = found
            left = len(out.mentions) - 1
            adjacent = left >= 0 and out.mentions[left].tokens[-1] == i - 1
            rel_wait = (left, rel, list(range(i, i + n))) if adjacent else None
            pending = {"idx": []}
            i += n
            continue
        tok, kind = toks[i], word_kind(toks[i])
        if kind == "count":
            pending = {"idx": [i], "count": COUNT_WORDS[tok]}
        elif kind in ("size", "colour"):
            pending[kind] = SIZE_WORDS[tok] if kind == "size" else tok
            pending["idx"].append(i)
        elif kind == "shape":
            shape, plural = SHAPE_WORDS[tok]
            count = pending.get("count", None if plural else 1)
            idx = pending["idx"] + [i]
            out.mentions.append(
                Mention(count, pending.get("size"), pending.get("colour"), shape, idx))
            if rel_wait is not None and idx[0] == rel_wait[2][-1] + 1:
                left, rel, phrase = rel_wait
                out.relations.append(Relation(left, rel, len(out.mentions) - 1, phrase))
            rel_wait, pending = None, {"idx": []}
        else:
            rel_wait, pending = None, {"idx": []}
        i += 1
    return out


@dataclass
class Grounding(Labelled):
    """A caption matched against a scene. Scores are None where nothing could be scored."""

    LABELS: ClassVar[tuple[str, ...]] = ERROR_LABELS
    parsed: Parsed
    matches: list[list[int]]  # per mention: matched object ids
    precision: float | None  # correct mention units / mention units (a count of n is n units)
    recall: float | None  # scene objects named with the right shape and colour / scene objects
    colour_accuracy: float | None  # over matched (mention unit, object) pairs that state a colour
    shape_accuracy: float | None  # over matched pairs
    size_accuracy: float | None  # over matched pairs that state a size
    count_accuracy: float | None  # over plural mentions and scene groups of identical objects
    relation_accuracy: float | None  # over relations whose two mentions both matched
    errors: dict[str, int]  # label -> occurrences, labels from ERROR_LABELS
    token_objects: dict[int, list[int]]  # mention token index -> matched object ids


def _agrees(m: Mention, o: dict[str, Any], attr: str) -> bool:
    value = getattr(m, attr)
    return value is None or value == o[attr]


def _match(mentions: list[Mention], objects: list[dict[str, Any]]) -> list[list[int]]:
    """One-to-one: exact attributes, then right shape+colour with the wrong size, then (only for
    mentions still unmatched) best partial match sharing shape or colour. Mentions that state a
    size go first so 'a red circle' does not take the object 'a small red circle' needs."""
    one = OneToOne(len(mentions))
    matches, take = one.matches, one.take
    order = sorted(range(len(mentions)), key=lambda k: (mentions[k].size is None,
                                                        mentions[k].colour is None, k))

    limit = [m.count if m.count is not None else len(objects) for m in mentions]
    for k in order:
        m = mentions[k]
        take(k, [o for o in objects if o["shape"] == m.shape and _agrees(m, o, "colour")
                 and _agrees(m, o, "size")], limit[k])
    for k in order:
        m = mentions[k]
        take(k, [o for o in objects if o["shape"] == m.shape and _agrees(m, o, "colour")], limit[k])
    for k in order:
        m = mentions[k]
        if matches[k]:
            continue
        partial = [o for o in objects if o["shape"] == m.shape or o["colour"] == m.colour]
        partial.sort(key=lambda o: -sum(o[a] == getattr(m, a) for a in ("shape", "colour", "size")))
        take(k, partial, m.count if m.count is not None else 2)
    return matches


def _count_items(mentions: list[Mention], matches: list[list[int]],
                 objects: list[dict[str, Any]]) -> list[bool]:
    """Plural mentions (right iff the scene holds that many of what they matched) and scene groups
    of >= 2 identical objects that were named but not by one plural mention covering them all."""
    by_id = {o["id"]: o for o in objects}
    groups: dict[tuple[str, str, str], set[int]] = {}
    for o in objects:
        groups.setdefault((o["shape"], o["colour"], o["size"]), set()).add(o["id"])
    groups = {key: ids for key, ids in groups.items() if len(ids) > 1}
    items, covered = [], set()
    for m, ids in zip(mentions, matches):
        if m.count == 1 or not ids:
            continue
        ref = by_id[ids[0]]  # judge the count against the kind of object it was grounded to
        n_scene = sum(o["shape"] == ref["shape"] and o["colour"] == ref["colour"]
                      and _agrees(m, o, "size") for o in objects)
        items.append(n_scene == m.count if m.count is not None else n_scene >= 2)
        covered |= {key for key, g in groups.items() if g <= set(ids)}
    named = {i for ids in matches for i in ids}
    items += [False for key, g in groups.items() if key not in covered and g & named]
    return items


def ground(tokens: Sequence[Any], objects: list[dict[str, Any]], place: str | None = None) -> Grounding:
    """Match a caption's mentions to scene objects (dicts with id, shape, colour, size, centroid)
    and score it (``place``: the scenes world's; this world has none).

    Matching is one-to-one and a mention of count n takes up to n objects: first objects with all
    stated attributes, then ones with the right shape and colour but the wrong size, then, for
    mentions with nothing yet, the best partial match sharing shape or colour. A matched object
    counts as named (precision, recall) when its shape and colour are right; size slips only give
    wrong_size. Colour / shape / size accuracy are over all matched (mention, object) pairs, so a
    partial match with the right shape and the wrong colour is a colour error, not a hallucination.
    A mention matching nothing is hallucinated, an object matched by nothing is missed. Relations
    are judged leniently (see ``scene.relation_holds``) for every pair of matched objects.
    """
    parsed = parse_caption(tokens)
    mentions = parsed.mentions
    matches = _match(mentions, objects)
    by_id = {o["id"]: o for o in objects}
    pairs = [(m, by_id[i]) for m, ids in zip(mentions, matches) for i in ids]
    right = [(m, o) for m, o in pairs if o["shape"] == m.shape and _agrees(m, o, "colour")]
    units = sum(m.count if m.count is not None else max(1, len(ids))
                for m, ids in zip(mentions, matches))
    named = {o["id"] for _, o in right}
    counts = _count_items(mentions, matches, objects)
    relations = [all(relation_holds(r.relation, by_id[a]["centroid"], by_id[b]["centroid"])
                     for a in matches[r.a] for b in matches[r.b])
                 for r in parsed.relations if matches[r.a] and matches[r.b]]
    colour_ok = [m.colour == o["colour"] for m, o in pairs if m.colour is not None]
    shape_ok = [m.shape == o["shape"] for m, o in pairs]
    size_ok = [m.size == o["size"] for m, o in pairs if m.size is not None]
    errors = {
        "wrong_colour": colour_ok.count(False), "wrong_shape": shape_ok.count(False),
        "wrong_size": size_ok.count(False),
        "missed_object": sum(o["id"] not in {i for ids in matches for i in ids} for o in objects),
        "hallucinated_object": sum(not ids for ids in matches),
        "wrong_relation": relations.count(False), "wrong_count": counts.count(False),
    }
    return Grounding(
        parsed=parsed, matches=[sorted(ids) for ids in matches],
        precision=len(right) / units if units else None,
        recall=len(named) / len(objects) if objects else None,
        colour_accuracy=mean(colour_ok), shape_accuracy=mean(shape_ok),
        size_accuracy=mean(size_ok),
        count_accuracy=mean(counts), relation_accuracy=mean(relations),
        errors={k: v for k, v in errors.items() if v},
        token_objects={t: sorted(ids) for m, ids in zip(mentions, matches) for t in m.tokens},
    )
