"""What a training config builds before the first step: the model's config with what the data and the encoder
decide, the image preprocessing, and the optimizer."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from sat_core.config import ModelConfig, PreprocessConfig, TrainConfig
from sat_core.errors import SatError
from sat_core.io import read_tensors
from sat_core.models.encoder import FEATURE_DIMS, load_torchvision_weights


def build_optimizer(name: str, params: Any, *, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """Adam or RMSprop over ``params``. Adam runs its fused kernel: one pass over each parameter
    instead of a dozen elementwise ops (on this project's 2-core CPU 11 ms a step instead of 42 for
    the COCO-size decoder's 21 M parameters); the same update to float rounding."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True)
    return torch.optim.RMSprop(params, lr=lr, weight_decay=weight_decay)


def model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    """The configured model with what the data and the encoder decide filled in."""
    m = cfg.model
    feature_dim = m.small_channels[-1] if m.encoder == "small" else FEATURE_DIMS[m.encoder]
    if m.multiscale:
        from sat_core.models.efficientnet import MULTISCALE_DIM

        feature_dim = MULTISCALE_DIM
    if m.coarse:
        feature_dim = 320  # EfficientNet-Lite0's stride-32 stage
    if m.shallow:
        feature_dim = 80  # the end of its first stride-16 stage
    # efficientnet_lite0's ImageNet weights always come with it (pip): a frozen random net is useless
    pretrained = m.pretrained or bool(cfg.encoder_weights) or m.encoder == "efficientnet_lite0"
    return dataclasses.replace(m, feature_dim=feature_dim, vocab_size=vocab_size, pretrained=pretrained)


def preprocess_config(cfg: TrainConfig) -> PreprocessConfig:
    size = cfg.data.image_size or (112 if cfg.model.encoder == "small" else 224)
    if cfg.model.encoder == "efficientnet_lite0":  # its TensorFlow training scaled pixels to [-1, 1]
        from sat_core.models.efficientnet import MEAN, STD

        # crop 1: the whole image; ImageNet's 0.875 evaluation crop would cut off objects at the edges
        return PreprocessConfig(image_size=size, mean=MEAN, std=STD, crop=1.0)
    return PreprocessConfig(image_size=size)


def load_encoder(encoder: torch.nn.Module, model: ModelConfig, path: Path) -> None:
    """``--encoder-weights``: a local copy of torchvision's ImageNet file, or the small encoder's from pretrain."""
    if model.encoder != "small":
        load_torchvision_weights(encoder, model.encoder, path)
        return
    tensors, _meta = read_tensors(path)
    try:
        encoder.load_state_dict(tensors)
    except RuntimeError as exc:
        raise SatError(f"{path} does not fit the small encoder {list(model.small_channels)}: "
                       f"{str(exc).splitlines()[0]} Use the --small-channels it was pretrained with.") from None


def load_weights(model: torch.nn.Module, cfg: TrainConfig, vocab: Any, preprocess: PreprocessConfig, *,
                 say: bool) -> None:
    """The weights a new run starts from besides its own draw: ``--encoder-weights``, then ``--init-from``'s (a
    resumed run's own weights replace both)."""
    if cfg.encoder_weights:
        load_encoder(model.encoder, cfg.model, Path(cfg.encoder_weights))
    if cfg.init_from:
        left_out = start_from(model, cfg.init_from, vocab, preprocess)
        if say:
            print(f"model: starts from {cfg.init_from}'s weights"
                  + (f" (not used: {', '.join(left_out)})" if left_out else ""), flush=True)


def start_from(model: torch.nn.Module, path: str, vocab: Any, preprocess: PreprocessConfig) -> list[str]:
    """``--init-from``: the weights of a trained checkpoint as the model's starting point, not a random draw. The
    checkpoint must have this run's vocabulary, image preprocessing and every weight of the model in the same shape;
    its attention may differ. Returns the names of its tensors the model has no place for (soft attention's gate β
    when the new model is hard). Nothing in the optimiser or schedule carries over: training starts at step 0."""
    from sat_core.checkpoint import read_checkpoint
    from sat_core.data.vocab import Vocab

    tensors, config = read_checkpoint(path)
    what = f"--init-from {path}"
    try:
        theirs = Vocab.from_dict(config["vocab"])
        their_preprocess = PreprocessConfig.from_dict(config["preprocess"])
    except (KeyError, TypeError, ValueError, SatError) as exc:
        raise SatError(f"{what}: its config.json has no readable vocabulary or preprocessing ({exc}). Give a "
                       "checkpoint folder written by sat_core.train or sat_core.ship.") from None
    if theirs.itos != vocab.itos:
        raise SatError(f"{what}: its vocabulary ({len(theirs)} words) is not this run's ({len(vocab)} words), so its "
                       "word embeddings and output layer would mean other words. Train on the data and "
                       "--min-word-count it was trained with, or leave --init-from out.")
    if their_preprocess != preprocess:
        raise SatError(f"{what}: it saw images preprocessed otherwise ({their_preprocess}) than this run will "
                       f"({preprocess}). Use its --image-size and encoder, or leave --init-from out.")
    expected = model.state_dict()
    problems = [f"{k} is missing from it" for k in expected if k not in tensors]
    problems += [f"{k} is {tuple(tensors[k].shape)} there but {tuple(v.shape)} here" for k, v in expected.items()
                 if k in tensors and tensors[k].shape != v.shape]
    if problems:
        raise SatError(f"{what}: its weights do not fit this model ({len(problems)} mismatch(es); first: "
                       f"{'; '.join(problems[:3])}). Give the encoder, --tune-blocks and layer sizes it was "
                       "trained with" + (", and --no-gate: it has no gate β (a hard model's checkpoint)"
                                         if any(k.startswith("decoder.f_beta.") for k in expected if k not in tensors)
                                         else "") + ".")
    model.load_state_dict({k: tensors[k].to(v.dtype) for k, v in expected.items()})
    return sorted(k for k in tensors if k not in expected)


def param_groups(model: torch.nn.Module, encoder_lr_scale: float) -> list[dict]:
    """Everything that learns, at --lr; encoder blocks trained with --tune-blocks at a share of it."""
    encoder = model.encoder
    tuned = encoder.body.tail_parameters() if encoder.tune_blocks else []
    rest = [p for p in model.parameters() if p.requires_grad and all(p is not q for q in tuned)]
    groups = [{"params": rest, "lr_scale": 1.0}]
    if tuned:
        groups.append({"params": tuned, "lr_scale": encoder_lr_scale})
    return groups
