"""Error labels of a generated caption from its references alone: for any dataset, masks or not.

Which words carry content is learnt from the captions themselves (``WordStats``): a word that names
what is in the image (dog, red, frisbee, running) tends to appear in most of an image's references
once one of them has it, far more often than in a random caption; a function word (a, the, of, is)
appears everywhere at about its base rate. The ratio of the two, the *lift*, separates them without
a list of content words, so the labels mean the same on Flickr8k, COCO or the embedded worlds. English
function words (``data.words.FUNCTION_WORDS``) are function words whatever their lift: "an" rides on
the lift of the colour it comes before and "in" on that of the place it introduces, and a caption that
says "on" where its references say "in" has not missed a word.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sat_core.data.vocab import UNK
from sat_core.data.words import FUNCTION_WORDS, is_function_word

REFERENCE_LABELS = ("hallucinated_word", "missed_word", "repetition", "unk", "truncated", "too_short", "too_long")
CONTENT_LIFT = 2.0  # a word at least this much likelier in an image's other references is content
MIN_COUNT = 3  # rarer words have no reliable lift; they count as content (rare words name things)
LENGTH_SLACK = (0.75, 1.25)  # too short / too long: beyond these shares of the shortest / longest reference
REPEAT_N = 4  # an n-gram of this length said twice is a repetition (two different objects differ sooner)


def _norm(word: str) -> str:
    """'dogs' and 'dog', 'crosses' and 'cross' are the same word for matching against references."""
    if len(word) > 4 and word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


_FUNCTION_NORMS = frozenset(_norm(w) for w in FUNCTION_WORDS)


@dataclass(frozen=True)
class WordStats:
    """Per word (normalised): its number of occurrences and its lift; ``kind`` reads them."""

    counts: dict[str, int] = field(default_factory=dict)
    lift: dict[str, float] = field(default_factory=dict)
    source: str = ""  # what the statistics were computed from

    @classmethod
    def from_references(cls, images: Iterable[Sequence[Sequence[str]]], *, source: str = "") -> "WordStats":
        """``images``: per image its references (token lists). Lift = P(w in another reference of the
        image | w in one) / P(w in a reference)."""
        counts: Counter[str] = Counter()
        in_refs: Counter[str] = Counter()  # references containing w
        pairs_hit: Counter[str] = Counter()  # ordered pairs (i, j≠i) of one image's refs both holding w
        pairs_all: Counter[str] = Counter()  # ordered pairs (i, j≠i) with w in ref i
        n_refs = 0
        for refs in images:
            sets = [{_norm(w) for w in ref} for ref in refs]
            n_refs += len(sets)
            for ref in refs:
                counts.update(_norm(w) for w in ref)
            for word, k in Counter(w for s in sets for w in s).items():
                in_refs[word] += k
                pairs_hit[word] += k * (k - 1)
                pairs_all[word] += k * (len(sets) - 1)
        lift = {w: (pairs_hit[w] / pairs_all[w]) / (in_refs[w] / n_refs) for w in in_refs if pairs_all[w]}
        return cls(dict(counts), lift, source)

    def kind(self, word: str) -> str:
        """'content' | 'function' | 'unknown' (<unk>)."""
        if word == UNK:
            return "unknown"
        w = _norm(word)
        if is_function_word(word) or w in _FUNCTION_NORMS:  # "this" is matched as "thi", "does" as "doe"
            return "function"
        if self.counts.get(w, 0) < MIN_COUNT or w not in self.lift:
            return "content"
        return "content" if self.lift[w] >= CONTENT_LIFT else "function"

    def to_dict(self) -> dict[str, Any]:
        return {"counts": self.counts, "lift": {w: round(v, 4) for w, v in self.lift.items()}, "source": self.source}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WordStats":
        return cls(dict(data.get("counts", {})), dict(data.get("lift", {})), str(data.get("source", "")))


@dataclass
class ReferenceCheck:
    labels: list[str]  # REFERENCE_LABELS that apply, in that order
    first_error: int | None  # index of the first wrong word (hallucinated, <unk>, repeated), if any
    hallucinated: list[str]  # content words in the caption and in no reference
    missed: list[str]  # content words in most references and not in the caption
    kinds: list[str]  # per caption word: WordStats.kind


def check_against_references(words: Sequence[str], references: Sequence[Sequence[str]], stats: WordStats,
                             *, finished: bool = True) -> ReferenceCheck:
    """Label a caption (words, no specials) against its references (token lists)."""
    words = list(words)
    kinds = [stats.kind(w) for w in words]
    if any(list(ref) == words for ref in references):  # it says what a reference says: no word of it is wrong
        references = [ref for ref in references if list(ref) == words]
    said = [{_norm(w) for w in ref} for ref in references]
    anywhere = set().union(*said) if said else set()
    wrong = [i for i, (w, k) in enumerate(zip(words, kinds)) if k == "content" and _norm(w) not in anywhere]
    hallucinated = [words[i] for i in wrong]
    unk = [i for i, w in enumerate(words) if w == UNK]
    repeated = _repeated_at(words)
    mine = {_norm(w) for w in words}
    majority = Counter(w for s in said for w in s)
    missed = sorted(w for w, n in majority.items()
                    if n > len(said) / 2 and stats.kind(w) == "content" and w not in mine)
    missed = [w for w in missed if not _leans_on(w, missed, references)]
    lengths = [len(r) for r in references] or [len(words)]
    found = {
        "hallucinated_word": bool(hallucinated), "missed_word": bool(missed), "repetition": repeated is not None,
        "unk": bool(unk), "truncated": not finished,
        "too_short": len(words) < LENGTH_SLACK[0] * min(lengths), "too_long": len(words) > LENGTH_SLACK[1] * max(lengths),
    }
    starts = wrong + unk + ([repeated] if repeated is not None else [])
    return ReferenceCheck([label for label in REFERENCE_LABELS if found[label]], min(starts) if starts else None,
                          hallucinated, missed, kinds)


def _leans_on(word: str, missed: Sequence[str], references: Sequence[Sequence[str]]) -> bool:
    """Whether every use of ``word`` in the references comes right before another missed word: its lift is that
    word's ("an" before "orange"), so missing it says nothing more."""
    after = [_norm(ref[i + 1]) if i + 1 < len(ref) else None
             for ref in references for i, w in enumerate(ref) if _norm(w) == word]
    others = set(missed) - {word}
    return bool(after) and all(a in others for a in after)


def _repeated_at(words: Sequence[str]) -> int | None:
    """Where a caption starts saying again what it said: a word twice in a row or a REPEAT_N-gram twice."""
    for i in range(1, len(words)):
        if words[i] == words[i - 1]:
            return i
    seen: set[tuple[str, ...]] = set()
    for i in range(len(words) - REPEAT_N + 1):
        gram = tuple(words[i : i + REPEAT_N])
        if gram in seen:
            return i
        seen.add(gram)
    return None
