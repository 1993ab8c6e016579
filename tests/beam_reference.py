"""Beam search's results on fixed models and inputs, recorded once: what every later search must give back.

    python -m tests.beam_reference      # rewrites tests/data/beam_reference.json (only when results may change)

Cases: two tiny random models (soft and hard attention, <end> made likely enough that hypotheses end at many
different steps) on random annotations, and ``checkpoints/shapes_soft`` on generated shapes scenes, each at beam
1, 3 and 5 with and without length normalisation (fp32, length cap 12); and on the tiny models an intervention,
seeded hard-attention location samples and seeded word samples. ``tests/test_beam_reference.py`` decodes every
case again, batched and one image at a time, and compares tokens (exactly) and scores (to 1e-5).

The tiny models' cases were written by the host-side beam bookkeeping that walked each step's candidates in
Python, before the bookkeeping moved onto the device: they hold the device-side search to the same results. The
shipped model's cases are written anew whenever the script runs (after ``checkpoints/shapes_soft`` is rebuilt); a
tiny model's case keeps its recorded results while the search agrees with them as the test checks (tokens exactly,
numbers to 1e-5), so running the script does not launder a change into the reference.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sat_core.config import DecodeConfig
from sat_core.data.vocab import Vocab
from sat_core.decoding import Intervention, beam_search
from sat_core.models.captioner import Captioner
from sat_core.models.encoder import Annotations
from tests.conftest import WORDS, tiny_config

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).parent / "data" / "beam_reference.json"
SHIPPED = ROOT / "checkpoints" / "shapes_soft"
MAX_LEN = 12
IMAGES = 5
GRID = (4, 4)


def tiny_vocab() -> Vocab:
    return Vocab(["<pad>", "<start>", "<end>", "<unk>", *WORDS])


def tiny_model(attention: str) -> Captioner:
    """Random weights, an output layer wide enough that images differ, and <end>'s bias set so that beams end
    at many different steps, some not before the cap."""
    torch.manual_seed(0)
    model = Captioner(tiny_config(len(tiny_vocab()), attention=attention)).eval()
    with torch.no_grad():
        model.decoder.L_o.weight.normal_(0.0, 1.0)
        model.decoder.L_o.bias[Vocab.end_id] += 2.0 if attention == "soft" else 4.0
    return model


def tiny_annotations() -> Annotations:
    g = torch.Generator().manual_seed(7)
    return Annotations(3 * torch.randn(IMAGES, GRID[0] * GRID[1], 16, generator=g), GRID)  # (B, L, D)


def shipped_annotations(loaded) -> Annotations:
    """Six generated shapes scenes through the checkpoint's own encoder (fp32)."""
    from PIL import Image

    from sat_core.data.images import preprocess
    from sat_core.worlds.shapes import scene as world

    rng = np.random.default_rng(11)
    scenes = [Image.fromarray(world.render(world.generate_scene(rng))) for _ in range(6)]
    batch = torch.stack([preprocess(img, loaded.preprocess)[0] for img in scenes])  # (B, 3, S, S)
    with torch.no_grad():
        return loaded.model.eval().encode(batch)


def cases() -> list[dict[str, Any]]:
    """Every case's settings: the model's name, DecodeConfig fields, and the extra arguments by name."""
    out = []
    for model in ("soft", "hard", "shapes_soft"):
        for beam in (1, 3, 5):
            for length_norm in (0.0, 1.0):
                out.append({"model": model, "beam_size": beam, "length_norm": length_norm})
    out += [
        {"model": "soft", "beam_size": 3, "length_norm": 0.7, "intervention": True},
        {"model": "hard", "beam_size": 1, "length_norm": 0.0, "hard_mode": "sample", "seed": 3},
        {"model": "hard", "beam_size": 3, "length_norm": 1.0, "hard_mode": "sample", "seed": 4},
        {"model": "soft", "beam_size": 1, "length_norm": 0.0, "sample_words": True, "seed": 5},
    ]
    return out


def case_name(case: dict[str, Any]) -> str:
    return "-".join(f"{k}={v}" for k, v in case.items())


def run_case(case: dict[str, Any], models: dict[str, tuple], feats: Annotations | None = None,
             graph: str = "auto") -> list[list]:
    """beam_search on the case's model and annotations (or ``feats``), as the hypotheses it returned;
    ``graph``: ``DecodeConfig.graph``."""
    model, vocab, annotations = models[case["model"]]
    fields = {k: case[k] for k in ("beam_size", "length_norm", "hard_mode", "seed") if k in case}
    cfg = DecodeConfig(max_len=MAX_LEN, precision="fp32", graph=graph, **fields)
    kwargs: dict[str, Any] = {}
    if case.get("intervention"):
        region = np.zeros(GRID, dtype=bool)
        region[:2, :2] = True
        kwargs["intervention"] = Intervention(region, "exclude", steps=[1, 2, 3])
    if case.get("sample_words"):
        kwargs["sample_words"] = True
    return beam_search(model, feats if feats is not None else annotations, vocab, cfg, **kwargs)


def as_record(hyp) -> dict[str, Any]:
    """What the reference keeps of a hypothesis: α and β as weighted sums (enough to see a wrong step)."""
    T = len(hyp.tokens)
    weights = np.arange(1, hyp.alphas.size + 1, dtype=np.float64).reshape(hyp.alphas.shape) / hyp.alphas.size
    return {"tokens": hyp.tokens, "logprob": hyp.logprob, "score": hyp.score, "finished": hyp.finished,
            "alpha_digest": float((hyp.alphas * weights).sum()), "beta_sum": float(np.sum(hyp.betas)),
            "locations": [int(x) for x in hyp.locations], "steps": T}


def load_models() -> dict[str, tuple]:
    """name -> (model, vocab, annotations); shapes_soft only where it is shipped."""
    vocab = tiny_vocab()
    models = {name: (tiny_model(name), vocab, tiny_annotations()) for name in ("soft", "hard")}
    if (SHIPPED / "config.json").is_file():
        from sat_core.checkpoint import load_checkpoint

        loaded = load_checkpoint(SHIPPED)
        models["shapes_soft"] = (loaded.model.eval(), loaded.vocab, shipped_annotations(loaded))
    return models


def agrees(old: list, new: list, tol: float = 1e-5) -> bool:
    """Whether two records of a case say the same: tokens, locations, steps and ends exactly, numbers to ``tol``
    (what tests/test_beam_reference.py holds a search to)."""
    if len(old) != len(new) or any(len(a) != len(b) for a, b in zip(old, new)):
        return False
    for hyps_old, hyps_new in zip(old, new):
        for a, b in zip(hyps_old, hyps_new):
            if a.keys() != b.keys() or any(a[k] != b[k] for k in ("tokens", "finished", "locations", "steps")):
                return False
            if any(abs(a[k] - b[k]) > tol for k in ("logprob", "score", "alpha_digest", "beta_sum")):
                return False
    return True


def main() -> int:
    models = load_models()
    kept = json.loads(REFERENCE.read_text())["cases"] if REFERENCE.is_file() else {}
    record = {}
    for case in cases():
        if case["model"] not in models:
            continue
        results = run_case(case, models)
        name = case_name(case)
        record[name] = [[as_record(h) for h in hyps] for hyps in results]
        if case["model"] != "shapes_soft" and name in kept and agrees(kept[name], record[name]):
            record[name] = kept[name]  # the tiny models' cases stay as the host-side search wrote them
        ends = [sum(h.finished for h in hyps) for hyps in results]
        print(f"{name}: finished per image {ends}; best: {results[0][0].words}"
              + ("" if record[name] is kept.get(name) else " (written anew)"))
    REFERENCE.write_text(json.dumps({"max_len": MAX_LEN, "cases": record}, indent=0) + "\n")
    print(f"wrote {REFERENCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
