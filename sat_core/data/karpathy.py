"""Karpathy-format caption datasets and length-bucketed batches.

Flow: ``load_karpathy`` reads the split JSON -> ``build_vocab`` counts the train split ->
``imagestore.ImageStore`` decodes every image once (through ``sat_core.data.images``) into a uint8 cache in RAM, or
``data.cache`` memory-maps the one written on disk by an earlier run ->
``CaptionDataset`` has one item per caption -> ``make_loader`` batches captions of equal length
(the paper's bucketing), so no step or loss is spent on padding, and each image of a batch is
encoded once however many of its captions the batch holds.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from sat_core.data.imagestore import ImageRows
from sat_core.data.vocab import Vocab
from sat_core.errors import DatasetError

SPLITS = ("train", "val", "test")


# ----------------------------------------------------------------------------- the JSON file


@dataclass
class ImageRecord:
    """One image of a Karpathy split file; its position in ``KarpathyData.images`` is its index."""

    path: Path
    split: str  # train | val | test ("restval" folded into train unless asked otherwise)
    sentences: list[list[str]]  # lowercased tokens, one list per caption
    raw: list[str]
    id: int  # cocoid, else imgid, else the position in the file
    karpathy_split: str  # the split as written in the file
    objects: list[Any] | None = None  # synthetic world only: the scene's objects
    links: list[Any] | None = None  # synthetic world only: per-sentence word -> object links
    place: str | None = None  # scenes world only: where the scene is (grass, road, ...)


@dataclass
class KarpathyData:
    """A parsed split file: ``images`` in file order, plus where it came from."""

    images: list[ImageRecord]
    json_path: Path
    images_dir: Path
    split_counts: dict[str, int] = field(default_factory=dict)
    seed: int | None = None  # the generator's seed of an embedded world's file (Karpathy's files have none)

    def split(self, name: str) -> list[int]:
        """Indices of the images in split ``name``; a DatasetError if it has none."""
        indices = [i for i, rec in enumerate(self.images) if rec.split == name]
        if not indices:
            present = ", ".join(f"{k} ({v})" for k, v in sorted(self.split_counts.items()))
            raise DatasetError(
                f"Split {name!r} of {self.json_path} has no images (splits present: {present or 'none'}). "
                f"Pick one of those splits, or add images with \"split\": \"{name}\" to the file."
            )
        return indices

    def first_of_split(self, name: str, n: int) -> KarpathyData:
        """The same data with only the first ``n`` images (in file order) of split ``name``: a smaller
        training set from the same file. A DatasetError if the split holds fewer than ``n``."""
        indices = self.split(name)
        if n > len(indices):
            raise DatasetError(
                f"{self.json_path} has {len(indices)} {name} images, fewer than the {n} asked for. Ask for at "
                f"most {len(indices)} (0: all of them), or generate a world with more.")
        dropped = set(indices[n:])
        images = [rec for i, rec in enumerate(self.images) if i not in dropped]
        return KarpathyData(images, self.json_path, self.images_dir, dict(Counter(r.split for r in images)), self.seed)


def load_karpathy(
    json_path: str | Path, images_dir: str | Path, *, restval_as_train: bool = True
) -> KarpathyData:
    """Read a Karpathy-split JSON (dataset_flickr8k/30k/coco.json or the synthetic world's)."""
    json_path, images_dir = Path(json_path), Path(images_dir)
    doc = _read_json(json_path)
    if not images_dir.is_dir():
        raise DatasetError(
            f"The images folder {images_dir} does not exist. Pass the folder holding the dataset's "
            f"images (for COCO the one containing train2014/ and val2014/)."
        )
    entries = doc.get("images") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise DatasetError(
            f"{json_path} has no \"images\" list; it is not a Karpathy split file. Use "
            f"dataset_flickr8k.json / dataset_flickr30k.json / dataset_coco.json or the world's dataset.json."
        )
    images = [_parse_entry(e, i, json_path, images_dir, restval_as_train) for i, e in enumerate(entries)]
    if not images:
        raise DatasetError(f"{json_path} lists no images; regenerate or re-download it.")
    return KarpathyData(images, json_path, images_dir, dict(Counter(r.split for r in images)), doc.get("seed"))


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise DatasetError(
            f"The dataset file {path} does not exist. Download Karpathy's splits (dataset_flickr8k.json, "
            f"...) or generate the synthetic world with `python -m sat_core.world`, then pass its path."
        )
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(
            f"The dataset file {path} is not valid JSON ({exc}). Re-download or regenerate it."
        ) from exc


def _parse_entry(
    entry: Any, pos: int, json_path: Path, images_dir: Path, restval_as_train: bool
) -> ImageRecord:
    where = f"Image entry #{pos} of {json_path}"
    if not isinstance(entry, dict) or not isinstance(entry.get("filename"), str):
        raise DatasetError(f"{where} has no \"filename\"; every entry needs one. Fix or regenerate the file.")
    where += f" ({entry['filename']})"
    sents = entry.get("sentences")
    if not isinstance(sents, list) or not sents:
        raise DatasetError(
            f"{where} has no sentences; every image needs a non-empty \"sentences\" list of "
            f"{{\"tokens\": [...]}}. Remove the entry or add its captions."
        )
    split = entry.get("split")
    if split not in (*SPLITS, "restval"):
        raise DatasetError(f"{where} has split {split!r}; use train, val, test or restval.")
    tokens = [_tokens(s, where) for s in sents]
    links = [s.get("links") for s in sents] if any("links" in s for s in sents) else None
    return ImageRecord(
        path=_image_path(images_dir, entry),
        split="train" if split == "restval" and restval_as_train else split,
        sentences=tokens,
        raw=[str(s.get("raw", " ".join(t))) for s, t in zip(sents, tokens)],
        id=int(entry.get("cocoid", entry.get("imgid", pos))),
        karpathy_split=split,
        objects=entry.get("objects"),
        links=links,
        place=entry.get("place"),
    )


def _tokens(sentence: Any, where: str) -> list[str]:
    """Lowercased tokens; from "raw" (words only) when a sentence has no "tokens"."""
    if isinstance(sentence, dict) and isinstance(sentence.get("tokens"), list):
        toks = [str(t).lower() for t in sentence["tokens"]]
    elif isinstance(sentence, dict) and isinstance(sentence.get("raw"), str):
        toks = re.findall(r"[a-z0-9']+", sentence["raw"].lower())
    else:
        raise DatasetError(f"{where} has a sentence without \"tokens\" or \"raw\"; fix or regenerate it.")
    if not toks:
        raise DatasetError(f"{where} has an empty sentence; remove it or give it words.")
    return toks


def _image_path(images_dir: Path, entry: dict[str, Any]) -> Path:
    # COCO keeps images in train2014/ val2014/; Flickr files put them all in one folder.
    if entry.get("filepath"):
        nested = images_dir / str(entry["filepath"]) / entry["filename"]
        if nested.is_file():
            return nested
    return images_dir / entry["filename"]


def build_vocab(data: KarpathyData, *, min_count: int = 5, max_size: int = 10_000) -> Vocab:
    """The vocabulary of the train split only (val/test words must not leak into it)."""
    sentences = [s for i in data.split("train") for s in data.images[i].sentences]
    return Vocab.build(sentences, min_count=min_count, max_size=max_size)


# ----------------------------------------------------------------------------- captions


_NO_IMAGE = torch.empty(0, dtype=torch.uint8)  # what an item carries in place of unused pixels


class CaptionItem(NamedTuple):
    image_index: int
    tokens: torch.Tensor  # (T,) long, <start> … <end>
    image: torch.Tensor  # (3, S, S) uint8
    key: int = -1  # position in CaptionDataset.captions (sentence_of says which sentence it is)


class CaptionDataset(Dataset):
    """One item per caption of ``split`` whose image is in the store.

    ``max_len`` truncates captions to that many words (then <end>); references stay whole. With
    ``carry_images`` off (a trainer whose cached annotations stand in for the images) items carry an empty
    image: no pixel is read, or paged in from an on-disk store, for a batch that does not use it.
    """

    carry_images = True

    def __init__(
        self, data: KarpathyData, split: str, vocab: Vocab, store: ImageRows, *, max_len: int | None = None
    ) -> None:
        self.data, self.split, self.vocab, self.store = data, split, vocab, store
        self.image_ids: list[int] = [i for i in data.split(split) if i in store]
        if not self.image_ids:
            raise DatasetError(
                f"None of the images of split {split!r} could be read (see the warnings above); "
                f"check the images folder {data.images_dir}."
            )
        self.captions: list[tuple[int, list[int]]] = []
        self.sentence_of: list[tuple[int, int]] = []  # (image index, sentence index) of each caption
        for i in self.image_ids:
            for k, words in enumerate(data.images[i].sentences):
                words = words if max_len is None else words[:max_len]
                self.captions.append((i, vocab.encode(words)))
                self.sentence_of.append((i, k))
        self.lengths: list[int] = [len(ids) for _, ids in self.captions]

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, k: int) -> CaptionItem:
        index, ids = self.captions[k]
        image = self.store.get(index) if self.carry_images else _NO_IMAGE
        return CaptionItem(index, torch.tensor(ids, dtype=torch.long), image, k)

    def references(self, image_index: int) -> list[list[str]]:
        """All captions of an image as lowercased tokens (for BLEU/CIDEr)."""
        return [list(s) for s in self.data.images[image_index].sentences]


# ----------------------------------------------------------------------------- batches


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of captions of equal length, reshuffled each epoch, optionally sharded for DDP.

    Order depends only on (seed, epoch), so every rank computes the same batches and takes
    ``batches[rank::num_replicas]``. To give ranks equal step counts without repeats, the largest
    batches are halved until the count divides evenly (``drop_last`` drops the surplus instead,
    and drops each bucket's partial batch). Only when every batch has one caption are batches repeated.
    """

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        if batch_size < 1:
            raise DatasetError(f"batch_size must be at least 1, not {batch_size}.")
        if not 0 <= rank < num_replicas:
            raise DatasetError(f"rank must be in [0, {num_replicas}), not {rank}.")
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.num_replicas, self.rank, self.epoch = num_replicas, rank, 0
        buckets: dict[int, list[int]] = {}
        for k, n in enumerate(lengths):
            buckets.setdefault(int(n), []).append(k)
        self.buckets = [buckets[n] for n in sorted(buckets)]

    def set_epoch(self, epoch: int) -> None:
        """Call before each epoch for a new (but reproducible) order."""
        self.epoch = epoch

    def _total(self) -> int:
        if self.drop_last:
            return sum(len(b) // self.batch_size for b in self.buckets)
        return sum(math.ceil(len(b) / self.batch_size) for b in self.buckets)

    def __len__(self) -> int:
        total, r = self._total(), self.num_replicas
        return total // r if self.drop_last else math.ceil(total / r)

    def batches(self) -> list[list[int]]:
        """This epoch's batches over all ranks, in order."""
        # A string seed is hashed with sha512: the same on every process, unlike hash().
        rng = random.Random(f"bucket-sampler:{self.seed}:{self.epoch}")
        batches: list[list[int]] = []
        for bucket in self.buckets:
            bucket = list(bucket)
            if self.shuffle:
                rng.shuffle(bucket)
            for start in range(0, len(bucket), self.batch_size):
                chunk = bucket[start : start + self.batch_size]
                if len(chunk) == self.batch_size or not self.drop_last:
                    batches.append(chunk)
        if self.shuffle:
            rng.shuffle(batches)
        return self._balance(batches)

    def _balance(self, batches: list[list[int]]) -> list[list[int]]:
        r = self.num_replicas
        if self.drop_last:
            return batches[: len(batches) - len(batches) % r]
        while len(batches) % r:
            k = max(range(len(batches)), key=lambda j: len(batches[j]))
            if len(batches[k]) < 2:  # nothing left to split: repeat, as DistributedSampler does
                batches += batches[: r - len(batches) % r]
                break
            half = len(batches[k]) // 2
            batches[k : k + 1] = [batches[k][:half], batches[k][half:]]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()[self.rank :: self.num_replicas]


class ImageBatchSampler(BucketBatchSampler):
    """All captions of an image in one batch, padded: one encoder pass per image per epoch.

    The paper's equal-length buckets suit a frozen encoder (annotations computed once). When the
    encoder trains, its passes dominate the cost, and length buckets scatter an image's captions
    over different batches, so the image is encoded once per caption. Grouping by image encodes it
    once; the padding this adds costs a little decoder time and no loss (pads are masked).
    """

    def __init__(self, image_of: Sequence[int], batch_size: int, **kwargs: Any) -> None:
        super().__init__([0] * len(image_of), batch_size, **kwargs)
        groups: dict[int, list[int]] = {}
        for k, image in enumerate(image_of):
            groups.setdefault(int(image), []).append(k)
        self.groups = list(groups.values())
        self.images_per_batch = max(1, batch_size // max(len(g) for g in self.groups))

    def _total(self) -> int:
        n, per = len(self.groups), self.images_per_batch
        return n // per if self.drop_last else math.ceil(n / per)

    def batches(self) -> list[list[int]]:
        rng = random.Random(f"image-sampler:{self.seed}:{self.epoch}")
        groups = list(self.groups)
        if self.shuffle:
            rng.shuffle(groups)
        per, batches = self.images_per_batch, []
        for start in range(0, len(groups), per):
            chunk = groups[start : start + per]
            if len(chunk) == per or not self.drop_last:
                batches.append([k for g in chunk for k in g])
        return self._balance(batches)


@dataclass
class Batch:
    """Captions of one length plus the unique images they describe (one encoder pass each)."""

    images: torch.Tensor  # (U, 3, S, S) uint8; normalise() before the encoder
    image_index: torch.Tensor  # (B,) long: row of ``images`` for each caption
    captions: torch.Tensor  # (B, T) long, <start> … <end>
    lengths: torch.Tensor  # (B,) long
    image_ids: list[int]  # (U,) dataset image index of each row of ``images``
    keys: list[int] = field(default_factory=list)  # (B,) each caption's CaptionItem.key

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> "Batch":
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(move(self.images), move(self.image_index), move(self.captions), move(self.lengths),
                     list(self.image_ids), list(self.keys))


def collate(items: Sequence[CaptionItem]) -> Batch:
    """Stack captions; keep each image once. Pads with <pad> only if lengths differ."""
    rows: dict[int, int] = {}
    images = []
    for item in items:
        if item.image_index not in rows:
            rows[item.image_index] = len(images)
            images.append(item.image)
    lengths = torch.tensor([len(item.tokens) for item in items], dtype=torch.long)  # (B,)
    captions = torch.full((len(items), int(lengths.max())), Vocab.pad_id, dtype=torch.long)  # (B, T)
    for b, item in enumerate(items):
        captions[b, : len(item.tokens)] = item.tokens
    return Batch(
        images=torch.stack(images),  # (U, 3, S, S)
        image_index=torch.tensor([rows[item.image_index] for item in items], dtype=torch.long),  # (B,)
        captions=captions,
        lengths=lengths,
        image_ids=list(rows),
        keys=[item.key for item in items],
    )


def make_loader(
    dataset: CaptionDataset,
    batch_size: int,
    *,
    shuffle: bool,
    seed: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
    drop_last: bool = False,
    by_image: bool = False,
    pin_memory: bool = False,
) -> DataLoader:
    """Length-bucketed (or, with ``by_image``, image-grouped) DataLoader; ``pin_memory`` (for a GPU): batches in
    page-locked memory, so that ``Batch.to(device, non_blocking=True)`` overlaps the copy with the GPU's work.

    Call ``loader.batch_sampler.set_epoch(e)`` each epoch.
    """
    kwargs = dict(shuffle=shuffle, seed=seed, drop_last=drop_last, num_replicas=num_replicas, rank=rank)
    if by_image:
        sampler: BucketBatchSampler = ImageBatchSampler([i for i, _ in dataset.captions], batch_size, **kwargs)
    else:
        sampler = BucketBatchSampler(dataset.lengths, batch_size, **kwargs)
    # No worker processes: an item is a row of a decoded store (in RAM, or the on-disk cache's mapping) or, when
    # cached annotations stand in for the images, no pixels at all (CaptionDataset.carry_images), so a batch is
    # a few row copies; workers would add their start-up at every epoch and draw from the global RNG.
    return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=0, pin_memory=pin_memory)


class EvalImages:
    """The unique readable images of a split in batches, for free-running decoding.

    Iterating yields (image indices, uint8 (U,3,S,S)); normalise() before the encoder.
    """

    def __init__(self, data: KarpathyData, split: str, store: ImageRows, *, batch_size: int = 32) -> None:
        self.data, self.split, self.store, self.batch_size = data, split, store, batch_size
        self.image_ids: list[int] = [i for i in data.split(split) if i in store]
        if not self.image_ids:
            raise DatasetError(
                f"None of the images of split {split!r} could be read; check {data.images_dir}."
            )

    def __len__(self) -> int:
        return math.ceil(len(self.image_ids) / self.batch_size)

    def __iter__(self) -> Iterator[tuple[list[int], torch.Tensor]]:
        for start in range(0, len(self.image_ids), self.batch_size):
            ids = self.image_ids[start : start + self.batch_size]
            yield ids, self.store.batch(ids)  # (U, 3, S, S)

    def references(self, image_index: int) -> list[list[str]]:
        return [list(s) for s in self.data.images[image_index].sentences]
