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
from sat_core.paths import list_checkpoints
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.data import ImageRecord, KarpathyData, load_karpathy
from sat_core.decoding import Hypothesis, Intervention, beam_search, sample_hard, score_caption
from sat_core.errors import DatasetError
from sat_core.domain import DomainCheck, DomainReference
from sat_core.images import CropInfo, crop_for_display, load_image, preprocess

GALLERY_SIZE = 24  # test scenes generated when no dataset folder exists (plus training-like ones for the domain check)
DISPLAY_SIDE = 768  # px: the original image is kept at most this large (caches hold many uploads)
GALLERY_MAX = 200  # scenes offered (and evaluated on the fly) from a real dataset's test split
EVAL_RECORDS_FILE = "eval_records.json"


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
        return {"attention": model.get("attention", "?"), "encoder": model.get("encoder", "?")}
    except (OSError, ValueError):
        return {"attention": "?", "encoder": "?"}


def read_card(path: Path) -> str | None:
    card = path / CARD_FILE
    return card.read_text(encoding="utf-8") if card.is_file() else None


# ---- the gallery of test scenes -------------------------------------------------------------------

@dataclass
class Gallery:
    data: KarpathyData
    ids: list[int]  # image ids offered, in order
    by_id: dict[int, ImageRecord]
    note: str  # where the scenes came from
    reference: DomainReference  # colour statistics of training-like images

    def caption_hint(self, image_id: int) -> str:
        record = self.by_id[image_id]
        return " ".join(record.sentences[0]) if record.sentences else ""


def _generated_world() -> Path:
    """A small test gallery made once per machine (in a temp dir when the cache is not writable)."""
    from sat_core.world import generate

    for base in (Path.home() / ".cache" / "sat-explorer", Path(tempfile.gettempdir()) / "sat-explorer"):
        folder = base / "world"
        if (folder / "dataset.json").is_file():
            return folder
        try:
            generate(folder, 40, 0, GALLERY_SIZE, seed=0, workers=1)
            return folder
        except (OSError, DatasetError):
            continue
    raise DatasetError("No dataset folder and no writable cache to generate test scenes into; pass --world DIR.")


@st.cache_resource(max_entries=2, show_spinner="Preparing the gallery of test scenes…")
def load_gallery(world_dir: str) -> Gallery:
    folder = Path(world_dir)
    note = f"test scenes of {folder}"
    if not (folder / "dataset.json").is_file():
        folder = _generated_world()
        note = f"{GALLERY_SIZE} generated test scenes (no dataset at {world_dir})"
    data = load_karpathy(folder / "dataset.json", folder)
    split = [i for i, r in enumerate(data.images) if r.split == "test"] or list(range(len(data.images)))
    records = [data.images[i] for i in split[:GALLERY_MAX]]
    train = [i for i, r in enumerate(data.images) if r.split == "train"][:100] or split[:100]
    reference = DomainReference.from_images([load_image(data.images[i].path) for i in train])
    return Gallery(data, [r.id for r in records], {r.id: r for r in records}, note, reference)


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


@st.cache_data(max_entries=64, ttl=3600, show_spinner=False)
def domain_check(key: str, world_dir: str, _original: np.ndarray) -> DomainCheck:
    from PIL import Image

    return load_gallery(world_dir).reference.check(Image.fromarray(_original))


# ---- decoding results -----------------------------------------------------------------------------

@st.cache_data(max_entries=256, ttl=3600, show_spinner="Decoding…")
def decode(ckpt: str, image_key: str, cfg: DecodeConfig, region_key: str, _loaded: LoadedCheckpoint,
           _tensor: Any, _intervention: Intervention | None = None) -> list[Hypothesis]:
    """The beam's hypotheses for one image (best first); ``region_key`` names the intervention."""
    return beam_search(_loaded.model, _tensor.unsqueeze(0), _loaded.vocab, cfg, intervention=_intervention)[0]


@st.cache_data(max_entries=64, ttl=3600, show_spinner="Scoring…")
def score(ckpt: str, image_key: str, caption: str, _loaded: LoadedCheckpoint, _tensor: Any):
    return score_caption(_loaded.model, _loaded.vocab, _tensor, caption)


@st.cache_data(max_entries=32, ttl=3600, show_spinner="Sampling locations…")
def samples(ckpt: str, image_key: str, n: int, seed: int, max_len: int, _loaded: LoadedCheckpoint,
            _tensor: Any) -> list[Hypothesis]:
    cfg = DecodeConfig(beam_size=1, max_len=max_len)
    return sample_hard(_loaded.model, _loaded.vocab, _tensor, n, seed=seed, cfg=cfg)


@st.cache_resource(max_entries=4, ttl=6 * 3600, show_spinner="Evaluating the gallery (once per checkpoint)…")
def eval_records(ckpt: str, world_dir: str, cfg: DecodeConfig, _loaded: LoadedCheckpoint) -> dict[str, Any]:
    """``eval_records.json`` of the checkpoint when it has one (corpus, grounded and attention figures
    from its metrics), else ``sat_core.evaluate`` over the gallery now: records of one format either way."""
    stored = _loaded.path / EVAL_RECORDS_FILE
    if stored.is_file():
        out = json.loads(stored.read_text(encoding="utf-8"))
        for key in ("corpus", "grounded", "attention"):
            out.setdefault(key, (_loaded.metrics or {}).get(key, {}))
        out.setdefault("source", f"{stored}")
        return out
    from sat_core.evaluate import evaluate_images

    gallery = load_gallery(world_dir)
    indices = [i for i, r in enumerate(gallery.data.images) if gallery.by_id.get(r.id) is r]  # the offered scenes
    out = evaluate_images(_loaded, gallery.data, indices, cfg, meteor=False)
    out["source"] = f"computed now over {out['n_images']} {gallery.note} (beam {cfg.beam_size})"
    return out
