"""Per-step records of a run: ``RUN/steps.csv`` (one row a logged step) and TensorBoard events in ``RUN/tb/``.

Each logged step writes its loss terms (per word, as the loss adds them), the learning rate and the captions
per second of that step; each validation writes its corpus metrics and sample captions drawn as the paper's
figure (the image, then each word's α over it). Rank 0 alone writes. ``tensorboard --logdir RUN/tb`` shows them.
A resumed run drops the rows and events after the step it resumes from (they were trained again).
"""

from __future__ import annotations

import csv
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sat_core.errors import SatError

STEPS_CSV, TB_DIR = "steps.csv", "tb"
FIXED_COLUMNS = ("step", "epoch", "lr", "captions", "captions_per_s")


def check_available() -> None:
    """Refuse before any work when the TensorBoard writer cannot be imported."""
    if importlib.util.find_spec("tensorboard") is None:
        raise SatError("--log-every writes TensorBoard events (RUN/tb/) and the tensorboard package is not installed: "
                       "pip install tensorboard==2.21.0 (requirements.txt), or give --log-every 0.")


@dataclass
class Sample:
    """One validation caption and what its figure needs."""

    image: np.ndarray  # (S, S, 3) uint8: the square the encoder saw
    words: list[str]  # with <end> when the caption ended
    alphas: np.ndarray  # (T, L)
    grid: tuple[int, int]
    reference: str

    @classmethod
    def of(cls, image: Any, hyp: Any, reference: str) -> "Sample":
        """A validation caption (a beam search ``Hypothesis``); ``image`` (3, S, S) uint8 as the encoder saw it."""
        words = hyp.words + (["<end>"] if hyp.finished else [])
        return cls(image.permute(1, 2, 0).cpu().numpy(), words, hyp.alphas, hyp.grid, reference)


class StepLog:
    """Appends per-step rows and events; ``close()`` (or a save) flushes them."""

    def __init__(self, run_dir: Path, terms: Sequence[str], *, resume_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = run_dir / STEPS_CSV
        self.columns = [*FIXED_COLUMNS, *terms]
        kept = _rows_up_to(self.path, resume_step) if resume_step is not None else []
        self.file = open(self.path, "w", newline="")
        self.csv = csv.writer(self.file)
        self.csv.writerow(self.columns)
        self.csv.writerows(kept)
        # purge_step: TensorBoard hides the earlier run's events from this step on (they are trained again)
        self.writer = SummaryWriter(str(run_dir / TB_DIR), purge_step=resume_step)

    def step(self, step: int, epoch: int, lr: float, captions: int, seconds: float, terms: dict[str, float]) -> None:
        """One optimizer step (``step`` counts from 1): its row and its scalars."""
        rate = captions / max(seconds, 1e-9)
        values = {"step": step, "epoch": epoch, "lr": lr, "captions": captions, "captions_per_s": rate, **terms}
        self.csv.writerow([_cell(values.get(c)) for c in self.columns])
        for name, value in terms.items():
            self.writer.add_scalar(f"train/{name}", value, step)
        self.writer.add_scalar("train/lr", lr, step)
        self.writer.add_scalar("train/captions_per_s", rate, step)

    def validation(self, step: int, metrics: dict[str, float], samples: Sequence[Sample]) -> None:
        """A validation's corpus metrics and its samples as figures (TensorBoard's Images tab)."""
        from sat_core.viz import word_strip

        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"val/{name}", value, step)
        for k, s in enumerate(samples):
            figure = word_strip(s.image, s.words, s.alphas[: len(s.words)], s.grid, panel_size=96,
                                columns=min(len(s.words) + 1, 8))
            self.writer.add_image(f"val/sample_{k}", figure, step, dataformats="HWC")
            self.writer.add_text(f"val/sample_{k}", f"{' '.join(s.words)}  \nreference: {s.reference}", step)
        self.flush()

    def flush(self) -> None:
        self.file.flush()
        self.writer.flush()

    def close(self) -> None:
        self.file.close()
        self.writer.close()


def _cell(value: Any) -> Any:
    return "" if value is None else round(value, 6) if isinstance(value, float) else value


def _rows_up_to(path: Path, step: int) -> list[list[str]]:
    """The rows of an earlier ``steps.csv`` up to ``step`` (the header dropped)."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    return [r for r in rows if r and r[0].isdigit() and int(r[0]) <= step]
