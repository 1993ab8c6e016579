"""Cached annotations to the training device, each step's rows without stalling the GPU.

On a GPU the whole cache moves there once when it fits (``--resident``), and a step's rows are one gather on
the device. When it does not, a step's rows are gathered on the host into a pinned buffer and copied
asynchronously, so the copy overlaps the GPU's work; two buffers take turns, and a buffer is refilled only after
its last copy has finished. On a CPU a step's rows are simply read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from sat_core.data.cache import gib

RESIDENT_SHARE = 0.5  # --resident auto: the cache may take this share of the GPU's free memory


class AnnotationFeed:
    """``feed(rows)``: the cached annotations of store rows (U, …) on ``device``, in the cache's dtype."""

    def __init__(self, features: torch.Tensor, device: torch.device, resident: str = "auto",
                 say: Callable[[str], None] | None = None) -> None:
        self.device, self.features = device, features
        self._pinned: list[torch.Tensor | None] = [None, None]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0
        self.resident = device.type == "cuda" and _fits(features, device, resident)
        if device.type != "cuda":
            return
        size = gib(features.numel() * features.element_size())
        if self.resident:
            self.features = _to_device(features, device)
            if say:
                say(f"annotations: all {size} on the GPU (--resident {resident}): a step's rows are one gather there")
        elif say:
            say(f"annotations: {size} stay on the host (--resident {resident}); each step's rows are copied from "
                "pinned memory while the GPU works")

    def __call__(self, rows: Sequence[int]) -> torch.Tensor:
        if self.resident:
            index = torch.tensor(rows, dtype=torch.long, device=self.device)  # (U,)
            return self.features.index_select(0, index)  # (U, …)
        if self.device.type != "cuda":
            return self.features[list(rows)]  # (U, …)
        return self._copy(rows)

    def _copy(self, rows: Sequence[int]) -> torch.Tensor:
        """Gather into this turn's pinned buffer once its previous copy has ended, then copy without waiting."""
        turn, self._turn = self._turn, 1 - self._turn
        if self._copied[turn] is not None:
            self._copied[turn].synchronize()  # the GPU has read what this buffer held last time
        if self._pinned[turn] is None or self._pinned[turn].shape[0] < len(rows):
            self._pinned[turn] = torch.empty((len(rows), *self.features.shape[1:]), dtype=self.features.dtype,
                                             pin_memory=True)
        host = self._pinned[turn][: len(rows)]  # (U, …)
        torch.index_select(self.features, 0, torch.tensor(rows, dtype=torch.long), out=host)
        on_device = host.to(self.device, non_blocking=True)  # (U, …)
        self._copied[turn] = torch.cuda.Event()
        self._copied[turn].record()
        return on_device


def _fits(features: torch.Tensor, device: torch.device, resident: str) -> bool:
    if resident in ("on", "off"):
        return resident == "on"
    free, _total = torch.cuda.mem_get_info(device)
    return features.numel() * features.element_size() <= RESIDENT_SHARE * free


def _to_device(features: torch.Tensor, device: torch.device, chunk: int = 4096) -> torch.Tensor:
    """The cache on the GPU, copied a chunk of rows at a time (a memory-mapped cache is never read whole into
    RAM)."""
    out = torch.empty(features.shape, dtype=features.dtype, device=device)
    for start in range(0, features.shape[0], chunk):
        out[start : start + chunk].copy_(features[start : start + chunk])
    return out
