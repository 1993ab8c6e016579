"""sat_core.explain: domain check, regions and masks, session replay, summaries of evaluation records."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from sat_core.config import DecodeConfig
from sat_core.decoding import DecodeSession
from sat_core.errors import SatError
from sat_core.explain import (
    DomainReference, alpha_summary, box_mask, doubly_stochastic_penalty, grid_region, mask_on_grid, slice_metrics,
    sync_session, word_type_correctness,
)
from sat_core.images import CropInfo, load_image, preprocess


def _scenes(env, split: str) -> list[Image.Image]:
    return [load_image(env.world / e["filepath"] / e["filename"]) for e in env.dataset["images"] if e["split"] == split]


def test_domain_check_separates_photos_from_synthetic_scenes(explorer_env):
    from skimage import data

    reference = DomainReference.from_images(_scenes(explorer_env, "train"))
    for scene in _scenes(explorer_env, "test"):
        assert not reference.check(scene).far  # unseen scenes of the same world
        buffer = io.BytesIO()
        scene.resize((300, 300)).save(buffer, format="JPEG", quality=85)  # re-encoded and scaled: still in domain
        assert not reference.check(Image.open(buffer)).far
    for photo in (data.astronaut(), data.chelsea(), data.coffee(), data.camera()):
        check = reference.check(Image.fromarray(photo))
        assert check.far and check.reasons
    grey = reference.check(Image.fromarray(data.camera()))
    assert any("strongly coloured" in r for r in grey.reasons)


def test_alpha_summary_and_penalty():
    alpha = np.zeros((2, 3))
    alpha[1, 2], alpha[0, 0] = 0.75, 0.25
    s = alpha_summary(alpha)
    assert s.max == 0.75 and s.argmax == (1, 2) and s.total == pytest.approx(1.0)
    expected_h = -(0.75 * np.log(0.75) + 0.25 * np.log(0.25))
    assert s.entropy == pytest.approx(expected_h) and s.effective_regions == pytest.approx(np.exp(expected_h))
    uniform = np.full((4, 6), 1 / 6)  # 4 steps over 6 regions: every region gets 4/6
    assert doubly_stochastic_penalty(uniform) == pytest.approx(6 * (1 - 4 / 6) ** 2)


def test_regions_and_masks_on_the_grid():
    region = grid_region((4, 5), range(1, 3), [0, 4])
    assert region.sum() == 4 and region[1, 0] and region[2, 4] and not region[0, 0]
    with pytest.raises(SatError, match="outside the 4×5 grid"):
        grid_region((4, 5), [4], [0])
    # a 200×100 image: the encoder saw the centred 100×100 square starting at x = 50
    crop = CropInfo(50, 0, 150, 100, 112 / 100, (200, 100), 112)
    mask = box_mask((200, 100), (50, 0, 100, 50))  # the crop's top-left quarter
    assert mask.shape == (100, 200) and mask.sum() == 50 * 50
    cells = mask_on_grid(mask, crop, (4, 4))
    assert cells[:2, :2].all() and cells.sum() == 4


def test_sync_session_replays_forced_words_with_few_steps(explorer_env):
    loaded = explorer_env.checkpoint("soft")
    tensor, _ = preprocess(_scenes(explorer_env, "test")[0], loaded.preprocess)
    cfg = DecodeConfig(beam_size=1, max_len=8)
    session = DecodeSession(loaded.model, loaded.vocab, tensor, cfg)
    word = loaded.vocab.itos[5]
    sync_session(session, 4, {1: word})
    direct = DecodeSession(loaded.model, loaded.vocab, tensor, cfg)
    direct.step()
    direct.step(force=word)
    direct.step()
    direct.step()
    assert [s.token for s in session.steps] == [s.token for s in direct.steps]
    assert [s.forced for s in session.steps] == [False, True, False, False]
    kept = session.steps[0]
    sync_session(session, 2, {})  # dropping the forced word redoes step 1 greedily, keeps step 0
    assert session.steps[0] is kept and not session.steps[1].forced
    greedy = DecodeSession(loaded.model, loaded.vocab, tensor, cfg)
    greedy.step()
    greedy.step()
    assert [s.token for s in session.steps] == [s.token for s in greedy.steps]


def test_word_type_rows_summarise_records_by_kind():
    def word(kind, share, baseline):
        return {"kind": kind, "share": share, "baseline": baseline}

    records = [{"words": [word("shape", 0.6, 0.1), word("count", 0.2, 0.1), word("colour", 0.5, 0.2)]},
               {"words": [word("shape", 0.2, 0.3)]}, {"words": []}]
    rows = {r["kind"]: r for r in word_type_correctness(records)}
    assert list(rows) == ["shape", "colour", "count"]  # evaluate.WORD_KINDS order
    assert rows["shape"]["words"] == 2 and rows["shape"]["attention_on_object"] == pytest.approx(0.4)
    assert rows["shape"]["uniform_baseline"] == pytest.approx(0.2)
    assert rows["count"]["words"] == 1 and rows["count"]["attention_on_object"] == pytest.approx(0.2)
    # "a" and "two" are summarised but do not enter an image's attention correctness
    assert [r["in_attention_correctness"] for r in rows.values()] == [True, True, False]


def test_word_type_rows_equal_evaluate_by_kind(explorer_env):
    from sat_core.data import load_karpathy
    from sat_core.evaluate import evaluate

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

