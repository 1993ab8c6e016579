"""Word kinds in evaluation's summaries (β and α entropy by kind): an embedded world's word lists hold on that
world's images only; on other data a word is content or function by what is known of that data (the checkpoint's
word statistics), and "unclassified" when nothing is."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sat_core import worlds
from sat_core.data.images import CropInfo
from sat_core.data.karpathy import ImageRecord, load_karpathy
from sat_core.data.words import is_function_word
from sat_core.decoding import Hypothesis
from sat_core.evaluation.caption_errors import WordStats
from sat_core.evaluation.evaluate import Decoded, beta_by_kind, dataset_world, summary_kind
from sat_core.worlds.writer import generate

PHOTOS = [[s.split() for s in refs] for refs in (
    ("an astronaut floats in space", "the astronaut in a white suit", "an astronaut near a rocket"),
    ("a red bus on the road", "the red bus drives on a street", "a big red bus"),
    ("a dog in the snow", "the dog runs in snow", "a brown dog plays in the snow"),
)]
STATS = WordStats.from_references(PHOTOS, source="photos")


def test_a_world_s_word_lists_hold_on_that_world_s_data_only():
    scenes = worlds.get("scenes")
    assert summary_kind("red", STATS, scenes) == "colour"
    assert summary_kind("red", STATS) == "content"  # a photo dataset: its captions decide
    assert summary_kind("astronaut", STATS) == "content"
    assert summary_kind("the", STATS) == summary_kind("in", STATS) == summary_kind("an", STATS) == "function"
    assert summary_kind("astronaut", WordStats()) == "unclassified"  # nothing known: not guessed
    assert summary_kind("the", WordStats()) == "function"  # English grammar is known everywhere
    assert is_function_word("The") and not is_function_word("two")


def _decoded(words: list[str], objects=None) -> Decoded:
    """One decoded image saying ``words``, its β rising word by word; ``objects``: a world's scene."""
    T = len(words) + 1
    record = ImageRecord(path=Path("photo.jpg"), split="test", sentences=[words], raw=[],
                         id=1, karpathy_split="test", objects=objects)
    hyp = Hypothesis(list(range(4, 4 + len(words))) + [2], list(words), -1.0, -1.0, np.full((T, 4), 0.25),
                     np.linspace(0.1, 0.9, T), np.full(T, -1), True, (2, 2))
    return Decoded(0, record, hyp, CropInfo(0, 0, 224, 224, 1.0, (224, 224), 224))


def test_beta_by_kind_on_a_photo_dataset_uses_no_world_kind():
    decoded = [_decoded("a red bus near an astronaut in the snow".split())]
    assert dataset_world(decoded) is None
    kinds = beta_by_kind(decoded, STATS)
    assert set(kinds) <= {"content", "function", "unclassified"}
    assert kinds["content"]["n"] == 4 and kinds["function"]["n"] == 5  # red bus astronaut snow | a near an in the
    assert sum(v["n"] for v in kinds.values()) == 9


def test_on_a_world_s_images_its_kinds_are_used(tmp_path):
    path = generate(tmp_path, 0, 0, 1, seed=1, workers=1, kind="scenes")
    record = load_karpathy(path, tmp_path).images[0]
    decoded = [_decoded(record.sentences[0], record.objects)]
    assert dataset_world(decoded) is worlds.get("scenes")
    kinds = beta_by_kind(decoded, STATS)
    assert {"category"} <= set(kinds)
