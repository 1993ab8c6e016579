"""A tiny world and two tiny random-weight checkpoints (soft, hard), made once per test session.

The app finds them through SAT_WORLD_DIR and SAT_CHECKPOINT_DIRS, as a server started with
``-- --world DIR --checkpoints DIR`` would.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from sat_core.checkpoint import load_checkpoint, save_checkpoint
from sat_core.config import ModelConfig, OptimConfig, PreprocessConfig, TrainConfig
from sat_core.models.captioner import Captioner
from sat_core.data.vocab import Vocab
from sat_core.worlds.writer import generate

APP = str(Path(__file__).resolve().parents[2] / "explorer" / "app.py")
N_TEST, N_TRAIN = 10, 40  # enough training-like scenes for the domain reference


@dataclass
class Env:
    world: Path
    roots: Path  # folder holding the checkpoints tiny-soft/ and tiny-hard/ (names unlike shipped ones)
    dataset: dict

    def checkpoint(self, attention: str):
        return load_checkpoint(self.roots / f"tiny-{attention}")

    def scene_path(self, image_id: int) -> Path:
        entry = next(e for e in self.dataset["images"] if e["imgid"] == image_id)
        return self.world / entry["filepath"] / entry["filename"]

    def test_ids(self) -> list[int]:
        return [e["imgid"] for e in self.dataset["images"] if e["split"] == "test"]


def _tiny(vocab: Vocab, attention: str) -> tuple[Captioner, ModelConfig]:
    torch.manual_seed(1 if attention == "soft" else 2)
    config = ModelConfig(vocab_size=len(vocab), small_channels=(8, 16, 16), feature_dim=16, embed_dim=16,
                         hidden_dim=32, attn_dim=16, dropout=0.0, attention=attention)
    return Captioner(config).eval(), config


@pytest.fixture(scope="session")
def explorer_env(tmp_path_factory) -> Env:
    base = tmp_path_factory.mktemp("explorer")
    world = base / "world"
    generate(world, N_TRAIN, 0, N_TEST, seed=3, workers=1)
    dataset = json.loads((world / "dataset.json").read_text())
    vocab = Vocab.build([s["tokens"] for e in dataset["images"] for s in e["sentences"]])
    roots = base / "ckpts"
    for attention in ("soft", "hard"):
        model, config = _tiny(vocab, attention)
        save_checkpoint(roots / f"tiny-{attention}", model, model_config=config, vocab=vocab, preprocess=PreprocessConfig(),
                        metrics={"BLEU-4": 0.123, "CIDEr": 0.456},
                        model_card=f"# Tiny {attention} model\n\nRandom weights, for the explorer's tests.\n")
    # the hard model again, evaluated at beam 4 with length normalisation 1 and a cap of 16 words: the sidebar
    # follows its settings
    model, config = _tiny(vocab, "hard")
    # ... and trained, its record says, with supervised attention (the teaching page says so)
    supervised = TrainConfig(optim=OptimConfig(attention_lambda=0.5)).to_dict()
    save_checkpoint(roots / "tiny-hard-normed", model, model_config=config, vocab=vocab, preprocess=PreprocessConfig(),
                    training={"train_config": supervised},
                    metrics={"BLEU-4": 0.1, "beam": 4, "length_norm": 1.0, "max_len": 16},
                    model_card="# Tiny hard model, normalised\n")
    old = {k: os.environ.get(k) for k in ("SAT_WORLD_DIR", "SAT_CHECKPOINT_DIRS")}
    os.environ["SAT_WORLD_DIR"] = str(world)
    os.environ["SAT_CHECKPOINT_DIRS"] = str(roots)
    yield Env(world, roots, dataset)
    for key, value in old.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def new_app(params: dict[str, str] | None = None):
    """A fresh app session (the tiny soft model unless params say otherwise), not yet run."""
    AppTest = pytest.importorskip("streamlit.testing.v1").AppTest  # skipped where streamlit is not installed

    at = AppTest.from_file(APP, default_timeout=30)
    at.query_params = {"ckpt": "tiny-soft", **(params or {})}
    return at


@pytest.fixture
def app(explorer_env):
    """A fresh app session on the Caption page, run once."""
    at = new_app()
    at.run()
    assert not at.exception, at.exception
    return at


def png_bytes(path: Path) -> bytes:
    return path.read_bytes()


def photo_jpeg() -> bytes:
    """A real photo (scikit-image's astronaut, shipped with the package) as JPEG bytes."""
    from PIL import Image
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.astronaut()).resize((256, 256)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()
