"""sat_core.evaluation.caption_errors: labels from the references alone, word kinds learnt from the captions."""

from __future__ import annotations

import pytest

from sat_core.evaluation.caption_errors import WordStats, check_against_references


def _refs(*texts: str) -> list[list[str]]:
    return [t.split() for t in texts]


# Five images of a tiny photo set: "a"/"the"/"is" appear everywhere, object words only with their object.
CORPUS = [
    _refs("a dog runs on the grass", "a brown dog is running", "the dog plays on the grass", "a dog on grass",
          "a brown dog runs"),
    _refs("a cat sits on the sofa", "the cat is sleeping", "a grey cat on a sofa", "a cat is on the sofa",
          "the grey cat sleeps"),
    _refs("a man rides a bike", "the man is riding a red bike", "a man on a bike", "a person rides a bike",
          "the man on the red bike"),
    _refs("a red car on the road", "the car is red", "a car drives on a road", "a red car", "the red car drives"),
    _refs("a boy kicks a ball", "the boy is playing with a ball", "a boy and a ball", "a child kicks the ball",
          "the boy plays"),
]
STATS = WordStats.from_references(CORPUS, source="toy")


def test_lift_separates_content_from_function_words():
    for word in ("dog", "cat", "bike", "car", "ball", "sofa", "grass", "red"):
        assert STATS.kind(word) == "content", (word, STATS.lift.get(word))
    for word in ("a", "the", "is", "on"):
        assert STATS.kind(word) == "function", (word, STATS.lift.get(word))
    assert STATS.kind("dogs") == "content" and STATS.kind("zebra") == "content"  # plural; unseen
    assert STATS.kind("<unk>") == "unknown"
    assert STATS.lift["dog"] > 3 * STATS.lift["a"]
    assert WordStats.from_dict(STATS.to_dict()).kind("dog") == "content"


def test_a_good_caption_has_no_label():
    check = check_against_references("a brown dog runs on the grass".split(), CORPUS[0], STATS)
    assert check.labels == [] and check.first_error is None and check.hallucinated == []


@pytest.mark.parametrize("caption, finished, labels, first, hallucinated, missed", [
    ("a brown cat runs on the grass", True, ["hallucinated_word", "missed_word"], 2, ["cat"], ["dog"]),
    ("a dog dog runs on the grass", True, ["repetition"], 2, [], []),
    ("a brown dog runs on the grass a brown dog runs", True, ["repetition", "too_long"], 7, [], []),
    ("a dog <unk> on the grass", True, ["unk"], 2, [], []),
    ("a brown dog runs on", False, ["missed_word", "truncated"], None, [], ["grass"]),  # grass: 3 of 5 refs
    ("dog", True, ["missed_word", "too_short"], None, [], ["grass"]),
])
def test_each_label_on_hand_made_captions(caption, finished, labels, first, hallucinated, missed):
    check = check_against_references(caption.split(), CORPUS[0], STATS, finished=finished)
    assert check.labels == labels
    assert check.first_error == first and check.hallucinated == hallucinated and check.missed == missed
    assert len(check.kinds) == len(caption.split())


def test_function_words_are_never_missed_even_when_a_small_corpus_lifts_them():
    """On a small dataset "an" rides on the lift of the colour after it and "in" on that of the place: by lift alone
    both look like content. English function words are function words whatever their lift."""
    lifted = WordStats({"an": 40, "in": 40, "orange": 40, "cat": 40, "snow": 40},
                       {"an": 6.0, "in": 5.0, "orange": 6.0, "cat": 6.0, "snow": 5.0})
    assert lifted.kind("an") == lifted.kind("in") == lifted.kind("this") == "function"
    refs = _refs("an orange cat in the snow", "an orange cat sits in snow", "an orange cat in snow")
    check = check_against_references("a cat on the snow".split(), refs, lifted)
    assert check.missed == ["orange"]  # not "an", not "in"
    assert "hallucinated_word" not in check.labels  # "on" is no content word either


def test_a_caption_that_is_a_reference_has_no_word_label():
    lifted = WordStats({"an": 40, "in": 40, "orange": 40}, {"an": 6.0, "in": 5.0, "orange": 6.0})
    refs = _refs("an orange cat in the snow", "a cat", "a cat in a box", "a ginger cat in snow", "an orange cat")
    for ref in refs:
        check = check_against_references(ref, refs, lifted)
        assert not {"missed_word", "hallucinated_word"} & set(check.labels), (ref, check)
        assert check.missed == [] and check.hallucinated == []
