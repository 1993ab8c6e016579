"""The relation judge: fitted after training on a model's annotations, saved with it, read by the relation prior."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sat_core import checkpoint as ckpt
from sat_core import relation_judge, world
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.decoding import _stated_relation_log_prior, beam_search, named_objects, rank_by_stated_counts
from sat_core.errors import SatError
from sat_core.io import read_tensors
from sat_core.models.captioner import Captioner
from sat_core.scenes_catalog import COUNTED
from sat_core.vocab import SPECIALS, Vocab
from tests.conftest import tiny_config

DOG, CAT = COUNTED.index("dog"), COUNTED.index("cat")


def test_coverage_puts_each_category_where_its_boxes_are():
    objects = [{"category": "dog", "full_bbox": [0, 0, 16, 16]}, {"category": "dog", "full_bbox": [48, 48, 16, 32]},
               {"category": "cat", "full_bbox": [8, 56, 16, 8]}]
    maps, present = relation_judge.coverage(objects, 64, 4)  # 16-px cells
    C = len(COUNTED)
    assert present[DOG] and present[CAT] and present[C + DOG] and present[C + CAT] and present.sum() == 4
    dog = maps[DOG].reshape(4, 4)
    # the second dog's box runs off the 64-px image: only its cell inside counts
    assert dog[0, 0] == pytest.approx(0.5) and dog[3, 3] == pytest.approx(0.5) and dog.sum() == pytest.approx(1)
    cat = maps[CAT].reshape(4, 4)  # half of cells (3, 0) and (3, 1)
    assert cat[3, 0] == pytest.approx(0.5) and cat[3, 1] == pytest.approx(0.5)
    feet = maps[C + DOG].reshape(4, 4)  # the rows the dogs stand on: row 0 (y 16) and the image's last row
    assert feet[0, 0] == pytest.approx(0.5) and feet[3, 3] == pytest.approx(0.5) and feet[1:3].sum() == 0


def test_fit_learns_where_each_category_is():
    """Cells carry a one-hot of the category drawn there: the fitted judge's centres land on the drawn cells."""
    torch.manual_seed(2)
    n, side, C = 200, 4, 3
    where = torch.randint(0, side * side, (n, C))
    feats = torch.zeros(n, side * side, C, dtype=torch.float16)
    maps = torch.zeros(n, 2 * C, side * side)  # each object fills one cell and stands on it
    for c in range(C):
        feats[torch.arange(n), where[:, c], c] = 8  # a strong detector: one weight makes it win the softmax
        maps[torch.arange(n), c, where[:, c]] = 1
        maps[torch.arange(n), C + c, where[:, c]] = 1
    present = torch.ones(n, 2 * C, dtype=torch.bool)
    cfg = relation_judge.FitConfig(width=16, epochs=30, batch_size=32)
    judge, loss = relation_judge.fit(feats, maps, present, cfg)
    with torch.no_grad():
        x, y, feet = judge(feats.float())
    # within half a cell of the cell drawn (what is left of the softmax pulls each centre a little inwards)
    assert torch.allclose(x, (where % side).float(), atol=0.5) and torch.allclose(y, (where // side).float(), atol=0.5)
    assert torch.allclose(feet, (where // side).float(), atol=0.5)
    flat, _ = relation_judge.fit(feats, maps, present, relation_judge.FitConfig(width=16, epochs=2, feet=False))
    assert flat.where[2].out_features == C and torch.equal(flat(feats.float())[2], flat(feats.float())[1])
    assert loss < 0.5
    again, _ = relation_judge.fit(feats, maps, present, cfg)
    assert torch.equal(again.where[2].weight, judge.where[2].weight)  # deterministic for a seed


def test_the_prior_believes_the_relations_where_the_judge_sees_the_categories():
    x, y, feet = torch.zeros(len(COUNTED)), torch.zeros(len(COUNTED)), torch.zeros(len(COUNTED))
    x[DOG], x[CAT], y[DOG], y[CAT] = 2.0, 10.0, 12.0, 3.0  # the dog left of and below the cat
    feet[DOG], feet[CAT] = 13.0, 4.0  # and standing lower: in front of it
    prior = lambda text: _stated_relation_log_prior([x, y, feet], text.split())  # noqa: E731
    assert prior("a dog to the left of a cat") > -0.01
    assert prior("a cat to the left of a dog") < -10
    assert prior("a dog in front of a cat") > -0.01 and prior("a dog behind a cat") < -10
    assert prior("a cat above a dog") > -0.01 and prior("a dog above a cat") < -10
    assert prior("two dogs and a cat") == 0.0  # nothing stated, nothing judged
    assert prior("a dog next to a cat") == 0.0  # not judged
    assert prior("a red dog to the left of a brown dog") == 0.0  # one category: the judge cannot tell
    feet[DOG] = 2.0  # a tall cat standing lower than the dog, whose centre is lower: the feet decide "in front of"
    assert prior("a cat in front of a dog") > -0.02 and prior("a dog in front of a cat") < -3  # 2 rows apart


def _checkpoint(path, metrics=None):
    torch.manual_seed(0)
    vocab = Vocab([*SPECIALS, "a", "dog", "cat", "to", "the", "left", "of"])
    config = tiny_config(len(vocab), init_cells=8, count_head=len(COUNTED))
    return ckpt.save_checkpoint(path, Captioner(config).eval(), model_config=config, vocab=vocab,
                                preprocess=PreprocessConfig(image_size=32), metrics=metrics)


def test_ranking_by_the_judge_reorders_finished_captions():
    from tests.test_decoding import _finished
    model, feats = _dog_cat_judge()
    wrong, right = _finished("a cat to the left of a dog".split(), -0.5), _finished("a dog to the left of a cat".split(), -0.6)
    results = [[wrong, right]]
    rank_by_stated_counts(model, feats, results, 0.0, relations=1.0)
    assert results[0][0].words == right.words and results[0][1].prior < -5  # 3 cells the wrong way: log σ(−6)
    with pytest.raises(SatError, match="--relation-prior needs a model with a relation judge"):
        beam_search(Captioner(tiny_config(12)).eval(), torch.rand(1, 3, 32, 32), Vocab([*SPECIALS, *"abcdefgh"]),
                    DecodeConfig(relation_prior=1.0))


def _dog_cat_judge():
    """A model whose judge sees the dog in the first cell (top left) and the cat in the last (bottom right), and
    its annotations (1, 16, D)."""
    config = tiny_config(12, init_cells=8, count_head=len(COUNTED), relation_judge=4)
    model = Captioner(config).eval()
    layer, head = model.decoder.relation_judge.where[0], model.decoder.relation_judge.where[2]
    with torch.no_grad():  # feature 0 marks the dog's cell (the first), feature 1 the cat's (the last)
        for weights in (layer.weight, layer.bias, head.weight, head.bias):
            weights.zero_()
        layer.weight[0, 0], layer.weight[1, 1] = 1.0, 1.0
        head.weight[DOG, 0], head.weight[CAT, 1] = 1.0, 1.0
    feats = torch.zeros(1, 16, config.annotation_dim)
    feats[0, 0, 0], feats[0, 15, 1] = 10.0, 10.0
    return model, feats


def test_the_judge_chooses_how_to_relate_the_objects_the_ranking_chose():
    from tests.test_decoding import _finished
    model, feats = _dog_cat_judge()
    # The best statement names a dog and a cat: first by score, in the wrong direction; a weak wording in the
    # right one. A caption naming only the dog scores between them.
    wrong = _finished("a cat to the left of a dog".split(), -0.50)
    dog = _finished("a dog".split(), -0.60)
    right = _finished("a dog to the left of a cat".split(), -5.0)
    results = [[dog, right, wrong]]
    rank_by_stated_counts(model, feats, results, 0.0, relations=0.01, choice=4.0)
    assert [h.words for h in results[0]] == [right.words, wrong.words, dog.words]  # the dog and cat first, rightly
    assert results[0][0].choice == pytest.approx(4 * results[0][0].prior / 0.01)  # the judge's log p, weighted
    assert results[0][2].choice == 0.0  # nothing stated, nothing judged
    results = [[dog, right, wrong]]
    rank_by_stated_counts(model, feats, results, 0.0, relations=0.01)  # without the choice: score + prior
    assert [h.words for h in results[0]] == [wrong.words, dog.words, right.words]
    assert all(h.choice is None for h in results[0])
    # Which objects stays the ranking's: with the judge's weight across statements high, the wrong direction
    # loses to the caption naming only the dog, whatever the choice among wordings.
    results = [[dog, wrong]]
    rank_by_stated_counts(model, feats, results, 0.0, relations=1.0, choice=4.0)
    assert [h.words for h in results[0]] == [dog.words, wrong.words]
    assert named_objects("a cat to the left of a dog".split()) == named_objects("a dog behind a cat".split())
    assert named_objects("two dogs".split()) != named_objects("a dog".split())
    with pytest.raises(SatError, match="--relation-choice needs a model with a relation judge"):
        beam_search(Captioner(tiny_config(12)).eval(), torch.rand(1, 3, 32, 32), Vocab([*SPECIALS, *"abcdefgh"]),
                    DecodeConfig(relation_choice=1.0))


@pytest.fixture
def scenes(tmp_path):
    folder = tmp_path / "scenes"
    world.generate(folder, 6, 1, 1, seed=3, workers=1, kind="scenes")
    return folder


def test_the_cli_writes_a_new_checkpoint_with_a_judge_and_says_how_to_evaluate_it(tmp_path, scenes, capsys):
    source = _checkpoint(tmp_path / "ck", metrics={"beam": 10, "length_norm": 0.0, "distinct_content": True,
                                                   "count_prior": 1.0})
    out = tmp_path / "judged"
    args = ["--checkpoint", str(source), "--data", str(scenes / "dataset.json"), "--images", str(scenes), "--epochs", "2"]
    assert relation_judge.main([*args, "--width", "4", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "--beam 10 --length-norm 0 --no-one-mention-per-kind --distinct-content --count-prior 1 --relation-prior 1 --relation-choice 4" in said
    assert json.loads((out / ckpt.CONFIG_FILE).read_text())["model"]["relation_judge"] == 4
    weights = read_tensors(out / ckpt.WEIGHTS_FILE)[0]
    assert tuple(weights["decoder.relation_judge.where.0.weight"].shape) == (4, 16)
    assert tuple(weights["decoder.relation_judge.where.2.weight"].shape) == (2 * len(COUNTED), 4)  # and feet
    before, after = ckpt.load_checkpoint(source), ckpt.load_checkpoint(out)
    assert torch.equal(before.model.decoder.L_o.weight, after.model.decoder.L_o.weight)  # the rest unchanged
    hyps = beam_search(after.model, torch.rand(1, 3, 32, 32), after.vocab, DecodeConfig(beam_size=2, max_len=4,
                                                                                          relation_prior=1.0))
    assert len(hyps) == 1
    assert relation_judge.main([*args, "--out", str(source)]) == 2  # never over the checkpoint it read
    assert "--out must be a new folder" in capsys.readouterr().err
    assert relation_judge.main([*args, "--out", str(tmp_path / "again"), "--checkpoint", str(out)]) == 2
    assert "already has a relation judge" in capsys.readouterr().err


def test_the_ship_fits_the_judge_a_preset_names_once(tmp_path, scenes, capsys):
    from sat_core import ship
    from sat_core.config import TrainConfig
    from tests.test_colour_counter import packaging_config

    target = tmp_path / "checkpoints" / "scenes_hard"
    _checkpoint(target)
    cfg = packaging_config(target, scenes, {"relation_judge": 4}, {"relation_prior": 0.7})
    shipped = ship.package("scenes_hard", cfg, None, tmp_path / "checkpoints", repackage=True)
    assert "relation judge: 6 training scenes encoded" in capsys.readouterr().out
    assert shipped["relation_prior"] == 0.7 and ckpt.load_checkpoint(target).relation_prior == 0.7
    first = read_tensors(target / ckpt.WEIGHTS_FILE)[0]["decoder.relation_judge.where.2.weight"]
    ship.package("scenes_hard", cfg, None, tmp_path / "checkpoints", repackage=True)
    assert "relation judge" not in capsys.readouterr().out
    assert torch.equal(read_tensors(target / ckpt.WEIGHTS_FILE)[0]["decoder.relation_judge.where.2.weight"], first)
    with pytest.raises(SatError, match="--relation-judge judges the scenes world's categories"):
        TrainConfig.from_dict({"model": {"relation_judge": 4}})
    assert np.isfinite(shipped["corpus"]["BLEU-4"])


def test_each_fitting_command_takes_its_own_defaults():
    """The counter and the judge share one command line; each fits with its own FitConfig unless told."""
    from sat_core import colour_counter
    needed = ["--checkpoint", "c", "--data", "d", "--images", "i", "--out", "o"]
    for module in (relation_judge, colour_counter):
        args = module.fitting_parser("p", "d", module.FitConfig(), "w").parse_args(needed)
        defaults = module.FitConfig()
        assert (args.width, args.train_images, args.epochs) == (defaults.width, defaults.train_images, defaults.epochs)
    assert relation_judge.FitConfig().train_images != colour_counter.FitConfig().train_images
