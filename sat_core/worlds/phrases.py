"""What the worlds' caption parsers share: relations between adjacent mentions, found by their phrases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass
class Relation:
    """Mention a stands in `relation` to mention b ('a left_of b')."""

    a: int
    relation: str
    b: int
    tokens: list[int]


def phrase_at(tokens: Sequence[str], i: int, phrases: dict[tuple[str, ...], str],
              longest: int) -> tuple[str, int] | None:
    """The longest of ``phrases`` (word tuple -> relation) starting at i, as (relation, length)."""
    for n in range(min(longest, len(tokens) - i), 0, -1):
        rel = phrases.get(tuple(tokens[i:i + n]))
        if rel:
            return rel, n
    return None
