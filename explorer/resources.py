"""Everything the app loads or computes once and shares: models, the gallery, images, decodes.

Models and the gallery are one copy per server (``st.cache_resource``); per-image results are
bounded caches (``max_entries`` / ``ttl``) so memory stays flat while a class uploads photos.
Model work happens in sat_core; this module only caches its results.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import streamlit as st

from sat_core.checkpoint import CARD_FILE, CONFIG_FILE, LoadedCheckpoint, load_checkpoint
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.data.karpathy import ImageRecord, KarpathyData, load_karpathy
from sat_core.decoding import (
    Hypothesis, Intervention, beam_search, encode_images, sample_locations, score_caption,
)
from sat_core.evaluation.domain import DomainCheck, DomainReference
from sat_core.models.encoder import Annotations
from sat_core.errors import DatasetError, SatError
from sat_core.evaluation.evaluate import read_records
from sat_core.data.images import CropInfo, crop_for_display, load_image, preprocess
from sat_core.io import write_json_atomic
from sat_core.paths import list_checkpoints

from explorer.settings import DataSource

DISPLAY_SIDE = 768  # px: the original image is kept at most this large (caches hold many uploads)
EVAL_RECORDS_FILE = "eval_records.json"
# Every p, log p, α and β the pages show is computed in fp32, one row at a time (teacher forcing, step-through
# sessions): the same numbers on every page. Beam search keeps the checkpoint's precision (bf16 where it is faster),
# so its captions are those of `python -m sat_core.caption`.
NUMBERS_PRECISION = "fp32"


# ---- checkpoints ----------------------------------------------------------------------------------

def stamp(path: Path) -> str:
    """Cache key of a checkpoint folder: its path and when its config was written."""
    try:
        return f"{path}@{(path / CONFIG_FILE).stat().st_mtime_ns}"
    except OSError:
        return str(path)


@st.cache_resource(max_entries=4, show_spinner="Loading the checkpoint…")
def load_model(path: str, roots: tuple[str, ...], device: str, _stamp: str = "") -> LoadedCheckpoint:
    """One model per checkpoint per server; CheckpointError (not cached) when it cannot be loaded."""
    return load_checkpoint(path, device=device, allowed_roots=[Path(r) for r in roots])


@st.cache_data(ttl=30, max_entries=8, show_spinner=False)
def find_checkpoints(roots: tuple[str, ...]) -> list[str]:
    return [str(p) for p in list_checkpoints([Path(r) for r in roots])]


@st.cache_data(ttl=30, max_entries=256, show_spinner=False)
def checkpoint_summary(path: str) -> dict[str, Any]:
    """Attention type and a few facts from config.json, without loading weights."""
    try:
        config = json.loads((Path(path) / CONFIG_FILE).read_text(encoding="utf-8"))
        model = config.get("model", {})
        optim = ((config.get("training") or {}).get("train_config") or {}).get("optim") or {}
        return {"attention": model.get("attention", "?"), "encoder": model.get("encoder", "?"),
                "supervised": bool(optim.get("attention_lambda", 0))}
    except (OSError, ValueError, AttributeError):
        return {"attention": "?", "encoder": "?", "supervised": False}


def read_card(path: Path) -> str | None:
    card = path / CARD_FILE
    return card.read_text(encoding="utf-8") if card.is_file() else None


# ---- the dataset: gallery, references, training-like images --------------------------------------

@dataclass
class Gallery:
    """The split the server shows: every image of it, by dataset id, with its references."""

    data: KarpathyData
    source: DataSource  # the dataset actually read (a generated one when none was given)
    ids: list[int]  # image ids offered, in order
    by_id: dict[int, ImageRecord]
    note: str  # where the images came from, for captions

    def caption_hint(self, image_id: int) -> str:
        record = self.by_id[image_id]
        return " ".join(record.sentences[0]) if record.sentences else ""

    def name(self, image_id: int) -> str:
        return self.by_id[image_id].path.name


def world_test_split(kind: str) -> tuple[int, int, int]:
    """(number of test scenes, id of the first, seed) of the embedded world ``kind`` as the shipped models were
    evaluated on it (``sat_core.ship.WORLDS``): their ``eval_records.json`` names exactly these scenes."""
    from sat_core.ship import WORLDS

    world = WORLDS[kind]
    return world["test"], world["train"] + world["val"], world["seed"]


def _renumber(dataset: Path, first_id: int) -> None:
    """Give a test split written alone the ids and file names it has in the whole world (after train and val)."""
    doc = json.loads(dataset.read_text(encoding="utf-8"))
    for entry in doc["images"]:
        old = dataset.parent / entry["filepath"] / entry["filename"]
        entry["imgid"] += first_id
        entry["filename"] = f"{entry['imgid']:06d}{old.suffix}"
        entry["sentids"] = [i + first_id * len(entry["sentids"]) for i in entry["sentids"]]
        old.rename(old.with_name(entry["filename"]))
    write_json_atomic(dataset, doc)


def _generated_world(kind: str) -> Path:
    """The whole test split of the embedded world ``kind`` — the scenes the shipped models' stored records describe,
    with their ids and file names — made once per machine (in a temp dir when the cache is not writable). Each
    scene draws from its own seed (split, index), so the split is written without the training scenes."""
    import os
    import shutil

    from sat_core.worlds.writer import generate

    n, first_id, seed = world_test_split(kind)
    for base in (Path.home() / ".cache" / "sat-explorer", Path(tempfile.gettempdir()) / "sat-explorer"):
        folder = base / f"{'world' if kind == 'shapes' else kind}-test-{n}"
        if (folder / "dataset.json").is_file():
            return folder
        partial = folder.with_name(folder.name + ".partial")  # renamed when complete: a crash leaves no half world
        try:
            shutil.rmtree(partial, ignore_errors=True)
            generate(partial, 0, 0, n, seed=seed, workers=max(1, min(2, os.cpu_count() or 1)), kind=kind)
            _renumber(partial / "dataset.json", first_id)
            partial.rename(folder)
            return folder
        except (OSError, DatasetError):
            continue
    raise DatasetError("No dataset was given and there is no writable cache to generate test scenes into; "
                       "start the app with -- --data DATASET.json --images DIR.")


@st.cache_resource(max_entries=2, show_spinner="Reading the dataset (the first start without a data folder "
                                                  "draws the world's test split: about half a minute)…")
def load_gallery(source: DataSource) -> Gallery:
    """The source's split; DatasetError (not cached) with what to fix when it cannot be read.

    Only when no dataset was named and the repo has no folder of the source's world (``data/scenes``,
    ``data/world``) is that world's test split generated (the scenes the shipped models were evaluated on)."""
    note = source.label
    if not source.given and not source.data.is_file():
        missing = source.data.parent
        folder = _generated_world(source.kind)
        source = DataSource(folder / "dataset.json", folder, "test", False, source.kind)
        note = (f"the {world_test_split(source.kind)[0]} generated test scenes of the {source.kind} world, the "
                f"shipped models' test split (no dataset given, and no {missing.parent.name}/{missing.name} folder)")
    data = load_karpathy(source.data, source.images)
    records = [data.images[i] for i in data.split(source.split)]
    first = records[0].path
    if not first.is_file():
        raise DatasetError(
            f"The image {first.name} listed in {source.data.name} is not at {first}: the images folder "
            f"{source.images} does not hold the dataset's images. Start the app with --images set to the folder "
            "that the file's filepath/filename entries are relative to."
        )
    return Gallery(data, source, [r.id for r in records], {r.id: r for r in records}, note)


@st.cache_resource(max_entries=2, show_spinner=False)
def gallery_reference(source: DataSource) -> DomainReference:
    """Colour statistics of the gallery's training images: the domain check of checkpoints that
    stored none of their own (written before training statistics were kept)."""
    gallery = load_gallery(source)
    data = gallery.data
    train = [i for i, r in enumerate(data.images) if r.split == "train"][:100]
    indices = train or [i for i, r in enumerate(data.images) if r.id in gallery.by_id][:100]
    what = "train" if train else gallery.source.split
    return DomainReference.from_images([load_image(data.images[i].path) for i in indices],
                                       source=f"compared with {gallery.source.data.name}, {what} split: the checkpoint "
                                              "recorded no statistics of its own training data")


# ---- images ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PreparedImage:
    """An image ready for every view: the original, the crop the encoder saw, and its tensor."""

    key: str  # "scene:<id>" or "upload:<sha1>"
    name: str
    original: np.ndarray  # (h, w, 3) uint8, the uploaded image scaled to at most DISPLAY_SIDE px
    crop: np.ndarray  # (S, S, 3) uint8, what the encoder saw
    crop_info: CropInfo
    tensor: Any  # (3, S, S) model input
    record: ImageRecord | None  # the gallery scene, with its references and objects

    @property
    def uploaded(self) -> bool:
        return self.key.startswith("upload:")

    @property
    def references(self) -> list[str]:
        """The dataset's reference captions (none for uploads)."""
        return [" ".join(s) for s in self.record.sentences] if self.record is not None else []


def upload_key(data: bytes) -> str:
    return "upload:" + hashlib.sha1(data).hexdigest()[:16]


@st.cache_resource(max_entries=64, ttl=3600, show_spinner=False)
def prepare_image(key: str, cfg: PreprocessConfig, name: str, _source: Any, _record: ImageRecord | None = None) -> PreparedImage:
    """load_image + preprocess (ImageError, not cached, for a file that cannot be used)."""
    image = load_image(_source, name=name)
    tensor, info = preprocess(image, cfg)
    crop = np.asarray(crop_for_display(image, cfg))
    shown = image.copy()
    shown.thumbnail((DISPLAY_SIDE, DISPLAY_SIDE))  # keeps the aspect ratio; CropInfo stays in original pixels
    return PreparedImage(key, name, np.asarray(shown), crop, info, tensor, _record)


def domain_reference(loaded: LoadedCheckpoint, source: DataSource) -> DomainReference:
    """The checkpoint's own training statistics when it stored them, else the gallery's training images."""
    stored = (loaded.config.get("training") or {}).get("domain")
    return DomainReference.from_dict(stored) if stored else gallery_reference(source)


@st.cache_data(max_entries=64, ttl=3600, show_spinner=False)
def domain_check(key: str, ckpt: str, source: DataSource, _loaded: LoadedCheckpoint,
                 _original: np.ndarray, _tensor: Any = None) -> DomainCheck:
    """The checks of ``domain_reference``; with the encoder's input ``_tensor`` (3, S, S), the
    encoder's view too when the checkpoint stored one."""
    from PIL import Image

    reference = domain_reference(_loaded, source)
    annotation = None
    if reference.annotations is not None and _tensor is not None:  # as domain.mean_annotations computes it
        annotation = annotations(ckpt, key, _loaded, _tensor).feats.float().mean(1)[0].cpu().numpy()
    return reference.check(Image.fromarray(_original), annotation.astype(np.float64) if annotation is not None
                           else None)


# ---- decoding results -----------------------------------------------------------------------------

@st.cache_resource(max_entries=128, ttl=3600, show_spinner=False)
def annotations(ckpt: str, image_key: str, _loaded: LoadedCheckpoint, _tensor: Any) -> Annotations:
    """The encoder's annotations (1, L, D) of one image, computed once per checkpoint and image for every page,
    decode, read-back and step-through session of every browser session. The encoder runs in fp32 whatever the
    decoding precision (``Captioner.encode``), so sharing them changes no number; nothing writes to them."""
    return encode_images(_loaded.model, _tensor.unsqueeze(0))


@st.cache_data(max_entries=256, ttl=3600, show_spinner="Decoding…")
def decode(ckpt: str, image_key: str, cfg: DecodeConfig, region_key: str, _loaded: LoadedCheckpoint,
           _tensor: Any, _intervention: Intervention | None = None) -> list[Hypothesis]:
    """The beam's hypotheses for one image (best first); ``region_key`` names the intervention."""
    return beam_search(_loaded.model, annotations(ckpt, image_key, _loaded, _tensor), _loaded.vocab, cfg,
                       intervention=_intervention)[0]


@st.cache_data(max_entries=64, ttl=3600, show_spinner="Scoring…")
def score(ckpt: str, image_key: str, caption: str | tuple[int, ...], _loaded: LoadedCheckpoint, _tensor: Any,
          region_key: str = "", _intervention: Intervention | None = None):
    """Teacher forcing of ``caption`` (text, or token ids) in ``NUMBERS_PRECISION``; ``region_key`` names the
    intervention (if any)."""
    return score_caption(_loaded.model, _loaded.vocab, annotations(ckpt, image_key, _loaded, _tensor), caption,
                         intervention=_intervention, precision=NUMBERS_PRECISION)


@st.cache_data(max_entries=32, ttl=3600, show_spinner="Sampling locations…")
def caption_samples(ckpt: str, image_key: str, caption: str, n: int, seed: int, _loaded: LoadedCheckpoint,
                    _tensor: Any):
    """N seeded hard-attention location sequences along ``caption``."""
    return sample_locations(_loaded.model, _loaded.vocab, annotations(ckpt, image_key, _loaded, _tensor), caption, n,
                            seed=seed)


def _records_cache(ckpt: str, source: DataSource, cfg: DecodeConfig) -> Path:
    """Where records of this checkpoint on this dataset split are kept between server runs."""
    try:
        data_stamp = source.data.stat().st_mtime_ns
    except OSError:
        data_stamp = 0
    key = json.dumps([ckpt, str(source.data), data_stamp, str(source.images), source.split, cfg.to_dict()])
    name = hashlib.sha1(key.encode()).hexdigest()[:20] + ".json"
    for base in (Path.home() / ".cache" / "sat-explorer" / "records", Path(tempfile.gettempdir()) / "sat-explorer"):
        try:
            base.mkdir(parents=True, exist_ok=True)
            return base / name
        except OSError:
            continue
    return Path(tempfile.gettempdir()) / name


@st.cache_resource(max_entries=8, show_spinner=False)
def _read_stored(path: str, _stamp: int) -> tuple[dict[str, Any], frozenset]:
    """A checkpoint's stored records (read once per server and file version) and the images they name."""
    doc = read_records(Path(path))
    return doc, frozenset((r["image_id"], r.get("filename")) for r in doc["records"])


def stored_records(loaded: LoadedCheckpoint, gallery: Gallery) -> dict[str, Any] | None:
    """The checkpoint's ``eval_records.json`` when its records are exactly the gallery's images."""
    path = loaded.path / EVAL_RECORDS_FILE
    if not path.is_file():
        return None
    stored, names = _read_stored(str(path), path.stat().st_mtime_ns)
    if names != {(i, gallery.name(i)) for i in gallery.ids}:
        return None  # records of another dataset or split
    doc = dict(stored)  # the cached document stays as read
    for key in ("corpus", "grounded", "attention", "search"):  # "search": evaluated with search_errors
        doc.setdefault(key, (loaded.metrics or {}).get(key, {}))
    doc["source"] = f"{path} (stored with the checkpoint)"
    return doc


def curated(records: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """A few scenes of the stored records that show the paper's points, each with why: attention on the object a
    word names, a scene of several objects described right, a grounded mistake to step through, a miscount."""
    def best(rows: list[dict[str, Any]], key) -> dict[str, Any] | None:
        return max(rows, key=key) if rows else None

    grounded = [r for r in records if r.get("attention_correctness") is not None]
    picks = [
        (best([r for r in grounded if (r.get("n_objects") or 0) >= 2], lambda r: r["attention_correctness"]),
         "looks at what it names"),
        (best([r for r in records if not r.get("errors") and (r.get("n_objects") or 0) >= 3],
              lambda r: r["scores"].get("CIDEr") or 0), "several objects, all named right"),
        (best([r for r in records if r.get("first_error") is not None and
               {"hallucinated_object", "wrong_colour", "wrong_shape", "wrong_category"} & set(r.get("errors") or [])],
              lambda r: -(r["scores"].get("CIDEr") or 0)), "a mistake to step through"),
        (best([r for r in records if "wrong_count" in (r.get("errors") or [])], lambda r: r.get("n_objects") or 0),
         "a miscount"),
    ]
    seen: set[int] = set()
    out = []
    for record, why in picks:
        if record is not None and record["image_id"] not in seen:
            seen.add(record["image_id"])
            out.append((int(record["image_id"]), why))
    return out


def cached_records(ckpt: str, gallery: Gallery, cfg: DecodeConfig) -> dict[str, Any] | None:
    path = _records_cache(ckpt, gallery.source, cfg)
    return read_records(path) if path.is_file() else None


def compute_records(ckpt: str, loaded: LoadedCheckpoint, gallery: Gallery, cfg: DecodeConfig,
                    progress: Any = None) -> dict[str, Any]:
    """``sat_core.evaluation.evaluate`` over every image of the gallery, written to the on-disk cache."""
    from sat_core.evaluation.evaluate import evaluate

    out = evaluate(loaded, gallery.data, gallery.source.split, cfg, meteor=False, progress=progress, search_errors=True)
    out["source"] = f"computed over {out['n_images']} images of {gallery.note} (beam {cfg.beam_size})"
    try:
        write_json_atomic(_records_cache(ckpt, gallery.source, cfg), out)
    except OSError:
        pass  # no writable cache: records are computed again after a restart
    return out


@st.cache_data(max_entries=64, ttl=3600, show_spinner=False)
def thumbnail(path: str, side: int = 64) -> str:
    """A small JPEG of an image as a data URI (for table rows); empty when it cannot be read."""
    import base64
    import io

    try:
        image = load_image(path)
    except SatError:
        return ""
    image.thumbnail((side, side))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
