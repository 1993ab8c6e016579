"""Words <-> ids. Saved inside every checkpoint so decoding maps ids back to the same words."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from sat_core.errors import SatError

PAD, START, END, UNK = "<pad>", "<start>", "<end>", "<unk>"
SPECIALS = (PAD, START, END, UNK)


class Vocab:
    """A fixed vocabulary; ids 0..3 are <pad> <start> <end> <unk>."""

    pad_id, start_id, end_id, unk_id = 0, 1, 2, 3

    def __init__(self, words: Sequence[str]) -> None:
        if tuple(words[:4]) != SPECIALS:
            raise SatError(f"A vocabulary must start with {list(SPECIALS)}; got {list(words[:4])}.")
        if len(set(words)) != len(words):
            raise SatError("The vocabulary has duplicate words; rebuild it from the dataset.")
        self.itos: list[str] = list(words)
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}

    @classmethod
    def build(
        cls, sentences: Iterable[Sequence[str]], *, min_count: int = 1, max_size: int = 10_000
    ) -> "Vocab":
        """Build from tokenised training sentences: most frequent first, ties alphabetical."""
        counts = Counter(tok for sent in sentences for tok in sent)
        kept = [w for w, c in counts.items() if c >= min_count and w not in SPECIALS]
        kept.sort(key=lambda w: (-counts[w], w))
        return cls(list(SPECIALS) + kept[: max(0, max_size - len(SPECIALS))])

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str], *, add_specials: bool = True) -> list[int]:
        """Tokens -> ids, unknown words -> <unk>; wrapped in <start> … <end> by default."""
        ids = [self.stoi.get(t, self.unk_id) for t in tokens]
        return [self.start_id, *ids, self.end_id] if add_specials else ids

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Ids -> words, stopping at <end> and dropping <start>/<pad>."""
        words = []
        for i in ids:
            i = int(i)
            if i == self.end_id:
                break
            if i in (self.start_id, self.pad_id):
                continue
            words.append(self.itos[i])
        return words

    def to_dict(self) -> dict[str, Any]:
        return {"words": self.itos}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Vocab":
        words = data.get("words") if isinstance(data, dict) else None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise SatError("The checkpoint's vocabulary is not a list of words; the config.json is damaged.")
        return cls(words)
