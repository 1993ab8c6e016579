"""sat_core.evaluation.analysis: evaluation records summarised per word kind and per slice."""

from __future__ import annotations

import pytest

from sat_core.evaluation.analysis import count_table, slice_metrics, word_type_correctness
from sat_core.config import DecodeConfig
from tests.explorer.conftest import explorer_env  # noqa: F401  (a fixture)


def test_word_type_rows_summarise_records_by_kind():
    def word(kind, share, baseline, entropy=None):
        return {"kind": kind, "share": share, "baseline": baseline,
                **({"entropy": entropy, "mask_entropy": entropy / 2, "on_other_objects": share / 2,
                    "beside_object": share / 4} if entropy is not None else {})}

    records = [{"words": [word("shape", 0.6, 0.1, 2.0), word("count", 0.2, 0.1), word("colour", 0.5, 0.2, 3.0)]},
               {"words": [word("shape", 0.2, 0.3, 1.0)]}, {"words": [word("colour", 0.1, 0.2)]}, {"words": []}]
    rows = {r["kind"]: r for r in word_type_correctness(records)}
    # α's entropy and its object's mask's, over the words whose records keep them (not those written before)
    assert rows["shape"]["alpha_entropy"] == 1.5 and rows["shape"]["mask_entropy"] == 0.75
    assert rows["colour"]["alpha_entropy"] == 3.0 and rows["colour"]["words"] == 2
    assert rows["count"]["alpha_entropy"] is None and rows["count"]["mask_entropy"] is None
    assert rows["shape"]["on_other_objects"] == pytest.approx(0.2) and rows["shape"]["beside_object"] == 0.1
    assert rows["colour"]["on_other_objects"] == 0.25 and rows["count"]["beside_object"] is None
    assert list(rows) == ["shape", "colour", "count"]  # evaluate.WORD_KINDS order
    assert rows["shape"]["words"] == 2 and rows["shape"]["attention_on_object"] == pytest.approx(0.4)
    assert rows["shape"]["uniform_baseline"] == pytest.approx(0.2)
    assert rows["count"]["words"] == 1 and rows["count"]["attention_on_object"] == pytest.approx(0.2)
    # "a" and "two" are summarised but do not enter an image's attention correctness
    assert [r["in_attention_correctness"] for r in rows.values()] == [True, True, False]



def test_word_type_rows_equal_evaluate_by_kind(explorer_env):
    from sat_core.data.karpathy import load_karpathy
    from sat_core.evaluation.evaluate import evaluate

    data = load_karpathy(explorer_env.world / "dataset.json", explorer_env.world)
    result = evaluate(explorer_env.checkpoint("soft"), data, "test", DecodeConfig(beam_size=2, max_len=10),
                      limit=4, meteor=False)
    rows = word_type_correctness(result["records"])
    by_kind = result["attention"]["by_kind"]
    assert [r["kind"] for r in rows] == list(by_kind)
    for row in rows:
        expected = by_kind[row["kind"]]
        assert row["words"] == expected["n"] and row["attention_on_object"] == expected["correctness"]
        assert row["uniform_baseline"] == expected["baseline"]
        assert row["alpha_entropy"] == expected["entropy"] and row["mask_entropy"] == expected["mask_entropy"]



def test_slice_metrics_group_records():
    records = [
        {"scores": {"CIDEr": 1.0, "BLEU-4": 0.5}, "errors": [], "n_objects": 1, "attention_correctness": 0.4},
        {"scores": {"CIDEr": 0.0, "BLEU-4": 0.1}, "errors": ["wrong_colour"], "n_objects": 2,
         "attention_correctness": None},
        {"scores": {"CIDEr": 0.5, "BLEU-4": 0.3}, "errors": ["wrong_colour", "missed_object"], "n_objects": 2,
         "attention_correctness": 0.2},
    ]
    rows = {r["slice"]: r for r in slice_metrics(records)}
    assert rows["all images"]["images"] == 3 and rows["all images"]["CIDEr"] == pytest.approx(0.5)
    assert rows["no error"]["images"] == 1
    assert rows["error: wrong_colour"]["images"] == 2 and rows["error: wrong_colour"]["CIDEr"] == pytest.approx(0.25)
    assert rows["error: wrong_colour"]["attention_correctness"] == pytest.approx(0.2)  # None is left out
    assert rows["2 objects"]["images"] == 2 and rows["1 object"]["BLEU-4"] == pytest.approx(0.5)
    assert "unsure captions" not in rows  # no reference: no such slices
    from sat_core.evaluation.confidence import ConfidenceReference

    for record, logprob in zip(records, (-2.0, -9.0, -7.0)):
        record["logprob"] = logprob
    rows = {r["slice"]: r for r in slice_metrics(records, ConfidenceReference(-5.0, 0.1, 400))}
    assert rows["unsure captions"]["images"] == 2 and rows["unsure captions"]["CIDEr"] == pytest.approx(0.25)
    assert rows["the other captions"]["images"] == 1 and rows["the other captions"]["CIDEr"] == pytest.approx(1.0)


def test_count_table_crosses_what_was_said_with_the_scene():
    from sat_core.worlds.scenes.grounding import ground
    from tests.test_scenes_grounding import TWO_DOGS

    captions = ["two dogs and a cat", "a dog and a cat", "three dogs", "dogs", "two cats", "a cat"]
    records = [{"grounding": ground(c.split(), TWO_DOGS).to_dict()} for c in captions]
    records.append({"grounding": None})  # an image without grounding
    rows = {r["in the scene"]: r for r in count_table(records)}
    assert set(rows) == {1, 2}
    assert rows[1] == {"in the scene": 1, "counts scored": 1, "said 1": 0, "said 2": 1, "said 3": 0,
                       "said plural": 0, "right": 0.0}  # "two cats" of one
    assert rows[2]["counts scored"] == 4 and rows[2]["right"] == pytest.approx(0.5)
    assert (rows[2]["said 1"], rows[2]["said 2"], rows[2]["said 3"], rows[2]["said plural"]) == (1, 1, 1, 1)
    assert count_table([{"grounding": {"precision": 1.0}}]) == []  # the shapes world: no counts kept


def test_count_table_by_groups_tells_a_pair_alone_from_a_pair_beside_another_object():
    from sat_core.evaluation.analysis import count_table_by_groups
    from sat_core.worlds.scenes.grounding import ground
    from tests.test_scenes_grounding import TWO_DOGS

    pair = [o for o in TWO_DOGS if o["category"] == "dog"]
    assert [o["category"] for o in TWO_DOGS].count("dog") == 2 and len(TWO_DOGS) == 3
    records = [{"grounding": ground(c.split(), TWO_DOGS).to_dict()} for c in ("two dogs and a cat", "two cats and a dog")]
    records += [{"grounding": ground("two dogs".split(), pair).to_dict()}, {"grounding": None}]
    assert records[0]["grounding"]["groups"] == [2, 1]
    rows = {r["the scene's groups"]: r for r in count_table_by_groups(records)}
    assert set(rows) == {"2 + 1", "2"}
    assert rows["2"] == {"the scene's groups": "2", "scenes": 1, "counts scored": 1, "right": 1.0}
    # "two cats and a dog" scores two wrong counts (two of one cat, one of the two dogs)
    assert rows["2 + 1"]["scenes"] == 2 and rows["2 + 1"]["counts scored"] == 3
    assert rows["2 + 1"]["right"] == pytest.approx(1 / 3)
    assert count_table_by_groups([{"grounding": {"counts": []}}]) == []  # records written before groups were kept
