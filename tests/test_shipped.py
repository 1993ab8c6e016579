"""The shipped checkpoints load and caption exactly as they did when their golden captions were recorded.

``tests/data/golden_captions.json`` holds, per checkpoint folder, the tokens and log-probabilities it gave on a
fixed set of images; ``python -m tests.golden NAME`` records them (see tests/golden.py) after a checkpoint is
rebuilt. A shipped checkpoint without an entry, or one saved with options this version no longer has, is
skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from PIL import Image

from sat_core.checkpoint import load_checkpoint
from sat_core.data.karpathy import load_karpathy
from sat_core.decoding import beam_search
from sat_core.data.images import preprocess
from sat_core.worlds.writer import generate
from tests.golden import CHECKPOINTS, GOLDEN, golden_images, record, why_not, world_of

ENTRIES = json.loads(GOLDEN.read_text())["checkpoints"]
SHIPPED = sorted(p.name for p in CHECKPOINTS.iterdir() if (p / "config.json").is_file())


def _usable(name: str):
    reason = why_not(name)
    if reason is not None:
        pytest.skip(reason)
    return load_checkpoint(CHECKPOINTS / name)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, dict]:
    """The golden images of each world, generated once."""
    return {kind: golden_images(tmp_path_factory.mktemp(kind) / "w", kind) for kind in ("shapes", "scenes")}


@pytest.mark.parametrize("name", sorted(set(SHIPPED) | set(ENTRIES)))
def test_shipped_checkpoint_gives_the_recorded_captions(name, images):
    if name not in ENTRIES:
        pytest.skip(f"no golden captions for checkpoints/{name}: record them with python -m tests.golden {name}")
    loaded = _usable(name)
    want = ENTRIES[name]
    kind = world_of(loaded.config)
    assert list(want["beam1"]) == list(images[kind])
    got = record(loaded, images[kind], want["score_caption"])
    for beam in ("beam1", "beam3"):
        for key, hyp in got[beam].items():
            assert hyp["tokens"] == want[beam][key]["tokens"], (name, beam, key)
            assert hyp["logprob"] == pytest.approx(want[beam][key]["logprob"], abs=2e-3)
            assert hyp["tokens"][0] != loaded.vocab.end_id  # never an empty caption
    assert got["session_first"] == want["session_first"]
    assert got["score_first"] == pytest.approx(want["score_first"], abs=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["scenes_soft", "scenes_hard"])
def test_shipped_scenes_models_caption_alike_on_cuda_and_cpu(name, tmp_path):
    """The EfficientNet encoder and the checkpoint's own decoding on the GPU, in fp32."""
    loaded = _usable(name)
    folder = tmp_path / "w"
    generate(folder, 0, 0, 4, seed=7, workers=1, kind="scenes")
    data = load_karpathy(folder / "dataset.json", folder)
    cfg = dataclasses.replace(loaded.decode_defaults(), max_len=20, precision="fp32")
    tensors = torch.stack([preprocess(Image.open(r.path).convert("RGB"), loaded.preprocess)[0] for r in data.images])
    cpu = beam_search(loaded.model, tensors, loaded.vocab, cfg)
    gpu = beam_search(loaded.model.cuda(), tensors.cuda(), loaded.vocab, cfg)
    assert [h[0].tokens for h in gpu] == [h[0].tokens for h in cpu]
    assert [h[0].logprob for h in gpu] == pytest.approx([h[0].logprob for h in cpu], abs=1e-3)
    assert all(len(h[0].tokens) >= 3 for h in gpu)


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_a_supervised_model_looks_at_what_it_names_more_than_the_paper_objective_one(tmp_path, kind):
    """On ten newly rendered scenes (not its test split), the shipped model trained with --attention-lambda puts
    more of α on the object each word names than the paper-objective model of its attention, and says it was
    supervised."""
    from sat_core.evaluation.evaluate import evaluate

    plain, supervised = f"scenes_{kind}", f"scenes_{kind}_supervised"
    models = {name: _usable(name) for name in (plain, supervised)}
    folder = tmp_path / "w"
    generate(folder, 0, 0, 10, seed=11, workers=1, kind="scenes")
    data = load_karpathy(folder / "dataset.json", folder)
    scores = {}
    for name, loaded in models.items():
        assert loaded.config["model"]["attention"] == kind
        scores[name] = evaluate(loaded, data, "test", loaded.decode_defaults(), meteor=False)["attention"]
    assert models[supervised].optim.attention_lambda == 1.0
    assert models[plain].optim.attention_lambda == 0.0
    assert scores[supervised]["correctness"] > scores[plain]["correctness"] + 0.15
