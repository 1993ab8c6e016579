"""Whether a model is unsure of a caption: the caption's log-probability under the model against those of the
captions the model gave its validation images.

The out-of-domain check (``domain``) looks at the picture; this looks at the caption. A caption less likely
than all but ``UNSURE_SHARE`` of the validation captions is flagged. On the scenes world's validation sets the flag
falls on 17–45 % of the captions that get an object wrong and on 4–13 % of the others (docs/EXPERIMENTS.md,
2026-11-29), and unlike the picture checks it needs nothing the world provides: any trained model has a
validation split to measure it on.

The reference is measured with one decoding (the checkpoint's evaluated beam search); a caption decoded with
other settings is compared all the same, and its log-probability then differs a little from what that
decoding would have given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from sat_core.errors import SatError

# The share of the validation captions flagged. On the scenes models' validation sets 0.05 flagged 11–35 % of the
# wrong captions, 0.1 flags 17–45 %, 0.2 flagged 36–62 % but also 16–26 % of the right ones (docs/EXPERIMENTS.md,
# 2026-11-29).
UNSURE_SHARE = 0.1


@dataclass(frozen=True)
class ConfidenceReference:
    """The log-probability under which a caption counts as unsure, and what it was measured on."""

    threshold: float  # log p(caption) at the UNSURE_SHARE quantile of the validation captions
    share: float  # the share of the validation captions under it
    captions: int  # how many validation captions it was measured on
    split: str = "val"

    @classmethod
    def from_logprobs(cls, logprobs: Sequence[float], share: float = UNSURE_SHARE,
                      split: str = "val") -> "ConfidenceReference":
        values = np.asarray(list(logprobs), dtype=np.float64)
        values = values[np.isfinite(values)]
        if not len(values):
            raise SatError("A confidence reference needs the log-probability of at least one validation caption.")
        return cls(float(np.quantile(values, share)), share, len(values), split)

    def unsure(self, logprob: float) -> bool:
        return logprob < self.threshold

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "threshold": round(self.threshold, 4)}

    @classmethod
    def from_dict(cls, data: Any) -> "ConfidenceReference":
        """From a checkpoint's ``training.confidence``; a malformed entry is refused with SatError."""
        try:
            ref = cls(float(data["threshold"]), float(data["share"]), int(data["captions"]),
                      str(data.get("split", "val")))
        except (TypeError, KeyError, ValueError) as err:
            raise SatError(f"The checkpoint's confidence reference is malformed ({err!r}); "
                           "package the checkpoint again to measure it.") from None
        if not (math.isfinite(ref.threshold) and 0 < ref.share < 1 and ref.captions > 0):
            raise SatError(f"The checkpoint's confidence reference is out of range ({data!r}); "
                           "package the checkpoint again to measure it.")
        return ref


def stored_reference(config: dict[str, Any]) -> ConfidenceReference | None:
    """The reference a checkpoint's config.json keeps (``training.confidence``); None where it keeps none."""
    stored = (config.get("training") or {}).get("confidence")
    return ConfidenceReference.from_dict(stored) if stored is not None else None


def kept_reference(config: dict[str, Any]) -> ConfidenceReference | None:
    """``stored_reference``, or None where the checkpoint keeps a malformed one (an evaluation goes on without it)."""
    try:
        return stored_reference(config)
    except SatError:
        return None


def summary(records: Sequence[dict[str, Any]], reference: ConfidenceReference | None) -> dict[str, Any] | None:
    """Over one evaluation's records: how many captions ``reference`` flags unsure, and the mean per-image CIDEr of
    the flagged captions and of the others. It needs only the references, so it says on any dataset whether the
    flag falls on the weaker captions. None without a reference."""
    if reference is None:
        return None
    scored = [(reference.unsure(r["logprob"]), r["scores"].get("CIDEr")) for r in records
              if r.get("logprob") is not None]

    def mean_cider(flag: bool) -> float | None:
        values = [c for u, c in scored if u == flag and c is not None]
        return float(np.mean(values)) if values else None

    return {"threshold": reference.threshold, "share": reference.share, "n": len(scored),
            "unsure": sum(u for u, _ in scored) / len(scored) if scored else None,
            "CIDEr_unsure": mean_cider(True), "CIDEr_others": mean_cider(False)}
