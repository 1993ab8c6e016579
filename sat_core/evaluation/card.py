"""What a checkpoint says about itself: statistics of its training data, and its model card.

The trainer stores ``training_statistics`` in every checkpoint it writes (the explorer's out-of-domain
check and the error labels' word kinds read them); ``python -m sat_core.evaluate --card`` writes
``metrics.json``, ``eval_records.json`` and ``MODEL_CARD.md`` into the checkpoint folder, so a user's
model has the same card as the shipped ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from PIL import Image

from sat_core.evaluation.caption_errors import WordStats
from sat_core.checkpoint import CARD_FILE, METRICS_FILE, LoadedCheckpoint
from sat_core.config import PreprocessConfig
from sat_core.data.karpathy import KarpathyData
from sat_core.evaluation.confidence import UNSURE_SHARE
from sat_core.evaluation.domain import AnnotationReference, DomainReference, mean_annotations
from sat_core.errors import ImageError
from sat_core.data.images import load_image, preprocess
from sat_core.io import atomic_write, write_json_atomic

RECORDS_FILE = "eval_records.json"
DOMAIN_IMAGES = 100  # training images whose colour statistics a checkpoint keeps


def domain_images(data: KarpathyData, split: str = "train") -> list[Image.Image]:
    """The first DOMAIN_IMAGES readable images of a split: the references of the out-of-domain check."""
    images = []
    for i in data.split(split):
        if len(images) == DOMAIN_IMAGES:
            break
        try:
            images.append(load_image(data.images[i].path))
        except ImageError:
            continue  # the trainer reports unreadable images itself
    return images


def annotation_statistics(model: Any, preprocess_cfg: PreprocessConfig,
                          images: list[Image.Image]) -> dict[str, Any] | None:
    """``AnnotationReference`` of ``images`` through ``model``'s encoder, as a dict (None for < 2 images)."""
    if len(images) < 2:
        return None
    tensors = torch.stack([preprocess(im, preprocess_cfg)[0] for im in images])
    return AnnotationReference.from_features(mean_annotations(model, tensors)).to_dict()


def training_statistics(data: KarpathyData, split: str = "train", *, model: Any = None,
                        preprocess_cfg: PreprocessConfig | None = None,
                        images: list[Image.Image] | None = None) -> dict[str, Any]:
    """Colour statistics of up to DOMAIN_IMAGES training images and word statistics of all their
    captions; with ``model`` (and its ``preprocess_cfg``), the same images through its encoder too.
    ``images``: ``domain_images(data, split)`` when the caller has already read them."""
    indices = data.split(split)
    name = f"{data.json_path.name} ({split} split, {len(indices)} images)"
    images = domain_images(data, split) if images is None else images
    stats: dict[str, Any] = {"word_stats": WordStats.from_references(
        [data.images[i].sentences for i in indices], source=name).to_dict()}
    if len(images) >= 2:
        stats["domain"] = DomainReference.from_images(images, source=name).to_dict()
        if model is not None and preprocess_cfg is not None:
            stats["domain"]["annotations"] = annotation_statistics(model, preprocess_cfg, images)
    return stats


def _figure(value: Any) -> str:
    """A card figure: counts (words, regions, images) as integers, scores to three decimals."""
    if value is None:
        return "n/a"
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def _training_of_encoder(model: dict[str, Any]) -> str:
    if model.get("finetune_encoder"):
        return "fine-tuned"
    n = int(model.get("tune_blocks") or 0)
    return f"frozen but for its last {n} block{'s' if n > 1 else ''}, trained with the decoder" if n else "frozen"


def model_card(name: str, config: dict[str, Any], metrics: dict[str, Any], *, about: Sequence[str] = ()) -> str:
    """MODEL_CARD.md text: what the model is, what it was trained on, its evaluation figures."""
    model, training = config.get("model", {}), config.get("training", {})
    lines = [f"# SAT Explorer — `{name}` ({model.get('attention', '?')} attention)", "", *about]
    lines += [
        "", "## Model",
        f"- Encoder: {model.get('encoder', '?')} ({_training_of_encoder(model)}); "
        f"annotations of {model.get('feature_dim', '?')} dimensions at "
        f"{config.get('preprocess', {}).get('image_size', '?')} px.",
        f"- Decoder: LSTM {model.get('hidden_dim', '?')}, embedding {model.get('embed_dim', '?')}, attention MLP "
        f"{model.get('attn_dim', '?')}, vocabulary {model.get('vocab_size', '?')} words, gate β "
        f"{'on' if model.get('gate') and model.get('attention') == 'soft' else 'off'}; (h_0, c_0) from "
        "the mean annotation.",
    ]
    if training.get("dataset"):
        lines += ["", "## Training", f"- Data: `{training['dataset']}`; epoch {training.get('epoch', '?')}, "
                                     f"step {training.get('step', '?')}."]
        lines += training_lines(training, metrics)
        optim = training.get("train_config", {}).get("optim", {})
        if optim:
            lines += [f"- Optimiser: {optim.get('optimizer', '?')}, learning rate {_schedule(optim, training)}."]
            if optim.get("attention_lambda"):
                lines += [f"- Attention: supervised towards the object each word names (`--attention-lambda "
                          f"{optim['attention_lambda']:g}`, Liu et al., 2017; not in the paper): α was taught with "
                          "the world's masks, not learnt from the captions alone."]
    lines += ["", f"## {str(metrics.get('split', 'evaluation')).capitalize()} split "
                  f"({metrics.get('n_images', '?')} images, beam {metrics.get('beam', '?')}, "
                  f"length normalisation {metrics.get('length_norm', 0.0)}, "
                  f"at most {metrics.get('max_len', '?')} words, "
                  f"{metrics.get('precision', 'fp32')})",
              "| metric | value |", "| --- | --- |"]
    lines += [f"| {k} | {_figure(v)} |" for k, v in metrics.get("corpus", {}).items()]
    lines += [f"| grounded {k} | {_figure(v)} |" for k, v in metrics.get("grounded", {}).items()
              if isinstance(v, (int, float))]
    lines += [f"| attention {k} | {_figure(v)} |" for k, v in metrics.get("attention", {}).items()
              if isinstance(v, (int, float))]
    unsure = metrics.get("confidence") or {}
    lines += [f"| {label} | {_figure(unsure[k])} |" for label, k in _UNSURE_ROWS
              if isinstance(unsure.get(k), (int, float))]
    lines += generalisation_lines(metrics.get("generalisation"))
    lines += ["", f"Produced by `sat_core.evaluate`; `{RECORDS_FILE}` holds the per-image records."]
    return "\n".join(lines) + "\n"


def training_lines(training: dict[str, Any], metrics: dict[str, Any]) -> list[str]:
    """How much data, what chose this epoch, how long it took: from what the trainer stores (older checkpoints:
    the lines it can say)."""
    lines = []
    images = training.get("images", {})
    if images:
        val = [(split, n) for split, n in images.items() if split != "train"]
        lines.append(f"- Size: {images.get('train', 0):,} training images with {training.get('captions', 0):,} captions"
                     + "".join(f"; validation on {n:,} images of the {split} split" for split, n in val) + ".")
    selection = training.get("selection")
    select_metric = training.get("train_config", {}).get("optim", {}).get("select_metric")
    if selection:
        lines.append(f"- Selected by: validation {selection['metric']} on the {selection['split']} split "
                     f"(best {_figure(selection['best'])}).")
    elif select_metric:
        lines.append(f"- Selected by: validation {SELECT_NAMES.get(select_metric, select_metric)}.")
    minutes = training.get("train_minutes", metrics.get("training", {}).get("train_minutes"))
    if minutes is not None:
        setup = training.get("setup_minutes", metrics.get("training", {}).get("setup_minutes"))
        processes = training.get("processes", 1)
        lines.append(f"- Training time: {minutes:.1f} min of training and validation"
                     + (f", after {setup:.1f} min reading and encoding the images" if setup is not None else "")
                     + (f", over {processes} processes" if processes > 1 else "") + ".")
    return lines


SELECT_NAMES = {"bleu4": "BLEU-4", "cider": "CIDEr"}


def _schedule(optim: dict[str, Any], training: dict[str, Any]) -> str:
    """The learning-rate schedule in words, its warmup first."""
    lr = optim.get("lr", "?")
    if optim.get("lr_schedule") == "cosine":
        text = (f"cosine from {lr:g} to {optim.get('lr_final', 0) * lr:.2g} over "
                f"{training.get('planned_epochs', optim.get('epochs', '?'))} epochs")
    elif optim.get("lr_schedule") == "plateau":
        metric = SELECT_NAMES.get(optim.get("select_metric", "bleu4"), "BLEU-4")
        text = (f"{lr:g}, times {optim.get('plateau_factor', 0.5):g} after every {optim.get('plateau_patience', 1)} "
                f"epoch(s) without a better validation {metric}, down to {optim.get('lr_final', 0) * lr:.2g}")
    else:
        text = f"{lr} throughout"
    if optim.get("warmup_steps"):
        text += f", after a linear warmup over its first {optim['warmup_steps']} steps"
    return text


# The unsure captions' rows of the split's table: (label, key of confidence.summary).
_UNSURE_ROWS = (("unsure captions", "unsure"), ("mean CIDEr of the unsure captions", "CIDEr_unsure"),
                ("mean CIDEr of the others", "CIDEr_others"))

# The generalisation table's rows: (label, key of sat_core.evaluation.generalisation.set_figures).
_GENERALISATION_ROWS = (
    ("object precision", "precision"), ("object recall", "recall"), ("category recall", "category_recall"),
    ("count accuracy", "count_accuracy"), ("relation accuracy", "relation_accuracy"),
    ("attention correctness", "attention_correctness"), ("× uniform", "attention_ratio"),
    ("α entropy (nats)", "alpha_entropy"), ("BLEU-4", "BLEU-4"), ("empty captions", "empty_captions"),
    ("out-of-domain warnings", "warned"), ("captions with an object wrong", "erring"),
    ("warned, of those", "warned_erring"), ("warned, of the others", "warned_right"),
    ("unsure captions", "unsure"), ("unsure, of the wrong ones", "unsure_erring"),
    ("unsure, of the others", "unsure_right"), ("images", "n_images"),
)


def generalisation_lines(figures: dict[str, dict[str, Any]] | None) -> list[str]:
    """The card's section on the sets off the generator (``sat_core.evaluation.generalisation``): one column per set."""
    if not figures:
        return []
    names = list(figures)
    lines = ["", "## Off the generator",
             "The test split beside sets the model never trained on nor was selected on: the *shifted* split "
             "(surface styles and horizons training never draws) and the test split flipped, zoomed out to 70 %, "
             "darkened to 60 %, saved as JPEG at quality 20, cropped to its central 80 % and turned grey "
             "(`python -m sat_core.transforms`). Same decoding as above. The explorer's two notices are measured "
             "against the captions that get an object wrong: the out-of-domain warning (the picture looks unlike "
             "the training pictures) and the unsure flag (the caption is less likely under the model than all but "
             f"{UNSURE_SHARE:.0%} of its validation captions).", "",
             "| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for label, key in _GENERALISATION_ROWS:
        lines.append(f"| {label} | " + " | ".join(_figure(figures[n].get(key)) for n in names) + " |")
    mirror = figures.get("hflip", {}).get("mirror")
    if mirror and mirror.get("surviving"):
        lines += ["", f"Flipped scenes: {mirror['mirrored']} of the {mirror['surviving']} left/right statements "
                      "that the flipped scene's caption makes again about the same pair are mirrored "
                      f"({_figure(mirror['share'])}; {mirror['stated']} stated on the originals)."]
    return lines


def write_card(loaded: LoadedCheckpoint, result: dict[str, Any], *, about: Sequence[str] = ()) -> list[str]:
    """Write metrics.json, eval_records.json and MODEL_CARD.md into the checkpoint folder; return their names."""
    metrics = {k: v for k, v in result.items() if k != "records"}
    folder = loaded.path
    write_json_atomic(folder / METRICS_FILE, metrics)
    write_json_atomic(folder / RECORDS_FILE, {"split": result.get("split"), "beam": result.get("beam"),
                                              "dataset": result.get("dataset"), "records": result["records"]})
    text = model_card(folder.name, loaded.config, metrics, about=about)
    atomic_write(folder / CARD_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return [METRICS_FILE, RECORDS_FILE, CARD_FILE]
