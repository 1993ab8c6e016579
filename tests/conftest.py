"""Shared fixtures: tiny models and vocabularies that build in milliseconds on a CPU."""

from __future__ import annotations

import os

import pytest
import torch

# Never reach for the network: pretrained weights must come from a local cache only.
os.environ.setdefault("TORCH_HOME", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "torch"))

from sat_core.config import ModelConfig  # noqa: E402
from sat_core.models.captioner import Captioner  # noqa: E402
from sat_core.data.vocab import Vocab  # noqa: E402

WORDS = ["a", "red", "blue", "green", "circle", "square", "star", "left", "of", "and", "two", "circles"]


@pytest.fixture
def one_thread():
    """Tiny ops on 2 shared cores run faster, and reproducibly, on one thread (modules that train ask for it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def vocab() -> Vocab:
    return Vocab(["<pad>", "<start>", "<end>", "<unk>", *WORDS])


def tiny_config(vocab_size: int, **overrides) -> ModelConfig:
    fields = dict(vocab_size=vocab_size, small_channels=(8, 16, 16), feature_dim=16, embed_dim=16,
                  hidden_dim=32, attn_dim=16, dropout=0.0)
    fields.update(overrides)
    return ModelConfig(**fields)


@pytest.fixture(params=["soft", "hard"])
def tiny_model(request, vocab) -> Captioner:
    torch.manual_seed(0)
    return Captioner(tiny_config(len(vocab), attention=request.param)).eval()
