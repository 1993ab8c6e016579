"""Reference-caption records every world writes: tokens, raw text and ``links`` to the objects each word names.

A record is ``{"tokens": [...], "raw": "...", "links": [[token_index, [object ids]], ...]}``; a link is kept
for each count word, adjective and noun, so captions and attention can be checked against object masks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

CAPTIONS_PER_IMAGE = 5
MAX_CAPTION_TOKENS = 22
Token = tuple[str, list[int] | None]  # word and the object ids it names


def caption_records(caps: list[list[tuple[str, list[int] | None]]], n: int) -> list[dict[str, Any]]:
    """n reference records {"tokens", "raw", "links"} cycling through captions of (word, object ids)."""
    out = []
    for cap in (caps[k % len(caps)] for k in range(n)):
        tokens = [w for w, _ in cap]
        links = [[t, sorted(ids)] for t, (_, ids) in enumerate(cap) if ids is not None]
        out.append({"tokens": tokens, "raw": " ".join(tokens), "links": links})
    return out


def joined(clauses: list[list[Token]], opener: Sequence[str], counts: Iterable[str]) -> list[Token]:
    """A caption: the opener ("there is" becomes "there are" before one of the plural ``counts``), then the
    clauses joined by "and"."""
    words = list(opener)
    if words == ["there", "is"] and clauses[0][0][0] in set(counts):
        words = ["there", "are"]
    tokens: list[Token] = [(w, None) for w in words]
    for c, clause in enumerate(clauses):
        tokens += ([("and", None)] if c else []) + clause
    return tokens
