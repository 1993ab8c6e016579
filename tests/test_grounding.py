"""Grounding: references score perfectly, corrupted captions get the right error label,
attention correctness matches hand-computed values."""

import random

import numpy as np
import pytest

from sat_core.worlds.shapes import captions as shape_captions
from sat_core.worlds.shapes import scene as shapes
from sat_core.evaluation.grounding import (
    ERROR_LABELS, aggregate, attention_ceiling, attention_correctness, attention_elsewhere, ground, mask_entropy,
    word_kind,
)
from sat_core.worlds.shapes.grounding import parse_caption


@pytest.fixture(scope="module")
def scenes():
    """60 scenes in memory: (objects, five reference sentences)."""
    out = []
    for seed in range(60):
        rng = np.random.default_rng(1000 + seed)
        objects = shapes.scene_objects(shapes.generate_scene(rng))
        out.append((objects, shape_captions.describe(objects, rng)))
    return out


def _obj(oid, shape, colour, size, x, y):
    return {"id": oid, "shape": shape, "colour": colour, "size": size, "centroid": [x, y]}


# a big red circle on the left, a small blue square on the right, two small green stars below
SCENE = [_obj(0, "circle", "red", "big", 20, 40), _obj(1, "square", "blue", "small", 90, 40),
         _obj(2, "star", "green", "small", 30, 95), _obj(3, "star", "green", "small", 80, 95)]


def test_word_kinds_come_from_the_world_vocabulary():
    kinds = [word_kind(w) for w in "two large purple hexagons left of a cross and the xyz".split()]
    assert kinds == ["count", "size", "colour", "shape", "relation", "function", "count", "shape",
                     "function", "function", "function"]


def test_parse_mentions_and_relations():
    p = parse_caption("there are two small green stars below a big red circle and a blue square".split())
    assert [(m.count, m.size, m.colour, m.shape, m.tokens) for m in p.mentions] == [
        (2, "small", "green", "star", [2, 3, 4, 5]), (1, "big", "red", "circle", [7, 8, 9, 10]),
        (1, None, "blue", "square", [12, 13, 14])]
    assert [(r.a, r.relation, r.b, r.tokens) for r in p.relations] == [(0, "below", 1, [6])]
    p = parse_caption("a red circle to the left of a blue square".split())
    assert [(r.a, r.relation, r.b) for r in p.relations] == [(0, "left_of", 1)]


def test_every_reference_caption_grounds_perfectly(scenes):
    n_rel = n_count = 0
    for objects, sentences in scenes:
        for s in sentences:
            g = ground(s["tokens"], objects)
            assert g.errors == {} and g.labels == [], s["raw"]
            for score in (g.precision, g.recall, g.colour_accuracy, g.shape_accuracy):
                assert score == 1.0, s["raw"]
            assert g.relation_accuracy in (None, 1.0) and g.count_accuracy in (None, 1.0)
            assert g.size_accuracy in (None, 1.0)
            assert g.token_objects == {t: ids for t, ids in s["links"]}
            n_rel += g.relation_accuracy is not None
            n_count += g.count_accuracy is not None
    assert n_rel > 20 and n_count > 20  # the check covered relations and counts


def test_hand_built_scene_scores():
    g = ground("a big red circle left of a small blue square and two small green stars".split(), SCENE)
    assert (g.precision, g.recall, g.relation_accuracy, g.count_accuracy) == (1.0, 1.0, 1.0, 1.0)
    assert g.matches == [[0], [1], [2, 3]] and g.token_objects[13] == [2, 3]
    # wrong colour: both objects found, the square named red
    g = ground("a red circle and a red square".split(), SCENE)
    assert g.labels == ["wrong_colour", "missed_object"] and g.errors["missed_object"] == 2
    assert (g.precision, g.recall, g.colour_accuracy, g.shape_accuracy) == (0.5, 0.25, 0.5, 1.0)
    assert g.matches == [[0], [1]]
    # generated relations are judged leniently: any difference in the stated direction counts
    close = [_obj(0, "circle", "red", "big", 50, 40), _obj(1, "square", "blue", "small", 55, 90)]
    assert ground("a red circle left of a blue square".split(), close).relation_accuracy == 1.0
    assert ground("a red circle right of a blue square".split(), close).relation_accuracy == 0.0


def test_specific_mentions_are_matched_first_and_counts_checked_against_the_scene():
    scene = [_obj(0, "circle", "red", "small", 20, 40), _obj(1, "circle", "red", "big", 90, 40)]
    g = ground("a red circle and a small red circle".split(), scene)
    assert g.matches == [[1], [0]] and g.labels == [] and g.size_accuracy == 1.0
    extra_star = SCENE + [_obj(4, "star", "green", "big", 55, 60)]
    g = ground("a red circle and a blue square and two green stars".split(), extra_star)
    assert g.labels == ["missed_object", "wrong_count"] and g.count_accuracy == 0.0


def _replace(tokens, i, word):
    return tokens[:i] + [word] + tokens[i + 1:]


def test_corrupted_colour_gets_wrong_colour(scenes):
    for objects, sentences in scenes:
        s = sentences[0]
        ti, oids = s["links"][-1]  # the last linked token is a shape noun; the one before a colour
        colour_at = ti - 1
        shape = shapes.SHAPE_WORDS[s["tokens"][ti]][0]
        taken = {o["colour"] for o in objects if o["shape"] == shape}
        new = next(c for c in shapes.COLOURS if c not in taken)
        g = ground(_replace(s["tokens"], colour_at, new), objects)
        assert g.errors.get("wrong_colour") == len(oids), (s["raw"], new)
        assert g.colour_accuracy < 1.0 and g.precision < 1.0 and g.shape_accuracy == 1.0


def test_corrupted_shape_and_size_get_their_labels(scenes):
    for objects, sentences in scenes:
        s = sentences[0]
        ti, oids = s["links"][-1]
        shape, plural = shapes.SHAPE_WORDS[s["tokens"][ti]]
        colour = s["tokens"][ti - 1]
        taken = {o["shape"] for o in objects if o["colour"] == colour}
        new = next(x for x in shapes.SHAPES if x not in taken)
        g = ground(_replace(s["tokens"], ti, shapes.SHAPES[new] if plural else new), objects)
        assert "wrong_shape" in g.labels and g.shape_accuracy < 1.0, s["raw"]
    g = ground("a big blue square".split(), SCENE)
    assert "wrong_size" in g.labels and g.size_accuracy == 0.0 and g.precision == 1.0


def test_dropped_object_is_missed_and_extra_object_hallucinated(scenes):
    for objects, _ in scenes:
        groups = shape_captions._groups(objects)
        phrase = lambda g: [shapes.NUMBER_WORDS.get(len(g), "a"), g[0]["size"], g[0]["colour"],  # noqa: E731
                            shapes.SHAPES[g[0]["shape"]] if len(g) > 1 else g[0]["shape"]]
        full = [w for g in groups for w in ["and", *phrase(g)]][1:]
        assert ground(full, objects).labels == []
        if len(groups) > 1:
            dropped = [w for g in groups[1:] for w in ["and", *phrase(g)]][1:]
            g = ground(dropped, objects)
            assert g.labels == ["missed_object"] and g.recall < 1.0 and g.precision == 1.0
        present = {(o["shape"], o["colour"]) for o in objects}
        extra = next((s, c) for s in shapes.SHAPES for c in shapes.COLOURS
                     if s not in {o["shape"] for o in objects} and c not in {o["colour"] for o in objects})
        assert extra not in present
        g = ground(full + ["and", "a", extra[1], extra[0]], objects)
        assert g.labels == ["hallucinated_object"] and g.recall == 1.0 and g.precision < 1.0


def test_flipped_relation_gets_wrong_relation(scenes):
    flipped = 0
    for objects, sentences in scenes:
        for s in sentences:
            p = parse_caption(s["tokens"])
            if not p.relations:
                continue
            r = p.relations[0]
            phrase = {"left_of": ["right", "of"], "right_of": ["left", "of"],
                      "above": ["below"], "below": ["above"]}[r.relation]
            tokens = s["tokens"][:r.tokens[0]] + phrase + s["tokens"][r.tokens[-1] + 1:]
            g = ground(tokens, objects)
            assert g.errors.get("wrong_relation", 0) >= 1 and g.relation_accuracy < 1.0, s["raw"]
            assert g.precision == 1.0 and g.recall == 1.0
            flipped += 1
    assert flipped > 10
    assert ground("a red circle right of a blue square".split(), SCENE).labels == ["missed_object",
                                                                                   "wrong_relation"]


def test_changed_count_gets_wrong_count(scenes):
    changed = 0
    for objects, sentences in scenes:
        for s in sentences:
            for ti, oids in s["links"]:
                if s["tokens"][ti] in ("two", "three") and len(oids) in (2, 3):
                    g = ground(_replace(s["tokens"], ti, {"two": "three", "three": "two"}[s["tokens"][ti]]),
                               objects)
                    assert "wrong_count" in g.labels and g.count_accuracy < 1.0, s["raw"]
                    changed += 1
                    break
    assert changed > 5
    g = ground("a big red circle and a small blue square and a green star".split(), SCENE)
    assert g.labels == ["missed_object", "wrong_count"] and g.count_accuracy == 0.0
    g = ground("two red circles and a blue square and two green stars".split(), SCENE)
    assert g.labels == ["wrong_count"] and g.count_accuracy == 0.5 and g.precision == 4 / 5


def test_arbitrary_output_never_raises():
    rng = random.Random(0)
    words = sorted(set(w for p in shapes.RELATION_PHRASES for w in p) | set(shapes.SHAPE_WORDS)
                   | set(shapes.COLOURS) | set(shapes.SIZE_WORDS) | set(shapes.COUNT_WORDS)
                   | {"and", "the", "<unk>", "", "xyz", "4"})
    for _ in range(400):
        tokens = [rng.choice(words) for _ in range(rng.randint(0, 25))]
        d = ground(tokens, SCENE).to_dict()
        for key in ("precision", "recall", "colour_accuracy", "shape_accuracy", "size_accuracy",
                    "count_accuracy", "relation_accuracy"):
            assert d[key] is None or 0.0 <= d[key] <= 1.0
        assert set(d["errors"]) <= set(ERROR_LABELS)
    assert ground([], SCENE).errors == {"missed_object": 4}
    assert ground(["red", "red", "left", "of"], []).precision is None


def test_aggregate_means():
    g1 = ground("a big red circle left of a small blue square".split(), SCENE)
    g2 = ground("a red circle and a red square".split(), SCENE)
    agg = aggregate([g1, g2.to_dict()])
    assert agg["n"] == 2
    assert agg["precision"] == pytest.approx((1.0 + 0.5) / 2)
    assert agg["recall"] == pytest.approx((0.5 + 0.25) / 2)
    assert agg["relation_accuracy"] == 1.0  # only g1 states a relation
    assert agg["relations_stated"] == 0.5
    assert agg["wrong_colour_rate"] == 0.5 and agg["missed_object_rate"] == 1.0
    assert agg["wrong_relation_rate"] == 0.0


def test_attention_correctness_mask_aligned_and_uniform():
    mask = np.zeros((112, 112), bool)
    mask[16:40, 8:32] = True  # cell-aligned: 3×3 cells of the 14×14 grid
    coverage = mask.reshape(14, 8, 14, 8).mean(axis=(1, 3))
    share, baseline = attention_correctness(coverage / coverage.sum(), mask)
    assert share == 1.0 and baseline == pytest.approx(576 / 112**2)
    share, baseline = attention_correctness(np.full((14, 14), 1 / 196), mask)
    assert share == pytest.approx(baseline, abs=1e-12)


def test_attention_correctness_hand_computed_and_errors():
    mask = np.zeros((4, 4), bool)
    mask[0, 0] = True  # 1 of 4 pixels of cell (0, 0)
    mask[2:4, 2:4] = True  # all of cell (1, 1)
    alpha = np.array([[0.5, 0.25], [0.25, 0.0]])
    assert attention_correctness(alpha, mask) == (pytest.approx(0.5 / 4), 5 / 16)
    alpha = np.array([[2.0, 0.0], [0.0, 2.0]])  # unnormalised α is normalised
    assert attention_correctness(alpha, mask)[0] == pytest.approx((0.25 + 1.0) / 2)
    with pytest.raises(ValueError):
        attention_correctness(np.ones((3, 3)), mask)
    with pytest.raises(ValueError):
        attention_correctness(np.ones(4), mask)


def test_attention_elsewhere_splits_alpha_between_other_objects_the_objects_side_and_far_away():
    named = np.zeros((8, 8), bool)
    named[0:2, 0:2] = True  # all of cell (0, 0) of a 4×4 grid of 2×2-pixel cells
    others = np.zeros((8, 8), bool)
    others[0:2, 2] = True  # half of cell (0, 1), beside the named object
    others[6:8, 6:8] = True  # all of cell (3, 3), far from it
    others[0, 0] = True  # a pixel of the named object: counted as the named object's
    alpha = np.zeros((4, 4))
    alpha[0, 0] = 0.1  # on the named object
    alpha[0, 1] = 0.2  # half on the other object, half on the background beside the named one
    alpha[1, 1] = 0.3  # background, diagonally beside it
    alpha[3, 3] = 0.15  # on the far object
    alpha[2, 2] = 0.25  # background two cells away: neither
    on_others, beside = attention_elsewhere(alpha, named, others)
    assert on_others == pytest.approx(0.1 + 0.15) and beside == pytest.approx(0.1 + 0.3)
    assert attention_correctness(alpha, named)[0] + on_others + beside == pytest.approx(1 - 0.25)
    assert attention_elsewhere(alpha * 4, named, others) == (pytest.approx(on_others), pytest.approx(beside))
    assert attention_elsewhere(alpha, named, np.zeros((8, 8), bool))[0] == 0.0  # a scene of one object


def test_attention_ceiling_is_the_best_cells_share_and_no_alpha_beats_it():
    mask = np.zeros((4, 4), bool)
    mask[0, 0] = True  # a quarter of cell (0, 0)
    mask[0:2, 2] = True  # half of cell (0, 1)
    assert attention_ceiling((2, 2), mask) == 0.5
    mask[2:4, 2:4] = True  # all of cell (1, 1)
    assert attention_ceiling((2, 2), mask) == 1.0
    small = np.zeros((4, 4), bool)
    small[1:3, 1:3] = True  # a quarter of each of the four cells
    rng = np.random.default_rng(0)
    shares = [attention_correctness(rng.dirichlet(np.ones(4)).reshape(2, 2), small)[0] for _ in range(50)]
    assert attention_ceiling((2, 2), small) == 0.25 and max(shares) <= 0.25 + 1e-12
    with pytest.raises(ValueError):
        attention_ceiling((3, 3), small)


def test_mask_entropy_is_that_of_alpha_spread_as_the_mask_covers_the_cells():
    whole = np.zeros((4, 4), bool)
    whole[0:2, 0:2] = True  # all of one cell: α on it alone
    assert mask_entropy((2, 2), whole) == 0.0
    assert mask_entropy((2, 2), np.ones((4, 4), bool)) == pytest.approx(np.log(4))  # every cell alike
    uneven = whole.copy()
    uneven[0:2, 2] = True  # half of a second cell: α 2/3 and 1/3
    assert mask_entropy((2, 2), uneven) == pytest.approx(-(2 / 3 * np.log(2 / 3) + 1 / 3 * np.log(1 / 3)))
    assert mask_entropy((2, 2), np.zeros((4, 4), bool)) is None  # no object in the crop
    with pytest.raises(ValueError):
        mask_entropy((3, 3), whole)
