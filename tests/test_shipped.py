"""The shipped checkpoints, saved before later refactors, still load and caption exactly as they did.

``tests/data/golden_captions.json`` was written by the code of the first build (before the config and
module restructuring): the same scenes, the same settings, the same tokens must come out.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from sat_core.checkpoint import load_checkpoint
from sat_core.config import DecodeConfig
from sat_core.data import load_karpathy
from sat_core.decoding import DecodeSession, beam_search, score_caption
from sat_core.images import preprocess
from sat_core.world import generate

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((Path(__file__).parent / "data" / "golden_captions.json").read_text())


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Image.Image]:
    from skimage import data as skdata

    folder = tmp_path_factory.mktemp("golden") / "w"
    generate(folder, 0, 0, 6, seed=123, workers=1)
    data = load_karpathy(folder / "dataset.json", folder)
    out = {f"world_seed123_test_{i}": Image.open(r.path).convert("RGB") for i, r in enumerate(data.images)}
    out["skimage_chelsea"] = Image.fromarray(skdata.chelsea())
    return out


@pytest.mark.parametrize("name", ["shapes_soft", "shapes_hard"])
def test_shipped_checkpoint_gives_the_recorded_captions(name, images):
    loaded = load_checkpoint(ROOT / "checkpoints" / name)
    golden = GOLDEN[name.removeprefix("shapes_")]
    assert list(golden["beam1"]) == list(images)
    tensors = torch.stack([preprocess(im, loaded.preprocess)[0] for im in images.values()])
    for beam in (1, 3):
        hyps = beam_search(loaded.model, tensors, loaded.vocab, DecodeConfig(beam_size=beam, max_len=20, precision="fp32"))
        for key, hyp in zip(images, hyps):
            want = golden[f"beam{beam}"][key]
            assert hyp[0].tokens == want["tokens"], (name, beam, key)
            assert hyp[0].logprob == pytest.approx(want["logprob"], abs=2e-3)
    session = DecodeSession(loaded.model, loaded.vocab, tensors[0], DecodeConfig(beam_size=1, max_len=20, precision="fp32"))
    session.run()
    assert [s.token for s in session.steps] == golden["session_first"]
    scored = score_caption(loaded.model, loaded.vocab, tensors[0], "a red square", precision="fp32")
    assert scored.logprobs.tolist() == pytest.approx(golden["score_first"], abs=2e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["scenes_soft", "scenes_hard"])
def test_shipped_scenes_models_caption_alike_on_cuda_and_cpu(name, tmp_path):
    """The EfficientNet encoder, the count head's model and the one-mention rule on the GPU, in fp32."""
    folder = tmp_path / "w"
    generate(folder, 0, 0, 4, seed=7, workers=1, kind="scenes")
    data = load_karpathy(folder / "dataset.json", folder)
    loaded = load_checkpoint(ROOT / "checkpoints" / name)
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
    from sat_core.evaluate import evaluate

    folder = tmp_path / "w"
    generate(folder, 0, 0, 10, seed=11, workers=1, kind="scenes")
    data = load_karpathy(folder / "dataset.json", folder)
    plain, supervised = f"scenes_{kind}", f"scenes_{kind}_supervised"
    scores = {}
    for name in (plain, supervised):
        loaded = load_checkpoint(ROOT / "checkpoints" / name)
        assert loaded.config["model"]["attention"] == kind
        scores[name] = evaluate(loaded, data, "test", loaded.decode_defaults(), meteor=False)["attention"]
    assert load_checkpoint(ROOT / "checkpoints" / supervised).optim.attention_lambda == 1.0
    assert load_checkpoint(ROOT / "checkpoints" / plain).optim.attention_lambda == 0.0
    assert scores[supervised]["correctness"] > scores[plain]["correctness"] + 0.15
