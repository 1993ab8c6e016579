"""Captions as words: typed text -> the words a model scores, English function words, and word-by-word differences
of two captions."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

_WORD = re.compile(r"[a-z0-9]+(?:['’-][a-z0-9]+)*")  # keeps "don't", "t-shirt"; drops "!", ",", "."


def caption_words(text: str) -> list[str]:
    """Lower-cased words of typed text with punctuation stripped: "Hexagons!" -> ["hexagons"]."""
    return _WORD.findall(text.lower())


# English closed-class words: articles and determiners, prepositions, conjunctions, pronouns, auxiliaries, particles.
# They name nothing in an image whatever a small corpus's statistics suggest: "an" is as frequent in an image's
# references as the colour it comes before, "in" as the place it introduces. Counts ("two") are not among them.
FUNCTION_WORDS = frozenset("""
    a an the this that these those some any each every another other such no
    of in on at by for from with without to into onto upon over under above below behind beside besides between
    among near next across along around through toward towards against off out up down about after before during
    while and or but nor so yet if then than as because although though whether
    i you he she it we they me him her us them my your his its our their itself himself herself themselves
    is are was were be been being am 's has have had having do does did can could will would shall should may might
    must there here where when which who whom whose what how not very too also just only
""".split())


def is_function_word(word: str) -> bool:
    """Whether ``word`` is an English function word (``FUNCTION_WORDS``): grammar, not content."""
    return word.lower() in FUNCTION_WORDS


@dataclass(frozen=True)
class WordEdit:
    """One aligned position of two captions: both words (same), one replaced, dropped or added."""

    op: str  # "same" | "replaced" | "dropped" | "added"
    before: str | None  # word of the first caption (None when added)
    after: str | None  # word of the second caption (None when dropped)
    before_index: int | None  # 0-based position in the first caption
    after_index: int | None


def word_diff(before: Sequence[str], after: Sequence[str]) -> list[WordEdit]:
    """Align two captions word by word (difflib's longest matching blocks), in reading order."""
    edits: list[WordEdit] = []
    matcher = difflib.SequenceMatcher(a=list(before), b=list(after), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            edits += [WordEdit("same", before[i1 + k], after[j1 + k], i1 + k, j1 + k) for k in range(i2 - i1)]
            continue
        pairs = min(i2 - i1, j2 - j1) if tag == "replace" else 0
        edits += [WordEdit("replaced", before[i1 + k], after[j1 + k], i1 + k, j1 + k) for k in range(pairs)]
        edits += [WordEdit("dropped", before[i], None, i, None) for i in range(i1 + pairs, i2)]
        edits += [WordEdit("added", None, after[j], None, j) for j in range(j1 + pairs, j2)]
    return edits


def first_change(edits: Sequence[WordEdit]) -> WordEdit | None:
    """The first position where the two captions differ, or None when they are the same."""
    return next((e for e in edits if e.op != "same"), None)
