"""Reduce-on-plateau: the learning rate cut by a factor after epochs without a better validation figure; what a
rate chosen for another batch size becomes; how many epochs a cosine schedule plans for in the time left.

``OptimConfig.lr_at`` gives every step's rate (warmup, constant, cosine, plateau); for the plateau schedule
it takes the share of ``--lr`` left by the cuts so far, which ``Plateau`` keeps (and ``last/`` saves).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sat_core.config import OptimConfig


@dataclass
class Plateau:
    """The share of ``--lr`` after the cuts so far, and the epochs waited since the last better one."""

    factor: float
    patience: int
    floor: float  # the lowest share (``lr_final``)
    share: float = 1.0
    waited: int = 0

    @classmethod
    def of(cls, optim: OptimConfig) -> "Plateau":
        return cls(optim.plateau_factor, optim.plateau_patience, optim.lr_final)

    def after_validation(self, improved: bool) -> bool:
        """Count an epoch; True when it cuts the rate (``patience`` epochs in a row without a better figure)."""
        self.waited = 0 if improved else self.waited + 1
        if self.waited < self.patience or self.share <= self.floor:
            return False
        self.share, self.waited = max(self.share * self.factor, self.floor), 0
        return True

    def state(self) -> dict[str, float]:
        return {"share": self.share, "waited": self.waited}

    def load(self, state: dict[str, float] | None) -> None:
        if state:
            self.share, self.waited = float(state["share"]), int(state["waited"])


def scaled_rate_note(optim: OptimConfig, batch_size: int) -> str | None:
    """The console's line when ``--lr-batch`` scales the rate to this batch (None when it does not)."""
    if not optim.lr_batch or optim.lr_batch == batch_size:
        return None
    warm = "" if optim.warmup_steps or batch_size < optim.lr_batch else \
        "; a large batch's first steps want --warmup-steps (a few hundred)"
    return (f"lr: --lr {optim.lr:g} was chosen for batch {optim.lr_batch}; at batch {batch_size} the rate peaks at "
            f"{optim.peak_lr(batch_size):.3g} (√{batch_size}/{optim.lr_batch}, the square-root rule){warm}")


# A cosine schedule fitted to --max-minutes ends in hundredths of an epoch; a last epoch shorter than this share of
# one is not begun (a validation and a checkpoint for a few minutes of steps).
TAIL_SHARE = 0.1


def fitted_epochs(done: int, left_s: float, epoch_s: float, train_s: float) -> float:
    """The epochs a schedule can plan for when ``left_s`` seconds remain after ``done`` epochs that took ``epoch_s``
    seconds each, ``train_s`` of them in steps: the whole epochs that fit, then the share of one more whose steps and
    validation fit, in hundredths of an epoch (none under TAIL_SHARE)."""
    whole = max(0, int(left_s // max(epoch_s, 1e-9)))
    tail = math.floor(100 * (left_s - whole * epoch_s - (epoch_s - train_s)) / max(train_s, 1e-9)) / 100
    return round(float(done + whole + (tail if tail >= TAIL_SHARE else 0)), 2)


def last_step(planned_epochs: float, steps_per_epoch: int) -> int:
    """The step count at which a plan of ``planned_epochs`` ends: the last whole step of its last share."""
    return math.floor(planned_epochs * steps_per_epoch + 1e-6)
