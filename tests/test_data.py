"""Karpathy-format loading, the image cache and length-bucketed batches on a tiny on-disk dataset."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

import pytest
import torch
from PIL import Image

from sat_core.config import PreprocessConfig
from sat_core.data.karpathy import (
    BucketBatchSampler,
    CaptionDataset,
    EvalImages,
    build_vocab,
    collate,
    load_karpathy,
    make_loader,
)
from sat_core.data.imagestore import ImageStore, normalise
from sat_core.errors import DatasetError
from sat_core.data.vocab import SPECIALS

CFG = PreprocessConfig(image_size=16)

# filename -> (filepath, karpathy split, colour or None for an unreadable file, sentences)
ENTRIES = {
    "a.png": (None, "train", (255, 0, 0), ["a red square on the grass", "the red box", "a red thing",
                                           "red red"]),
    "b.png": (None, "restval", (0, 255, 0), ["a green square", "the green box", "green",
                                             "a green square on the grass", "a big green box"]),
    "c.png": (None, "train", (0, 0, 255), ["a blue square", "the blue box"]),
    "d.png": ("sub", "train", (255, 255, 0), ["a yellow square", "the yellow box", "A Yellow THING"]),
    "bad.png": (None, "train", None, ["a zebra zebra", "the zebra box"]),
    "e.png": (None, "val", (0, 255, 255), ["a purple square", "a purple box"]),
    "f.png": (None, "test", (255, 0, 255), ["a pink square", "a pink box", "the pink box"]),
}


def write_dataset(root: Path) -> Path:
    """Images under root/images (d.png in a filepath subfolder), the split file at root/dataset.json."""
    images = root / "images"
    (images / "sub").mkdir(parents=True)
    entries = []
    for k, (filename, (filepath, split, colour, raws)) in enumerate(ENTRIES.items()):
        target = images / (filepath or "") / filename
        if colour is None:
            target.write_text("this is not a png")
        else:
            Image.new("RGB", (24, 20), colour).save(target)  # not square: preprocess must crop
        entry = {"filename": filename, "imgid": k, "split": split,
                 "sentences": [{"tokens": r.split(), "raw": r} for r in raws]}
        if filepath:
            entry["filepath"] = filepath
            entry["objects"] = [{"name": "square", "bbox": [0, 0, 24, 20]}]
            for s in entry["sentences"]:
                s["links"] = [[1, 0]]
        entries.append(entry)
    path = root / "dataset.json"
    path.write_text(json.dumps({"images": entries}))
    return path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("karpathy")
    data = load_karpathy(write_dataset(root), root / "images")
    vocab = build_vocab(data, min_count=2)
    store = ImageStore(data, CFG, progress=False)
    return data, vocab, store


def colour_of(data, index: int) -> tuple[int, int, int]:
    return ENTRIES[data.images[index].path.name][2]


def test_splits_paths_tokens(world, tmp_path: Path) -> None:
    data, _, _ = world
    assert {s: len(data.split(s)) for s in ("train", "val", "test")} == {"train": 5, "val": 1, "test": 1}
    d = data.images[data.split("train")[3]]
    assert d.path == data.images_dir / "sub" / "d.png" and d.path.is_file()
    assert d.sentences[2] == ["a", "yellow", "thing"]  # lowercased
    assert d.objects == [{"name": "square", "bbox": [0, 0, 24, 20]}] and d.links == [[[1, 0]]] * 3
    assert data.images[0].links is None and data.images[0].objects is None
    kept = load_karpathy(write_dataset(tmp_path), tmp_path / "images", restval_as_train=False)
    assert len(kept.split("train")) == 4 and kept.images[1].split == "restval"


def test_vocab_from_train_only(world) -> None:
    data, vocab, _ = world
    assert vocab.itos[:4] == list(SPECIALS)
    train_counts = Counter(t for i in data.split("train") for s in data.images[i].sentences for t in s)
    assert set(vocab.itos[4:]) == {w for w, c in train_counts.items() if c >= 2}
    assert "big" not in vocab.stoi  # once in train: below min_count
    assert "purple" not in vocab.stoi and "pink" not in vocab.stoi  # twice, but only in val/test
    assert vocab.itos[4] == "a"  # most frequent first
    assert len(build_vocab(data, min_count=1, max_size=6)) == 6


def test_unreadable_image_is_skipped(world, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data, vocab, store = world
    assert [p.name for p, _ in store.skipped] == ["bad.png"] and store.skipped[0][1]
    assert len(store) == 6 and store.images.shape == (6, 3, 16, 16) and store.images.dtype == torch.uint8
    with caplog.at_level(logging.WARNING, logger="sat_core.data.karpathy"):
        again = ImageStore(load_karpathy(write_dataset(tmp_path), tmp_path / "images"), CFG,
                           splits=["train"], progress=False)
    assert len(again) == 4 and any("bad.png" in r.getMessage() for r in caplog.records)
    ds = CaptionDataset(data, "train", vocab, store)
    assert len(ds) == 4 + 5 + 2 + 3  # bad.png's two captions are gone
    assert vocab.stoi["zebra"] not in {t for _, ids in ds.captions for t in ids}
    assert all(data.images[i].path.name != "bad.png" for i in ds.image_ids)


def test_store_pixels_and_normalise(world) -> None:
    data, _, store = world
    from sat_core.data.images import load_image, preprocess

    for index in store.row_of:
        pixels = store.get(index).view(3, -1).float()
        expected = torch.tensor(colour_of(data, index), dtype=torch.float32).view(3, 1)
        assert (pixels - expected).abs().max() <= 1
    index = data.split("val")[0]
    reference, _ = preprocess(load_image(data.images[index].path), CFG)
    assert torch.allclose(normalise(store.get(index)[None], CFG)[0], reference, atol=0.02)


def test_batches_share_length_and_images(world) -> None:
    data, vocab, store = world
    ds = CaptionDataset(data, "train", vocab, store)
    seen = []
    for batch in make_loader(ds, 3, shuffle=True, seed=1):
        assert batch.captions.shape == (len(batch.lengths), int(batch.lengths[0]))
        assert (batch.lengths == batch.lengths[0]).all() and (batch.captions != vocab.pad_id).all()
        assert len(set(batch.image_ids)) == batch.images.shape[0] == len(batch.image_ids)
        for b in range(len(batch.lengths)):
            # each caption's row must hold its own image (colour check, not just a shape)
            row = batch.images[batch.image_index[b]].view(3, -1).float().mean(1)
            owner = batch.image_ids[int(batch.image_index[b])]
            assert torch.allclose(row, torch.tensor(colour_of(data, owner), dtype=torch.float32), atol=1)
            tokens = batch.captions[b].tolist()
            assert tokens[0] == vocab.start_id and tokens[-1] == vocab.end_id
            assert tokens in [vocab.encode(s) for s in data.images[owner].sentences]
            seen.append((owner, tuple(tokens)))
    assert sorted(seen) == sorted((i, tuple(ids)) for i, ids in ds.captions)  # each caption once


def test_images_of_one_batch_are_encoded_once() -> None:
    from sat_core.data.karpathy import CaptionItem

    red, blue = torch.zeros(3, 2, 2, dtype=torch.uint8), torch.ones(3, 2, 2, dtype=torch.uint8)
    items = [CaptionItem(7, torch.tensor([1, 5, 2]), red), CaptionItem(3, torch.tensor([1, 6, 2]), blue),
             CaptionItem(7, torch.tensor([1, 8, 2]), red)]
    batch = collate(items)
    assert batch.image_ids == [7, 3] and batch.image_index.tolist() == [0, 1, 0]
    assert torch.equal(batch.images[1], blue) and batch.captions[2].tolist() == [1, 8, 2]
    moved = batch.to("cpu")
    assert torch.equal(moved.captions, batch.captions) and moved.image_ids == [7, 3]


def test_epoch_order_is_reproducible() -> None:
    lengths = [3, 5, 3, 4, 5, 3, 4, 4, 3, 5, 6, 3] * 4
    sampler = BucketBatchSampler(lengths, 2, seed=3)
    first = list(sampler)
    sampler.set_epoch(1)
    second = list(sampler)
    assert first != second and sorted(map(sorted, first)) != sorted(map(sorted, second))
    again = BucketBatchSampler(lengths, 2, seed=3)
    again.set_epoch(1)
    assert list(again) == second
    for batches in (first, second):
        assert sorted(k for b in batches for k in b) == list(range(len(lengths)))
        assert all(len({lengths[k] for k in b}) == 1 for b in batches)
    assert list(BucketBatchSampler(lengths, 2, seed=4)) != first


@pytest.mark.parametrize("batch_size, drop_last", [(2, False), (3, False), (1, False), (3, True)])
def test_sharding_is_disjoint_and_equal(batch_size: int, drop_last: bool) -> None:
    lengths = [3, 5, 3, 4, 5, 3, 4, 4, 3, 5, 6]  # 11 captions, 4 lengths: odd batch counts
    ranks = [BucketBatchSampler(lengths, batch_size, seed=0, drop_last=drop_last, num_replicas=2, rank=r)
             for r in (0, 1)]
    for s in ranks:
        s.set_epoch(2)
    shards = [[k for b in s for k in b] for s in ranks]
    assert len(list(ranks[0])) == len(list(ranks[1])) == len(ranks[0])  # equal step counts
    assert all(len({lengths[k] for k in b}) == 1 and len(b) <= batch_size for s in ranks for b in s)
    if batch_size == 1:  # 11 single captions cannot be split: one is repeated, like DistributedSampler
        assert sorted(set(shards[0]) | set(shards[1])) == list(range(11)) and len(shards[0]) == 6
    elif drop_last:
        assert not set(shards[0]) & set(shards[1])
        assert all(len(b) == batch_size for s in ranks for b in s)
    else:
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(11))


def test_eval_images(world) -> None:
    data, _, store = world
    batches = list(EvalImages(data, "train", store, batch_size=3))
    ids = [i for idx, _ in batches for i in idx]
    assert ids == [i for i in data.split("train") if data.images[i].path.name != "bad.png"]
    assert [imgs.shape[0] for _, imgs in batches] == [3, 1]
    assert torch.equal(batches[0][1][1], store.get(ids[1]))


def test_dataset_errors(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    with pytest.raises(DatasetError, match="does not exist.*sat_core.world"):
        load_karpathy(tmp_path / "missing.json", images)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_karpathy(tmp_path / "bad.json", images)
    (tmp_path / "other.json").write_text('{"annotations": []}')
    with pytest.raises(DatasetError, match='no "images" list'):
        load_karpathy(tmp_path / "other.json", images)
    good = write_dataset(tmp_path / "w")
    with pytest.raises(DatasetError, match="images folder .*nowhere does not exist"):
        load_karpathy(good, tmp_path / "nowhere")
    (tmp_path / "nosent.json").write_text(json.dumps({"images": [{"filename": "x.png", "split": "train",
                                                                  "sentences": []}]}))
    with pytest.raises(DatasetError, match=r"#0 .*\(x.png\) has no sentences"):
        load_karpathy(tmp_path / "nosent.json", images)
    doc = json.loads(good.read_text())
    doc["images"] = [e for e in doc["images"] if e["split"] != "val"]
    (tmp_path / "noval.json").write_text(json.dumps(doc))
    data = load_karpathy(tmp_path / "noval.json", tmp_path / "w" / "images")
    present = r"no images \(splits present: test \(1\), train \(5\)\)"
    with pytest.raises(DatasetError, match=r"Split 'val' .* " + present):
        data.split("val")


def test_image_batches_keep_all_captions_of_an_image_together():
    from sat_core.data.karpathy import ImageBatchSampler

    image_of = [0, 0, 0, 1, 1, 2, 2, 2, 3, 4, 4]
    sampler = ImageBatchSampler(image_of, batch_size=6, seed=3)
    assert sampler.images_per_batch == 2  # the largest image has 3 captions
    seen = []
    for batch in sampler.batches():
        images = {image_of[k] for k in batch}
        assert len(images) <= 2
        for img in images:  # every caption of each image in the batch is there
            assert sorted(k for k in batch if image_of[k] == img) == [k for k, i in enumerate(image_of) if i == img]
        seen += batch
    assert sorted(seen) == list(range(len(image_of)))
    sampler.set_epoch(1)
    other = sampler.batches()
    sampler.set_epoch(0)
    assert other != sampler.batches()
    ranks = [ImageBatchSampler(image_of, 6, seed=3, num_replicas=2, rank=r) for r in (0, 1)]
    shards = [sorted(k for b in list(s) for k in b) for s in ranks]
    assert not set(shards[0]) & set(shards[1]) and sorted(shards[0] + shards[1]) == list(range(len(image_of)))


def test_first_of_split_keeps_the_first_training_images_and_every_other_split(world) -> None:
    data, _, _ = world
    train = data.split("train")
    fewer = data.first_of_split("train", 2)
    assert [fewer.images[i].path for i in fewer.split("train")] == [data.images[i].path for i in train[:2]]
    assert fewer.split_counts == {**data.split_counts, "train": 2} and fewer.seed == data.seed
    assert [fewer.images[i].path for i in fewer.split("val")] == [data.images[i].path for i in data.split("val")]
    with pytest.raises(DatasetError, match=f"has {len(train)} train images, fewer than the 99 asked for"):
        data.first_of_split("train", 99)
