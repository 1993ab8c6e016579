"""What a person watching a run reads: one line per epoch or event (rank 0 prints it, ``log.jsonl`` keeps it).

The epoch line writes the loss as the sum it is, every term per caption word and with its weight:
``loss 2.345/word = nll 2.100 + 1·dsa 0.245`` (soft), ``… + reinforce 0.012 − 0.01·entropy 1.800`` (hard).
"""

from __future__ import annotations

from typing import Any

from sat_core.config import TrainConfig

SELECT_KEYS = {"bleu4": "BLEU-4", "cider": "CIDEr"}  # --select-metric -> caption_metrics key


def loss_terms(record: dict[str, Any], cfg: TrainConfig, extra: list[str] = ()) -> str:
    """``loss L/word = nll … + λ·dsa …`` with the terms the run's objective has (each per caption word)."""
    hard = cfg.model.attention == "hard"
    text = f"loss {record['loss']:.3f}/word = nll {record['nll']:.3f}"
    if (not hard or cfg.model.hard.dsa) and cfg.optim.dsa_lambda:
        text += f" + {cfg.optim.dsa_lambda:g}·dsa {record['dsa']:.3f}"
    if hard and cfg.model.hard.reinforce:
        text += f" + reinforce {record['reinforce']:.3f}"  # already weighted by λ_r: its share of the loss
    if hard and cfg.model.hard.entropy_weight:
        text += f" − {cfg.model.hard.entropy_weight:g}·entropy {record['entropy']:.3f}"
    # terms beyond the paper have units of their own (supervised attention: per linked word)
    text += "".join(f"; {name} {record.get(name, 0.0):.3f}" for name in extra)
    return text


def sample_lines(samples: list[tuple[str, str]]) -> list[str]:
    """The sample captions under an epoch's line, each beside a reference."""
    return [f"  sample: {hyp or '(empty)'}  |  reference: {ref}" for hyp, ref in samples]


def console_line(record: dict[str, Any], cfg: TrainConfig, samples: list[tuple[str, str]],
                 extra: list[str] = ()) -> str:
    """What a person watching the run reads: the loss by term, validation, samples, why it stopped."""
    metric = SELECT_KEYS[cfg.optim.select_metric]
    best = record.get(f"best_{cfg.optim.select_metric}", 0.0)
    event = record.get("event")
    if event in EVENTS:
        return EVENTS[event](record, cfg, metric, best)
    v = record["val"]
    lines = [f"epoch {record['epoch']}: {loss_terms(record, cfg, extra)}  {record['captions_per_s']:.0f} captions/s "
             f"({record['precision']}, lr {record.get('lr', cfg.optim.lr):.2g})  "
             f"val BLEU-4 {v.get('BLEU-4', 0):.4f}  CIDEr {v.get('CIDEr', 0):.3f}  "
             f"best {metric} {best:.4f}"]
    return "\n".join([*lines, *sample_lines(samples)])


EVENTS = {
    "early_stop": lambda r, cfg, metric, best: (
        f"early stop after epoch {r['epoch']}: no better validation {metric} for {cfg.optim.patience} epochs "
        f"(best {best:.4f})"),
    "setup": lambda r, cfg, metric, best: f"setup: {r['seconds']:.0f} s before the first step (counted in --max-minutes)",
    "schedule": lambda r, cfg, metric, best: (
        f"--max-minutes {cfg.optim.max_minutes:g} fits {r['epochs']:g} epochs at {r['epoch_minutes']:.1f} min each, "
        f"not {cfg.optim.epochs}: the cosine schedule now ends with them"),
    "time_budget": lambda r, cfg, metric, best: (
        f"stopped before epoch {r['epoch'] + 1}: it would end past --max-minutes {cfg.optim.max_minutes:g} "
        f"({r['minutes']:.1f} min spent)"),
    "plateau": lambda r, cfg, metric, best: (
        f"no better validation {metric} for {cfg.optim.plateau_patience} epoch(s): the rate is now {r['lr']:.2g} "
        f"(×{cfg.optim.plateau_factor:g})"),
}
