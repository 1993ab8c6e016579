"""Typed captions -> words, and word-by-word differences of two captions."""

from __future__ import annotations

from sat_core.data.words import WordEdit, caption_words, first_change, word_diff


def test_caption_words_strip_punctuation_and_case():
    assert caption_words("Two red hexagons!") == ["two", "red", "hexagons"]
    assert caption_words("a circle, left of  a star.") == ["a", "circle", "left", "of", "a", "star"]
    assert caption_words("don't t-shirt") == ["don't", "t-shirt"]
    assert caption_words(" ?! ") == []


def test_word_diff_aligns_same_replaced_dropped_and_added_words():
    before = "there is a big red circle".split()
    after = "a small red circle and a star".split()
    edits = word_diff(before, after)
    assert [e.op for e in edits] == ["dropped", "dropped", "same", "replaced", "same", "same", "added", "added", "added"]
    assert edits[3] == WordEdit("replaced", "big", "small", 3, 1)
    assert [e.before for e in edits if e.op != "added"] == before
    assert [e.after for e in edits if e.op != "dropped"] == after
    assert first_change(edits) == WordEdit("dropped", "there", None, 0, None)


def test_word_diff_of_equal_captions_has_no_change():
    words = "a red circle".split()
    edits = word_diff(words, words)
    assert all(e.op == "same" for e in edits) and first_change(edits) is None
    assert [e.op for e in word_diff(words, [])] == ["dropped"] * 3
