"""What the worlds' groundings share: relation phrases between adjacent mentions, one-to-one matching of
mentions to objects, the error labels a result carries, means over what could be scored."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Sequence

import numpy as np


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


class OneToOne:
    """Mentions matched to objects one-to-one: each object goes to the first mention that takes it."""

    def __init__(self, mentions: int) -> None:
        self.used: set[int] = set()
        self.matches: list[list[int]] = [[] for _ in range(mentions)]

    def take(self, k: int, candidates: list[dict[str, Any]], limit: int) -> None:
        """Give mention ``k`` the free candidates in their order, until it holds ``limit`` objects."""
        for o in candidates:
            if len(self.matches[k]) < limit and o["id"] not in self.used:
                self.used.add(o["id"])
                self.matches[k].append(o["id"])


class Labelled:
    """A grounding result's error labels (``LABELS``, the world's ERROR_LABELS, in that order) and a plain dict."""

    LABELS: ClassVar[tuple[str, ...]] = ()

    @property
    def labels(self) -> list[str]:
        """The error labels that occur, in ``LABELS`` order."""
        return [label for label in self.LABELS if self.errors.get(label)]  # type: ignore[attr-defined]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)  # type: ignore[call-overload]
        out["labels"] = self.labels
        return out


def mean(flags: list[bool]) -> float | None:
    """The share of True among ``flags``; None when nothing could be scored."""
    return float(np.mean(flags)) if flags else None
