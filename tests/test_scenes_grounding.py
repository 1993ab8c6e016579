"""Grounding captions in the scenes world: hand-made captions get the right scores and error labels."""

import numpy as np
import pytest

from sat_core.worlds.scenes import layout as scenes
from sat_core.worlds.scenes import captions as scenes_captions
from sat_core.evaluation.grounding import ERROR_LABELS, aggregate, ground, word_kind
from sat_core.worlds.scenes.grounding import SceneGrounding, parse


def _obj(oid, category, colour, bbox, layer="ground"):
    x, y, w, h = bbox
    return {"id": oid, "category": category, "colour": colour, "layer": layer, "full_bbox": bbox,
            "bbox": bbox, "foot": y + h, "centroid": [x + w / 2, y + h / 2]}


# A road: a red car on the left, a blue car on the right, a brown dog in front of the red car,
# a kite in the sky above the dog.
SCENE = [
    _obj(0, "car", "red", [10, 100, 70, 40]),
    _obj(1, "car", "blue", [140, 100, 70, 40]),
    _obj(2, "dog", "brown", [30, 130, 40, 40]),
    _obj(3, "kite", None, [30, 10, 30, 30], layer="air"),
]


def g(caption, place="road"):
    out = ground(caption.split(), SCENE, place)
    assert isinstance(out, SceneGrounding)
    return out


def test_a_true_caption_scores_perfectly():
    out = g("a red car to the left of a blue car and a brown dog in front of a red car on the road")
    assert out.relation_accuracy == 1.0 and out.place_accuracy == 1.0
    assert out.category_accuracy == 1.0 and out.colour_accuracy == 1.0
    assert out.errors.get("wrong_relation") is None
    full = g("a red car and a blue car and a brown dog and a kite on the street")
    assert full.precision == 1.0 and full.recall == 1.0 and full.labels == []


def test_wrong_relation_colour_category_count_place():
    assert g("a blue car to the left of a red car").labels == ["wrong_relation", "missed_object"]
    assert g("a blue car to the left of a red car").relation_accuracy == 0.0
    out = g("a green car")
    assert "wrong_colour" in out.labels and out.precision == 0.0 and out.colour_accuracy == 0.0
    out = g("a brown horse")  # matched to the brown dog by colour: a category error
    assert "wrong_category" in out.labels and out.category_accuracy == 0.0
    assert g("two dogs").labels == ["wrong_count", "missed_object"]
    assert g("two cars").count_accuracy == 1.0
    assert "wrong_place" in g("a red car on the beach").labels
    assert g("a red car on the beach").place_accuracy == 0.0


def test_missed_and_hallucinated_objects():
    out = g("a cat next to a red car")
    assert out.errors["hallucinated_object"] == 1 and out.errors["missed_object"] == 3
    assert out.recall == 0.25 and out.precision == 0.5


def test_participles_keep_relations_and_sky_is_fine_with_a_kite():
    out = g("a dog standing in front of a red car")
    assert [(r.a, r.relation, r.b) for r in out.parsed.relations] == [(0, "in_front_of", 1)]
    assert out.relation_accuracy == 1.0
    out = g("a kite flying above a dog in the sky")
    assert out.relation_accuracy == 1.0 and out.place_accuracy == 1.0
    assert g("a kite below a dog").relation_accuracy == 0.0


def test_parse_reads_counts_colours_nouns_and_places():
    p = parse("there are two sheep next to three white sheep in a field".split())
    assert [(m.count, m.colour, m.category) for m in p.mentions] == [(2, None, "sheep"), (3, "white", "sheep")]
    assert [(r.relation) for r in p.relations] == ["next_to"]
    assert p.places == [(11, "grass")]
    assert parse("a photo of a dog".split()).mentions[0].tokens == [3, 4]


def test_token_objects_link_words_to_matched_objects():
    out = g("two cars and a kite")
    assert out.token_objects == {0: [0, 1], 1: [0, 1], 3: [3], 4: [3]}


def test_word_kinds_cover_both_worlds():
    assert [word_kind(w) for w in ["dog", "cars", "red", "white", "two", "front", "beach", "circle", "the"]] == [
        "category", "category", "colour", "colour", "count", "relation", "place", "shape", "function"]
    assert {"wrong_category", "wrong_place"} <= set(ERROR_LABELS)


def test_generated_references_ground_perfectly():
    rows = []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        layout = scenes.generate_layout(rng)
        objects = scenes.layout_objects(layout)
        for cap in scenes_captions.describe(objects, layout.place, rng):
            out = ground(cap["tokens"], objects, layout.place)
            assert out.labels == [], (cap["raw"], out.errors)
            rows.append(out)
    agg = aggregate(rows)
    for key in ("precision", "recall", "category_accuracy", "count_accuracy", "relation_accuracy", "place_accuracy"):
        assert agg[key] == pytest.approx(1.0), key
    assert agg["wrong_category_rate"] == 0.0
    stated = np.mean([bool(r.parsed.relations) for r in rows])
    assert agg["relations_stated"] == pytest.approx(stated) and 0.3 < stated < 1.0


TWO_DOGS = [_obj(0, "dog", "brown", [0, 100, 30, 30]), _obj(1, "dog", "brown", [100, 100, 30, 30]),
            _obj(2, "cat", "black", [50, 100, 30, 30])]


@pytest.mark.parametrize("caption, said, scene, right", [
    ("two dogs and a cat", 2, 2, True),
    ("dogs next to a cat", None, 2, True),  # a plural without a number is right for two or more
    ("three dogs", 3, 2, False),
    ("two cats", 2, 1, False),  # one cat said to be two
    ("a dog and a cat", 1, 2, False),  # a group of two named as one
    ("a dog and a dog", 1, 2, False),  # named one at a time: no mention covers the group
])
def test_counts_say_what_was_said_against_the_scene(caption, said, scene, right):
    out = ground(caption.split(), TWO_DOGS)
    assert [(c.said, c.scene, c.right) for c in out.counts] == [(said, scene, right)]
    assert out.count_accuracy == float(right)
    assert ("wrong_count" in out.labels) == (not right)
    assert out.to_dict()["counts"][0]["said"] == said  # the records keep them


def test_singular_mentions_of_single_objects_are_not_counts():
    assert ground("a brown dog next to a black cat".split(), TWO_DOGS[1:]).counts == []
