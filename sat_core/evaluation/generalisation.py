"""How a checkpoint holds up off its generator: the in-distribution split beside a shifted split and the
transformation suite (``sat_core.transforms``).

    python -m sat_core.evaluate --checkpoint checkpoints/scenes_soft --data data/scenes/dataset.json \
        --images data/scenes --out metrics.json --generalisation [data/scenes_suite] \
        [--shifted data/scenes_shifted/dataset.json]

Every set is evaluated by ``evaluate.evaluate_images`` — the decoding, metrics and grounding the
in-distribution figures come from — and reduced to one row of figures (``set_figures``). On the
flipped set the row also holds the mirror figure (``mirror_agreement``): of the left/right statements
in the captions of the original scenes about a pair of objects that the caption of the flipped copy
also places left/right, the share whose direction is mirrored.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from sat_core.config import DecodeConfig
from sat_core.checkpoint import LoadedCheckpoint
from sat_core.data.karpathy import KarpathyData, load_karpathy
from sat_core.errors import DatasetError
from sat_core.evaluation.confidence import ConfidenceReference, kept_reference

DEFAULT_SUITE = Path("data/scenes_suite")
DEFAULT_SHIFTED = Path("data/scenes_shifted/dataset.json")
SHIFTED = "shifted"
FLIP = "hflip"


# ---- figures of one evaluated set -----------------------------------------------------------------------

def category_recall(records: Sequence[dict[str, Any]], data: KarpathyData) -> float | None:
    """Mean over captions of the share of the scene's objects matched by a mention of their category, whatever
    colour it states (the grounding's recall also asks for the right colour)."""
    objects = {r.id: r.objects for r in data.images if r.objects}
    shares = []
    for rec in records:
        scene, g = objects.get(rec["image_id"]), rec.get("grounding")
        if not scene or g is None or "category" not in scene[0]:  # the shapes world names no categories
            continue
        category = {o["id"]: o["category"] for o in scene}
        named = {i for m, ids in zip(g["parsed"]["mentions"], g["matches"]) for i in ids
                 if category[i] == m["category"]}
        shares.append(len(named) / len(scene))
    return float(np.mean(shares)) if shares else None


def set_figures(result: dict[str, Any], data: KarpathyData) -> dict[str, Any]:
    """One set's row from ``evaluate.evaluate_images``' result on it (None: not measurable there)."""
    g, a = result["grounded"], result["attention"]
    return {
        "n_images": result["n_images"],
        "BLEU-4": result["corpus"].get("BLEU-4"), "CIDEr": result["corpus"].get("CIDEr"),
        "precision": g.get("precision"), "recall": g.get("recall"),
        "category_recall": category_recall(result["records"], data),
        "count_accuracy": g.get("count_accuracy"), "relation_accuracy": g.get("relation_accuracy"),
        "relations_stated": g.get("relations_stated"),
        "attention_correctness": a.get("correctness"), "attention_ratio": a.get("ratio"),
        "alpha_entropy": a.get("entropy_nats"),
        "empty_captions": sum(not r["tokens"] for r in result["records"]),
    }


# ---- the out-of-domain warning ----------------------------------------------------------------------------

def warned_images(loaded: LoadedCheckpoint, data: KarpathyData, indices: Sequence[int]) -> dict[int, bool] | None:
    """{image id: whether the explorer's out-of-domain check (``domain.DomainReference``, the checkpoint's own
    training statistics) warns about it} for the images at ``indices``; None where the checkpoint stored none."""
    from sat_core.evaluation.domain import DomainReference, mean_annotations
    from sat_core.data.images import load_and_preprocess

    stored = (loaded.config.get("training") or {}).get("domain")
    if not stored or not indices:
        return None
    reference = DomainReference.from_dict(stored)
    warned: dict[int, bool] = {}
    for start in range(0, len(indices), 32):
        chunk = indices[start:start + 32]
        loaded_images = [load_and_preprocess(data.images[i].path, loaded.preprocess) for i in chunk]
        annotations = [None] * len(loaded_images)
        if reference.annotations is not None:
            import torch

            annotations = list(mean_annotations(loaded.model, torch.stack([t for t, _, _ in loaded_images])))
        for i, (_, image, _), a in zip(chunk, loaded_images, annotations):
            warned[data.images[i].id] = bool(reference.check(image, a).far)
    return warned


def erring(record: dict[str, Any]) -> bool | None:
    """Whether a caption gets an object of its scene wrong: misses one, misnames one, names one the scene does not
    hold or too many of one (grounded recall or precision under 1); None for a caption with no grounding."""
    g = record.get("grounding")
    if g is None or g.get("recall") is None:
        return None
    precision = g.get("precision")
    return g["recall"] < 1 or (precision is not None and precision < 1)


def warning_figures(warned: dict[int, bool] | None, records: Sequence[dict[str, Any]],
                    name: str = "warned") -> dict[str, float | None]:
    """How a notice's per-image flags line up with the captions' object errors over one set (``warned``:
    ``warned_images``' or ``unsure_images``' flags, ``records``: the evaluation's): ``name`` the share of the
    images flagged, ``erring`` the share whose caption gets an object wrong (``erring``), ``name_erring`` the
    share of those that are flagged (the notice's hit rate where the model fails) and ``name_right`` the share of
    the others that are (its false alarms). None where not measurable."""
    if warned is None:
        return {name: None, "erring": None, f"{name}_erring": None, f"{name}_right": None}
    pairs = [(warned[r["image_id"]], e) for r in records
             if r["image_id"] in warned and (e := erring(r)) is not None]

    def share(flags: list[bool]) -> float | None:
        return sum(flags) / len(flags) if flags else None

    return {name: share(list(warned.values())), "erring": share([e for _, e in pairs]),
            f"{name}_erring": share([w for w, e in pairs if e]), f"{name}_right": share([w for w, e in pairs if not e])}


def unsure_images(reference: ConfidenceReference | None, records: Sequence[dict[str, Any]]) -> dict[int, bool] | None:
    """{image id: whether its caption is less likely than ``reference`` allows (``confidence``)}; None without
    a reference."""
    if reference is None:
        return None
    return {r["image_id"]: reference.unsure(r["logprob"]) for r in records if r.get("logprob") is not None}


def notice_figures(loaded: LoadedCheckpoint, data: KarpathyData, indices: Sequence[int],
                   records: Sequence[dict[str, Any]], reference: ConfidenceReference | None) -> dict[str, Any]:
    """Both notices' figures over one set: the out-of-domain warning's and the unsure caption flag's."""
    return {**warning_figures(warned_images(loaded, data, indices), records),
            **warning_figures(unsure_images(reference, records), records, "unsure")}


# ---- the mirror figure -------------------------------------------------------------------------------------

def left_right_statements(grounding: dict[str, Any]) -> list[tuple[int, int]]:
    """(left object id, right object id) for every pair of objects a caption's left/right relations place, from
    its grounding (``Grounding.to_dict`` as in the evaluation records): "a dog to the right of a car" about dog
    0 and car 1 gives (1, 0)."""
    out = []
    for rel in grounding["parsed"]["relations"]:
        if rel["relation"] not in ("left_of", "right_of"):
            continue
        for a in grounding["matches"][rel["a"]]:
            for b in grounding["matches"][rel["b"]]:
                out.append((a, b) if rel["relation"] == "left_of" else (b, a))
    return out


def mirror_agreement(pairs: Iterable[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """Over (grounding of the original scene's caption, grounding of its mirror image's caption) with the same
    object ids: ``stated`` left/right statements about a pair of objects in the originals, ``surviving`` those
    whose pair the flipped caption also places left/right, ``mirrored`` those it places the other way round
    (every time it places them), ``share`` = mirrored / surviving."""
    stated = surviving = mirrored = 0
    for original, flipped in pairs:
        said = left_right_statements(flipped)
        for left, right in left_right_statements(original):
            stated += 1
            about = [s for s in said if set(s) == {left, right}]
            if about:
                surviving += 1
                mirrored += all(s == (right, left) for s in about)
    return {"stated": stated, "surviving": surviving, "mirrored": mirrored,
            "share": mirrored / surviving if surviving else None}


def _mirror_of(original: Sequence[dict[str, Any]], flipped: Sequence[dict[str, Any]]) -> dict[str, Any]:
    by_id = {r["image_id"]: r for r in original if r.get("grounding")}
    return mirror_agreement((by_id[r["image_id"]]["grounding"], r["grounding"]) for r in flipped
                            if r.get("grounding") and r["image_id"] in by_id)


# ---- the sets ---------------------------------------------------------------------------------------------------

def find_sets(suite_dir: str | Path | None, shifted: str | Path | None,
              skip_shifted: bool = False) -> list[tuple[str, Path]]:
    """(name, dataset.json) of the shifted split and each suite folder, suite transforms in their order.

    ``shifted`` None: ``DEFAULT_SHIFTED``, skipped with a warning when absent; a path given must exist.
    ``skip_shifted``: the suite's sets only (a suite over validation scenes, chosen on without reading the
    shifted split)."""
    from sat_core.worlds.scenes.transforms import NAMES

    found: list[tuple[str, Path]] = []
    path = Path(shifted) if shifted is not None else DEFAULT_SHIFTED
    if not skip_shifted:
        if path.is_file():
            found.append((SHIFTED, path))
        elif shifted is not None:
            raise DatasetError(f"The shifted split {path} does not exist; pass the dataset.json of a shifted scenes "
                               "world.")
        else:
            warnings.warn(f"no shifted split at {path}: not evaluated (pass --shifted PATH)", stacklevel=2)
    if suite_dir is not None:
        suite = Path(suite_dir)
        folders = sorted((p for p in suite.glob("*/dataset.json")),
                         key=lambda p: (NAMES.index(p.parent.name) if p.parent.name in NAMES else len(NAMES),
                                        p.parent.name))
        if not folders:
            raise DatasetError(f"{suite} holds no transformed sets; write them with python -m sat_core.transforms "
                               f"--data data/scenes/dataset.json --out {suite}.")
        found += [(p.parent.name, p) for p in folders]
    return found


def _indices(data: KarpathyData, split: str, limit: int | None) -> list[int]:
    """The split's images (all of them where the file has none of that split), the first ``limit``."""
    indices = [i for i, r in enumerate(data.images) if r.split == split] or list(range(len(data.images)))
    return indices[:limit] if limit else indices


def report(loaded: LoadedCheckpoint, cfg: DecodeConfig, result: dict[str, Any], data: KarpathyData, *,
           suite_dir: str | Path | None = DEFAULT_SUITE, shifted: str | Path | None = None,
           limit: int | None = None, batch_size: int = 32, skip_shifted: bool = False) -> dict[str, dict[str, Any]]:
    """{set name: figures} for the in-distribution ``result`` (``evaluate.evaluate``'s, on ``data``; named by its
    split) and each set of ``find_sets``, every set decoded and scored by ``evaluate.evaluate_images``; the unsure
    flag against the mark the checkpoint keeps (none: its figures are None)."""
    from sat_core.evaluation.evaluate import evaluate_images

    split = result.get("split", "test")
    out = {split: set_figures(result, data)}
    confidence = kept_reference(loaded.config)
    out[split].update(notice_figures(loaded, data, _indices(data, split, limit or result.get("n_images")),
                                     result["records"], confidence))
    for name, path in find_sets(suite_dir, shifted, skip_shifted):
        shifted_data = load_karpathy(path, path.parent)
        indices = _indices(shifted_data, split, limit)
        # METEOR is not among the figures: skip its JVM start per set
        scored = evaluate_images(loaded, shifted_data, indices, cfg, meteor=False, batch_size=batch_size)
        out[name] = set_figures(scored, shifted_data)
        out[name].update(notice_figures(loaded, shifted_data, indices, scored["records"], confidence))
        if name == FLIP:
            out[name]["mirror"] = _mirror_of(result["records"], scored["records"])
    return out


def table_lines(figures: dict[str, dict[str, Any]]) -> list[str]:
    """One row per set: the columns of ``set_figures``, and the mirror figure under the table."""
    columns = [("images", "n_images"), ("BLEU-4", "BLEU-4"), ("CIDEr", "CIDEr"), ("prec", "precision"),
               ("recall", "recall"), ("cat.rec", "category_recall"), ("count", "count_accuracy"),
               ("relation", "relation_accuracy"), ("att.corr", "attention_correctness"), ("×unif", "attention_ratio"),
               ("α entr", "alpha_entropy"), ("empty", "empty_captions"), ("warned", "warned"),
               ("erring", "erring"), ("warn|err", "warned_erring"), ("warn|ok", "warned_right"),
               ("unsure", "unsure"), ("uns|err", "unsure_erring"), ("uns|ok", "unsure_right")]

    def cell(v: Any) -> str:
        return "n/a" if v is None else str(v) if isinstance(v, int) else f"{v:.3f}"

    width = max(len(n) for n in figures) + 2
    lines = ["set".ljust(width) + "".join(f"{head:>9}" for head, _ in columns)]
    lines += [name.ljust(width) + "".join(f"{cell(f.get(key)):>9}" for _, key in columns)
              for name, f in figures.items()]
    mirror = figures.get(FLIP, {}).get("mirror")
    if mirror:
        lines.append(f"{FLIP}: {mirror['mirrored']} of the {mirror['surviving']} left/right statements whose pair the "
                     f"flipped caption also places are mirrored ({cell(mirror['share'])}; {mirror['stated']} stated)")
    return lines
