"""Evaluation: structure and ranges, metrics equal to caption_metrics, attention correctness checked
by recomputation and by an oracle whose α is exactly the named object's mask."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from sat_core.data import masks
from sat_core.worlds import writer
from sat_core.worlds.shapes import scene as shapes
from sat_core.evaluation.caption_errors import REFERENCE_LABELS, WordStats
from sat_core.checkpoint import load_checkpoint, save_checkpoint
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.data.karpathy import build_vocab, load_karpathy
from sat_core.decoding import Hypothesis
from sat_core.errors import DatasetError
from sat_core.evaluate import main
from sat_core.evaluation.evaluate import (
    NAMING_KINDS, Decoded, decode_split, evaluate, evaluate_images, image_record, score_decoded,
)
from sat_core.evaluation.grounding import attention_correctness, ground
from sat_core.data.images import load_image, preprocess
from sat_core.evaluation.metrics import BLEU_KEYS, caption_metrics
from sat_core.models.captioner import Captioner
from tests.conftest import tiny_config

N_TEST = 12
CFG = DecodeConfig(beam_size=2, max_len=10)


@pytest.fixture(scope="module")
def world_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    path = writer.generate(root, 10, 0, N_TEST, seed=3, workers=1)
    return root, path, load_karpathy(path, root)


def _namer(vocab, attention):
    """A tiny model that says "a <colour> <shape>": one-hot embeddings and L_o mapping each word to
    its successors (the colour and shape it picks barely depend on the image: random features)."""
    torch.manual_seed(0)
    V = len(vocab)
    config = tiny_config(V, attention=attention, embed_dim=V)
    model = Captioner(config).eval()
    ids = lambda words: [vocab.stoi[w] for w in words if w in vocab.stoi]  # noqa: E731
    successors = {vocab.start_id: ids(["a"]), vocab.stoi["a"]: ids(shapes.COLOURS)}
    successors |= {c: ids(shapes.SHAPES) for c in ids(shapes.COLOURS)}
    with torch.no_grad():
        model.decoder.embed.weight.copy_(torch.eye(V) * 6)
        weight = torch.zeros(V, V)
        for prev in range(V):
            weight[successors.get(prev, [vocab.end_id]), prev] = 1.0
        model.decoder.L_o.weight.copy_(weight)
        model.decoder.L_o.bias.zero_()
    return model, config


@pytest.fixture(scope="module", params=["soft", "hard"])
def checkpoint(request, world_data, tmp_path_factory):
    _, _, data = world_data
    vocab = build_vocab(data, min_count=1)
    model, config = _namer(vocab, request.param)
    directory = tmp_path_factory.mktemp(f"ckpt_{request.param}") / "ckpt"
    save_checkpoint(directory, model, model_config=config, vocab=vocab, preprocess=PreprocessConfig(112))
    return directory


@pytest.fixture(scope="module")
def result(checkpoint, world_data):
    return evaluate(load_checkpoint(checkpoint), world_data[2], "test", CFG, meteor=False)


def test_structure_and_value_ranges(result, checkpoint):
    assert result["n_images"] == N_TEST and len(result["records"]) == N_TEST and result["beam"] == 2
    assert set(result["corpus"]) == {*BLEU_KEYS, "ROUGE-L", "CIDEr"}  # METEOR off
    assert all(v >= 0 for v in result["corpus"].values())
    g = result["grounded"]
    assert g["n"] == N_TEST and 0 <= g["precision"] <= 1 and 0 <= g["recall"] <= 1
    a = result["attention"]
    assert a["regions"] == 196 and a["n_words"] == sum(len(r["tokens"]) for r in result["records"])
    assert 0 < a["entropy_nats"] <= math.log(196) + 1e-9
    assert a["entropy_normalised"] == pytest.approx(a["entropy_nats"] / math.log(196))
    assert a["n_grounded_words"] > 0, "the namer model names an object in every caption"
    assert 0 <= a["correctness"] <= 1 and 0 < a["baseline"] < 1
    assert a["ratio"] == pytest.approx(a["correctness"] / a["baseline"])
    by_kind = a["entropy_by_kind"]  # every generated word once, in its kind
    assert sum(v["n"] for v in by_kind.values()) == a["n_words"]
    assert sum(v["n"] * v["mean"] for v in by_kind.values()) == pytest.approx(a["n_words"] * a["entropy_nats"])
    naming = [w for r in result["records"] for w in r["words"] if w["kind"] in NAMING_KINDS]
    for w in naming:  # α's entropy at the word's step, and the mask's: α spread as the mask covers the cells
        assert 0 <= w["mask_entropy"] <= math.log(196) and 0 <= w["entropy"] <= math.log(196) + 1e-9
    assert a["naming_entropy"] == pytest.approx(np.mean([w["entropy"] for w in naming]))
    assert a["mask_entropy"] == pytest.approx(np.mean([w["mask_entropy"] for w in naming]))
    for key in ("on_other_objects", "beside_object"):  # where the rest of α went, over the same words
        assert a[key] == pytest.approx(np.mean([w[key] for w in naming]))
    assert all(w["share"] + w["on_other_objects"] + w["beside_object"] <= 1 + 1e-9 for w in naming)
    assert any(w["on_other_objects"] > 0 for w in naming) and any(w["beside_object"] > 0 for w in naming)
    soft = "soft" in str(checkpoint.parent.name)
    if soft:
        assert result["beta_by_kind"] and all(0 < v["mean"] < 1 for v in result["beta_by_kind"].values())
        assert sum(v["n"] for v in result["beta_by_kind"].values()) == a["n_words"]
    else:
        assert result["beta_by_kind"] == {} and any("no gate" in n for n in result["notes"])
    for r in result["records"]:
        assert r["caption"] == " ".join(r["tokens"]) and len(r["references"]) == 5
        assert set(r["scores"]) == {"CIDEr", "BLEU-4"}
        world_labels = [e for e in r["errors"] if e not in REFERENCE_LABELS]
        assert set(world_labels) <= set(r["grounding"]["errors"])
        assert len(r["word_kinds"]) == len(r["tokens"])
    json.dumps(result)  # JSON-ready as returned


def test_metrics_equal_caption_metrics_on_the_same_captions(result):
    refs = {r["image_id"]: r["references"] for r in result["records"]}
    hyps = {r["image_id"]: r["caption"] for r in result["records"]}
    direct = caption_metrics(refs, hyps, meteor=False)
    assert result["corpus"] == direct.corpus
    for r in result["records"]:
        assert r["scores"]["CIDEr"] == direct.per_image[r["image_id"]]["CIDEr"]
        assert r["scores"]["BLEU-4"] == direct.per_image[r["image_id"]]["BLEU-4"]


def test_grounded_figures_equal_ground_on_each_caption(result, world_data):
    data = world_data[2]
    by_id = {rec.id: rec for rec in data.images}
    for r in result["records"]:
        g = ground(r["tokens"], by_id[r["image_id"]].objects)
        world_labels = [e for e in r["errors"] if e not in REFERENCE_LABELS]
        assert world_labels == g.labels and r["grounding"]["precision"] == g.precision
        assert r["grounding"]["errors"] == g.errors and r["n_objects"] == len(by_id[r["image_id"]].objects)


def test_evaluate_images_equals_evaluate_on_the_same_images(checkpoint, world_data):
    data = world_data[2]
    loaded = load_checkpoint(checkpoint)
    picked = evaluate_images(loaded, data, data.split("test")[:5], CFG, meteor=False)
    split = evaluate(loaded, data, "test", CFG, limit=5, meteor=False)
    assert split.pop("split") == "test" and split.pop("dataset") == str(data.json_path) and picked == split
    assert [r["image_id"] for r in picked["records"]] == [data.images[i].id for i in data.split("test")[:5]]


def test_unreadable_images_are_skipped_and_none_readable_is_an_error(checkpoint, world_data, tmp_path):
    from dataclasses import replace

    data = world_data[2]
    loaded = load_checkpoint(checkpoint)
    first, second = data.split("test")[:2]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    copy = replace(data, images=list(data.images))
    copy.images[first] = replace(data.images[first], path=broken)
    out = evaluate_images(loaded, copy, [first, second], CFG, meteor=False)
    assert out["n_images"] == 1 and len(out["skipped"]) == 1 and "broken.png" in out["skipped"][0]
    assert [r["image_id"] for r in out["records"]] == [data.images[second].id]
    with pytest.raises(DatasetError, match="None of the 1 images"):
        evaluate_images(loaded, copy, [first], CFG, meteor=False)


def test_attention_correctness_equals_direct_recomputation(checkpoint, world_data):
    _, _, data = world_data
    decoded, skipped = decode_split(load_checkpoint(checkpoint), data, "test", CFG, batch_size=5)
    assert not skipped and len(decoded) == N_TEST
    checked = 0
    for dec in decoded:
        record, grounding = image_record(dec, {"CIDEr": 0.0, "BLEU-4": 0.0}, WordStats())
        objects = {o["id"]: o for o in dec.record.objects}
        expected = []
        for t, ids in grounding.token_objects.items():
            if len(ids) == 1 and t < len(dec.hypothesis.words):
                mask = masks.rle_decode(objects[ids[0]]["mask"])  # 112×112 tiles the 14×14 grid
                share, _ = attention_correctness(dec.hypothesis.alphas[t].reshape(14, 14), mask)
                if record["words"][len(expected)]["kind"] in NAMING_KINDS:
                    checked += 1
                cover = mask.reshape(14, 8, 14, 8).mean(axis=(1, 3))
                q, a = cover[cover > 0] / cover.sum(), dec.hypothesis.alphas[t].astype(np.float64)
                rest = np.zeros_like(mask)
                for i in objects.keys() - {ids[0]}:
                    rest |= masks.rle_decode(objects[i]["mask"])
                other = (rest & ~mask).reshape(14, 8, 14, 8).mean(axis=(1, 3))
                rows, cols = np.nonzero(cover)
                near = np.zeros((14, 14), bool)  # the cells within one cell of one the object touches
                for r, c in zip(rows, cols):
                    near[max(r - 1, 0) : r + 2, max(c - 1, 0) : c + 2] = True
                beside = (a.reshape(14, 14) * near * (1 - cover - other)).sum() / a.sum()
                expected.append((share, cover.max(), -(a * np.log(np.maximum(a, 1e-12))).sum(), -(q * np.log(q)).sum(),
                                 (a.reshape(14, 14) * other).sum() / a.sum(), beside))
        got = [value for w in record["words"] for value in (w["share"], w["ceiling"], w["entropy"], w["mask_entropy"],
                                                             w["on_other_objects"], w["beside_object"])]
        assert got == pytest.approx([value for pair in expected for value in pair], abs=1e-12)
        assert all(w["share"] <= w["ceiling"] + 1e-12 for w in record["words"])
    assert checked > 0


def _cell_aligned(objects):
    """Objects whose masks are whole 8×8 cells (the cells their mask touches most), so α can equal them."""
    out = []
    for o in objects:
        cover = masks.rle_decode(o["mask"]).reshape(14, 8, 14, 8).mean(axis=(1, 3))  # (14, 14)
        cells = cover >= cover.max() * 0.5
        out.append({**o, "mask": masks.rle_encode(np.kron(cells, np.ones((8, 8), bool)))})
    return out


def _oracle(data, vocab, alpha_for):
    """Decoded items whose caption is the first reference and whose α at word t is alpha_for(mask)."""
    decoded = []
    for i in data.split("test"):
        rec = data.images[i]
        rec.objects = _cell_aligned(rec.objects)
        words = rec.sentences[0]
        links = dict((t, ids) for t, ids in rec.links[0])
        alphas = np.full((len(words) + 1, 196), 1 / 196)
        for t, ids in links.items():  # a plural's α covers all its objects: not one object's mask
            mask = np.logical_or.reduce([masks.rle_decode(o["mask"]) for o in rec.objects if o["id"] in ids])
            alphas[t] = alpha_for(mask)
        hyp = Hypothesis(vocab.encode(words, add_specials=False) + [vocab.end_id], list(words), -1.0, -1.0,
                         alphas, np.full(len(words) + 1, 0.5), np.full(len(words) + 1, -1), True, (14, 14))
        _, crop = preprocess(load_image(rec.path), PreprocessConfig(112))
        decoded.append(Decoded(i, rec, hyp, crop))
    return decoded


def _coverage(mask):
    cover = mask.reshape(14, 8, 14, 8).mean(axis=(1, 3)).reshape(-1)  # (196,)
    return cover / cover.sum()


def test_oracle_alpha_on_the_named_object_scores_one(world_data):
    data = load_karpathy(world_data[1], world_data[0])  # a fresh copy: _oracle edits the objects
    vocab = build_vocab(data, min_count=1)
    out = score_decoded(_oracle(data, vocab, _coverage), gated=True, stats=WordStats(), meteor=False)
    a = out["attention"]
    assert a["n_grounded_words"] > N_TEST and a["correctness"] == pytest.approx(1.0)
    assert a["ceiling"] == 1.0  # every object fills whole cells
    scored = [r["attention_correctness"] for r in out["records"] if r["attention_correctness"] is not None]
    assert len(scored) >= N_TEST // 2 and scored == pytest.approx([1.0] * len(scored))  # None: only plurals
    assert a["ratio"] == pytest.approx(1.0 / a["baseline"])
    # The first reference describes its scene exactly.
    assert out["grounded"]["precision"] == 1.0 and out["grounded"]["recall"] == 1.0
    assert out["grounded"]["colour_accuracy"] == 1.0 and out["grounded"]["shape_accuracy"] == 1.0
    assert out["beta_by_kind"]["shape"]["mean"] == pytest.approx(0.5)


def test_uniform_alpha_scores_the_baseline(world_data):
    data = load_karpathy(world_data[1], world_data[0])
    vocab = build_vocab(data, min_count=1)
    out = score_decoded(_oracle(data, vocab, lambda mask: np.full(196, 1 / 196)), gated=False, stats=WordStats(), meteor=False)
    a = out["attention"]
    assert a["correctness"] == pytest.approx(a["baseline"]) and a["ratio"] == pytest.approx(1.0)
    assert a["entropy_nats"] == pytest.approx(math.log(196))
    assert a["entropy_normalised"] == pytest.approx(1.0)


def test_cli_writes_metrics_and_records(checkpoint, world_data, tmp_path, capsys):
    root, path, _ = world_data
    out, recs = tmp_path / "m.json", tmp_path / "r.json"
    code = main(["--checkpoint", str(checkpoint), "--data", str(path), "--images", str(root), "--split", "test",
                 "--beam", "1", "--max-len", "6", "--limit", "5", "--no-meteor", "--device", "cpu",
                 "--out", str(out), "--records", str(recs)])
    assert code == 0
    written = json.loads(out.read_text())
    assert {"checkpoint", "split", "beam", "n_images", "corpus", "grounded", "attention", "beta_by_kind",
            "records"} <= set(written)
    assert written["n_images"] == 5 and written["beam"] == 1
    assert json.loads(recs.read_text()) == written["records"]
    printed = capsys.readouterr().out
    assert "5 test images, beam 1" in printed and "CIDEr" in printed and "attention correctness" in printed


@pytest.mark.parametrize("change, message", [
    ({"--split": "val"}, "Split 'val'"),
    ({"--data": "/nonexistent/dataset.json"}, "does not exist"),
    ({"--checkpoint": "/nonexistent/ckpt"}, "No checkpoint"),
])
def test_cli_user_errors_exit_2(checkpoint, world_data, tmp_path, capsys, change, message):
    root, path, _ = world_data
    args = {"--checkpoint": str(checkpoint), "--data": str(path), "--images": str(root),
            "--out": str(tmp_path / "m.json"), **change}
    argv = [x for kv in args.items() for x in kv] + ["--no-meteor", "--limit", "2", "--max-len", "3"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "m.json").exists()


def test_search_errors_compare_the_best_reference_with_the_caption(checkpoint, world_data):
    from sat_core.evaluation.evaluate import SEARCH_MARGIN

    loaded = load_checkpoint(checkpoint)
    plain = evaluate(loaded, world_data[2], "test", CFG, meteor=False)
    checked = evaluate(loaded, world_data[2], "test", CFG, meteor=False, search_errors=True)
    assert "search" not in plain and "search_error" not in plain["records"][0]
    assert [r["caption"] for r in checked["records"]] == [r["caption"] for r in plain["records"]]
    flags = []
    for rec in checked["records"]:
        ref = rec["best_reference"]
        if ref is None:  # every reference has a word the vocabulary lacks or is over max_len
            assert rec["search_error"] is None
            continue
        assert ref["caption"] in rec["references"] and 1 <= ref["reachable"] <= len(rec["references"])
        # recompute the caption's own score from its logprob and length (its tokens plus <end>)
        own = rec["logprob"] / (len(rec["tokens"]) + rec["finished"]) ** CFG.length_norm
        assert rec["search_error"] == (ref["caption"] != rec["caption"] and ref["score"] > own + SEARCH_MARGIN)
        flags.append(rec["search_error"])
    search = checked["search"]
    assert flags and search["n"] == len(flags)
    assert search["unreachable"] == len(checked["records"]) - len(flags)
    assert search["search_error_rate"] == pytest.approx(sum(flags) / len(flags))
    for label, row in search["by_label"].items():
        having = [r["search_error"] for r in checked["records"] if label in r["errors"] and r["best_reference"]]
        assert row["n"] == len(having) and row["search_error_rate"] == pytest.approx(sum(having) / len(having))


def test_cli_prints_the_search_error_summary(checkpoint, world_data, tmp_path, capsys):
    root, path, _ = world_data
    out = tmp_path / "m.json"
    code = main(["--checkpoint", str(checkpoint), "--data", str(path), "--images", str(root), "--split", "test",
                 "--limit", "4", "--no-meteor", "--device", "cpu", "--search-errors", "--out", str(out)])
    assert code == 0
    search = json.loads(out.read_text())["search"]
    assert search["n"] + search["unreachable"] == 4
    assert "search errors (a reference outscores the caption)" in capsys.readouterr().out


def test_cli_refuses_search_errors_for_sampled_hard_captions(checkpoint, world_data, tmp_path, capsys):
    root, path, _ = world_data
    argv = ["--checkpoint", str(checkpoint), "--data", str(path), "--images", str(root), "--limit", "2",
            "--no-meteor", "--search-errors", "--hard-mode", "sample", "--out", str(tmp_path / "m.json")]
    hard = load_checkpoint(checkpoint).model.hard
    assert main(argv) == (2 if hard else 0)
    assert ("hard_mode expect" in capsys.readouterr().err) == hard
    assert (tmp_path / "m.json").exists() != hard


def test_bf16_agreement_counts_the_images_whose_best_captions_differ(checkpoint, world_data):
    from sat_core.bench import run_agreement
    root, path, _ = world_data
    figures = run_agreement(str(checkpoint), str(path), str(root), "test", 2, 8, torch.device("cpu"))
    assert figures["images"] == N_TEST and figures["beam"] == 2
    assert 0.0 <= figures["same_best_caption"] <= 1.0
    assert len(figures["differing"]) == round((1 - figures["same_best_caption"]) * N_TEST)
    assert figures["bleu4_delta"] == pytest.approx(figures["bleu4_bf16"] - figures["bleu4_fp32"])


def test_a_search_error_is_a_reference_the_model_scores_above_the_caption(world_data):
    """A reference is a search error when the model scores it above the caption beam search returned (by more
    than the margin), not when it scores below."""
    from dataclasses import replace

    from sat_core.decoding import ReferenceScore
    data = load_karpathy(world_data[1], world_data[0])
    dec = _oracle(data, build_vocab(data, min_count=1), _coverage)[0]
    dec = replace(dec, reference=ReferenceScore("another caption", dec.hypothesis.score + 0.5, 5),
                  references_scored=True)
    assert image_record(dec, {"CIDEr": 0.0, "BLEU-4": 0.0}, WordStats())[0]["search_error"] is True
    below = replace(dec, reference=ReferenceScore("another caption", dec.hypothesis.score - 0.5, 5))
    assert image_record(below, {"CIDEr": 0.0, "BLEU-4": 0.0}, WordStats())[0]["search_error"] is False
