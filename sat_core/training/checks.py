"""What the trainer refuses before any work: combinations of settings that cannot train what was meant.

Each check raises ``SatError`` naming the flags involved and what to do instead; ``sat_core.train``
runs them after parsing and before reading a single image, so a mistake costs seconds, not an epoch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sat_core.config import ModelConfig, TrainConfig
from sat_core.errors import SatError
from sat_core.models.encoder import STRIDES
from sat_core.training.state import earlier_run

# Settings a resumed run must keep: they shape the model, its vocabulary or what it sees.
RESUME_FIXED_DATA = ("dataset", "images", "image_size", "min_word_count", "max_vocab")


def encoder_stride(model: ModelConfig) -> int:
    return 2 ** len(model.small_channels) if model.encoder == "small" else STRIDES.get(model.encoder, 32)


def default_image_size(model: ModelConfig) -> int:
    return 112 if model.encoder == "small" else 224


def check_config(cfg: TrainConfig) -> None:
    """Combinations the dataclasses cannot check field by field."""
    m = cfg.model
    if m.pretrained and m.encoder == "small":
        raise SatError("--pretrained loads ImageNet weights, which exist for the vgg19 and resnet encoders (torch "
                       "cache) and efficientnet_lite0 (pip) only. The small encoder is pretrained with `python -m sat_core.pretrain` and given "
                       "with --encoder-weights FILE; or drop --pretrained to train it from scratch.")
    # efficientnet_lite0 always gets its ImageNet weights (a pip dependency; train.model_config)
    random_frozen = (m.encoder not in ("small", "efficientnet_lite0") and not m.pretrained
                     and not cfg.encoder_weights and not m.finetune_encoder)
    if random_frozen and not cfg.allow_random_encoder:
        raise SatError(f"--encoder {m.encoder} without --pretrained would freeze a randomly initialised CNN, so the "
                       "decoder would learn from noise. Add --pretrained (ImageNet weights), --encoder-weights FILE "
                       "(a local weights file), --finetune-encoder (train the CNN too), or --allow-random-encoder "
                       "if a frozen random encoder is really what you want.")
    size = cfg.data.image_size or default_image_size(m)
    stride = encoder_stride(m)
    if size // stride < 2:
        raise SatError(f"--image-size {size} gives the {m.encoder} encoder a {size // stride}×{size // stride} grid "
                       f"(it downsamples by {stride}); use at least {2 * stride} px "
                       f"({default_image_size(m)} is its default).")
    if cfg.log_every:
        from sat_core.training.logbook import check_available

        check_available()
    if cfg.encoder_weights and not _is_file(cfg.encoder_weights):
        raise SatError(f"--encoder-weights {cfg.encoder_weights}: no such file. Give the weights file of the "
                       f"{m.encoder} encoder (the small encoder's comes from python -m sat_core.pretrain).")

    if cfg.init_from and not Path(cfg.init_from).expanduser().exists():
        raise SatError(f"--init-from {cfg.init_from}: no such checkpoint. Give a checkpoint folder (model.safetensors "
                       "and config.json), e.g. checkpoints/scenes_soft, or leave --init-from out.")


def check_out(run_dir: Path, overwrite: bool) -> None:
    """A new run never replaces an earlier one in its folder unless told to: finished models are lost otherwise."""
    found = earlier_run(run_dir)
    if found and not overwrite:
        raise SatError(f"{run_dir} holds an earlier run ({', '.join(found)}). Continue it with --resume {run_dir}, "
                       "start afresh there with --overwrite (its best/ and last/ are deleted), or give another --out.")


def _is_file(path: str) -> bool:
    from pathlib import Path

    return Path(path).expanduser().is_file()


def check_resume(saved: TrainConfig, cfg: TrainConfig) -> None:
    """--resume may change the schedule (--lr, --epochs, --patience …), never the model or its data."""
    changed = [(f"--{f.name.replace('_', '-')}", getattr(saved.model, f.name), getattr(cfg.model, f.name))
               for f in dataclasses.fields(ModelConfig) if getattr(saved.model, f.name) != getattr(cfg.model, f.name)]
    changed += [(f"--{name.replace('_', '-')}", getattr(saved.data, name), getattr(cfg.data, name))
                for name in RESUME_FIXED_DATA if getattr(saved.data, name) != getattr(cfg.data, name)]
    if saved.encoder_weights != cfg.encoder_weights:
        changed.append(("--encoder-weights", saved.encoder_weights, cfg.encoder_weights))
    if changed:
        what = "; ".join(f"{flag} {old!r} -> {new!r}" for flag, old, new in changed)
        raise SatError(f"--resume continues the saved run, so it cannot change the model or its data ({what}). "
                       "Resume without those flags, or start a new run with --out NEW_DIR.")
