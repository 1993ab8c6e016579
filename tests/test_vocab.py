"""sat_core.data.vocab: ids of special tokens, build order, encode/decode, and the checkpoint round trip."""

from __future__ import annotations

import pytest

from sat_core.errors import SatError
from sat_core.data.vocab import SPECIALS, Vocab


def test_build_orders_by_frequency_then_alphabet_and_caps_the_size():
    sentences = [["a", "red", "star"], ["a", "blue", "star"], ["a", "red", "circle"], ["zebra"]]
    vocab = Vocab.build(sentences, min_count=1, max_size=8)
    assert vocab.itos[:4] == list(SPECIALS)
    assert vocab.itos[4:] == ["a", "red", "star", "blue"]  # 3, 2, 2 (alphabetical), then the first of the 1s
    assert len(Vocab.build(sentences, min_count=2)) == 4 + 3


def test_encode_wraps_and_maps_unknown_words_and_decode_stops_at_end():
    vocab = Vocab([*SPECIALS, "a", "red", "star"])
    assert vocab.encode(["a", "green", "star"]) == [1, 4, 3, 6, 2]
    assert vocab.encode(["a"], add_specials=False) == [4]
    assert vocab.decode([1, 4, 5, 0, 6, 2, 5]) == ["a", "red", "star"]
    assert vocab.decode([4, 3]) == ["a", "<unk>"]


def test_round_trip_and_damaged_vocabularies_are_refused():
    vocab = Vocab([*SPECIALS, "a", "red"])
    assert Vocab.from_dict(vocab.to_dict()).itos == vocab.itos
    with pytest.raises(SatError, match="must start with"):
        Vocab(["a", *SPECIALS])
    with pytest.raises(SatError, match="duplicate"):
        Vocab([*SPECIALS, "a", "a"])
    with pytest.raises(SatError, match="not a list of words"):
        Vocab.from_dict({"words": "a red"})
