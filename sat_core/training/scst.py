"""Self-critical sequence training (Rennie et al., 2017): a second stage after cross-entropy training.

For every image of a batch the model draws ``samples`` captions (``beam_search(..., sample_words=True)``: the one
decode loop, each word from p(y_t | a, y_<t)) and says its greedy caption (beam 1) as the baseline, both without a
gradient. The reward is CIDEr-D against the image's references with document frequencies from the training
references (``evaluation.cider_d``, computed on the device); the loss

    −(r(w^s) − r(ŵ)) · Σ_t log p(w^s_t | a, w^s_<t),   per sampled word over the batch,

raises the probability of the samples that beat the greedy caption and lowers that of the others. The
log-probabilities come from one teacher-forced pass over the samples with the words decoding could not produce
banned as they were when sampling (<pad>, <start>, <unk>, and <end> as the first word), so the gradient is
that of the distribution the samples came from. Sampling, the baseline and that pass run the model in eval mode
(no dropout; hard attention by its expectation α, as at test time): the policy trained is the one decoded.

``SelfCritical`` is a ``Trainer`` with this step: the same data, feature cache, validation, ``best/`` (by
validation CIDEr) and resumable ``last/``. ``python -m sat_core.scst`` runs it from a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sat_core.checkpoint import load_checkpoint
from sat_core.config import Config, DecodeConfig, TrainConfig, option
from sat_core.data.imagestore import normalise
from sat_core.data.vocab import Vocab
from sat_core.decoding import beam_search
from sat_core.errors import SatError
from sat_core.evaluation.cider_d import CiderD
from sat_core.io import write_json_atomic
from sat_core.models.encoder import Annotations
from sat_core.training import distributed
from sat_core.training.console import sample_lines
from sat_core.training.trainer import Trainer

SCST_CONFIG = "scst_config.json"  # beside train_config.json in the run folder


@dataclass(frozen=True)
class SCSTConfig(Config):
    """What self-critical training adds to a TrainConfig."""

    init: str = option("", "the cross-entropy checkpoint to start from (a run's best/); its training configuration "
                       "(data, model, validation decoding) is the starting point of this run's")
    samples: int = option(5, "captions sampled per image; each is rewarded against the image's greedy caption", low=1)


# What a self-critical run changes in the training configuration of the checkpoint it starts from; flags given
# on the command line override these.
STARTING_CHANGES = {
    "optim.lr": 5e-5, "optim.lr_schedule": "constant", "optim.epochs": 1, "optim.patience": 0,
    "optim.max_minutes": 0.0, "optim.select_metric": "cider", "out": "",
    "data.batching": "image",  # an image's captions together: each step sees whole images
    # The weights, encoder included, come from the checkpoint: nothing to fetch or read for the encoder.
    "model.pretrained": False, "encoder_weights": "", "init_from": "", "allow_random_encoder": True,
}


@dataclass
class SCSTStep:
    loss: torch.Tensor
    reward: float  # mean CIDEr-D of the sampled captions
    greedy_reward: float  # mean CIDEr-D of the greedy captions
    words: float  # mean length of the sampled captions


def _padded(hypotheses, pad: int, device) -> torch.Tensor:
    """Token lists (ending with <end> when finished) -> (N, T) padded with <pad>."""
    T = max(len(h.tokens) for h in hypotheses)
    return torch.tensor([h.tokens + [pad] * (T - len(h.tokens)) for h in hypotheses], device=device)


def self_critical_loss(model, train_model, annotations: Annotations, vocab: Vocab, cider: CiderD,
                       table: torch.Tensor, rows: torch.Tensor, *, samples: int, decode: DecodeConfig,
                       generator: torch.Generator) -> SCSTStep:
    """The self-critical loss over U images: annotations (U, L, D) (with a gradient if the encoder learns),
    ``rows`` (U,) their images in ``cider``'s corpus, ``table`` (V,) vocabulary id -> CIDEr-D word id.

    ``model`` decodes; ``train_model`` (the same model, or its DDP wrapper) runs the teacher-forced pass."""
    feats, grid = annotations
    U, device = feats.shape[0], feats.device
    greedy_cfg = dataclasses.replace(decode, beam_size=1)
    with torch.no_grad():
        fixed = feats.detach()
        greedy = [h[0] for h in beam_search(model, Annotations(fixed, grid), vocab, greedy_cfg)]
        drawn = [h[0] for h in beam_search(model, Annotations(fixed.repeat_interleave(samples, 0), grid), vocab,
                                           greedy_cfg, generator=generator, sample_words=True)]
    sampled = _padded(drawn, vocab.pad_id, device)  # (U·n, T)
    image_rows = rows.to(cider.device).repeat_interleave(samples)  # (U·n,)
    reward = cider.score(table[sampled.to(table.device)], image_rows)  # (U·n,)
    baseline = cider.score(table[_padded(greedy, vocab.pad_id, table.device)], rows.to(cider.device))  # (U,)
    advantage = (reward - baseline.repeat_interleave(samples)).to(device)  # (U·n,)
    start = torch.full((sampled.shape[0], 1), vocab.start_id, device=device)
    image_index = torch.arange(U, device=device).repeat_interleave(samples)  # (U·n,) n adjacent rows per image
    was_training = model.training
    model.eval()  # the policy that sampled: no dropout, hard attention by its expectation
    try:
        out = train_model(None, torch.cat([start, sampled], 1), feats=feats, image_index=image_index)
    finally:
        model.train(was_training)
    logits = out.logits.float()  # (U·n, T, V)
    banned = [vocab.pad_id, vocab.start_id] + ([vocab.unk_id] if decode.suppress_unk else [])
    logits[:, :, banned] = -float("inf")
    logits[:, 0, vocab.end_id] = -float("inf")  # the first word is never <end>: no caption is empty
    word_logp = torch.log_softmax(logits, -1).gather(2, sampled.unsqueeze(2)).squeeze(2)  # (U·n, T)
    mask = sampled != vocab.pad_id  # (U·n, T) the sampled words and their <end>
    word_logp = torch.where(mask, word_logp, 0.0)
    loss = -(advantage.unsqueeze(1) * word_logp).sum() / mask.sum().clamp_min(1)
    return SCSTStep(loss, float(reward.mean()), float(baseline.mean()), float(mask.sum(1).float().mean()))


def starting_config(init: str) -> TrainConfig:
    """The training configuration a self-critical run starts from: the checkpoint's own (its data, model and
    validation decoding) with ``STARTING_CHANGES``; its model config alone when it stored none."""
    from sat_core import cli

    config = load_checkpoint(init).config
    stored = (config.get("training") or {}).get("train_config")
    base = TrainConfig.from_dict(stored).to_dict() if stored else {"model": config["model"]}
    return TrainConfig.from_dict(cli.apply(base, STARTING_CHANGES))


class SelfCritical(Trainer):
    """A Trainer whose step is self-critical (``self_critical_loss``), starting from ``scst.init``'s weights and
    vocabulary; on a fresh run the starting model is validated first and is ``best/`` until a better one."""

    def __init__(self, cfg: TrainConfig, scst: SCSTConfig, resume: str | None = None, *,
                 overwrite: bool = False) -> None:
        self.scst = scst
        self.init = None if resume else load_checkpoint(scst.init)
        super().__init__(cfg, resume, overwrite=overwrite)
        train = self.data.split("train")
        self.cider = CiderD([self.data.images[i].sentences for i in train], words=self.vocab.itos,
                            device=self.device)  # document frequencies of the training references
        self.cider_row = {image: row for row, image in enumerate(train)}
        self.table = self.cider.vocab_table(self.vocab)  # (V,)
        if self.main_process:
            write_json_atomic(self.run_dir / SCST_CONFIG, scst.to_dict())

    def _read_dataset(self, resume: str | None) -> None:
        super()._read_dataset(resume)
        if self.init is not None:  # the checkpoint's words, not a vocabulary rebuilt from the data
            self.vocab = self.init.vocab
            if self.main_process:
                print(f"vocabulary: the {len(self.vocab)} words of {self.scst.init}", flush=True)
            if self.preprocess != self.init.preprocess:
                raise SatError(f"{self.scst.init} was trained on images prepared as {self.init.preprocess}, this "
                               f"run would prepare them as {self.preprocess}; drop --image-size (or give the "
                               "checkpoint's).")

    def _build_model(self) -> None:
        super()._build_model()
        if self.init is None:
            return  # resumed: _restore loads last/
        try:
            self.model.load_state_dict(self.init.model.state_dict())
        except RuntimeError as exc:
            raise SatError(f"The weights of {self.scst.init} do not fit the model this run builds "
                           f"({str(exc).splitlines()[0]}); drop the model flags, the checkpoint decides the "
                           "model.") from None

    # -- the step

    @property
    def _terms(self) -> list[str]:
        """What each step logs: the loss per sampled word, the mean CIDEr-D of the samples and of the greedy
        captions, and the samples' mean length."""
        return ["loss", "reward", "greedy_reward", "words"]

    def _train_step(self, batch) -> tuple[dict[str, float], int]:
        """One optimizer step: (its terms over the global batch, its sampled captions over all processes). Where
        this process holds a filler (``distributed``) its share counts 0."""
        filler = self.batch_in_epoch in self.fillers
        batch = batch.to(self.device)
        with self._autocast():
            if self.feed is not None:
                feats = self._annotations([self.store.row_of[i] for i in batch.image_ids])  # (U, L, D)
                annotations = Annotations(feats, self.grid)
            else:
                annotations = self.model.encode(normalise(batch.images, self.preprocess))
            rows = torch.tensor([self.cider_row[i] for i in batch.image_ids], device=self.device)  # (U,)
            generator = torch.Generator(self.device).manual_seed(self.cfg.seed * 1_000_003 + self.step)
            part = self_critical_loss(self.model, self.train_model, annotations, self.vocab, self.cider, self.table,
                                      rows, samples=self.scst.samples, decode=self._sampling(), generator=generator)
        terms = {"loss": float(part.loss.detach()), "reward": part.reward, "greedy_reward": part.greedy_reward,
                 "words": part.words}
        captions = 0 if filler else len(batch.image_ids) * self.scst.samples
        words = part.words * captions
        terms, all_words, captions = distributed.reduce_step(terms, words, captions, self.device)
        if not math.isfinite(terms["loss"]):
            raise self._non_finite("loss", terms["loss"], batch)
        self.optimizer.zero_grad(set_to_none=True)
        self._step(distributed.scale_to_global(part.loss, words, all_words), batch)
        return terms, captions

    def _sampling(self) -> DecodeConfig:
        """Sampling and the greedy baseline: validation's length cap and banned words, in the run's precision (fp32
        where training runs fp16: decoding has no fp16 path)."""
        precision = self.precision if self.precision in ("fp32", "bf16") else "fp32"
        return dataclasses.replace(self.cfg.val, beam_size=1, precision=precision)

    # -- the run

    def _run_epochs(self) -> dict[str, Any]:
        if self.init is not None and self.step == 0:
            self._validate_start()
        return super()._run_epochs()

    def _validate_start(self) -> None:
        """The starting model's validation figures: what the run must beat; it is best/ until then."""
        val = self.validate() if self.main_process else {}
        self.best = distributed.from_rank0(self.device, val.get("CIDEr", 0.0))
        if self.main_process:
            self._log({"event": "start", "epoch": 0, "val": val, "init": self.scst.init})
            self._save_model(self.run_dir / "best", metrics={f"val_{k}": v for k, v in val.items()})

    def _console_line(self, record: dict[str, Any]) -> str:
        if "reward" not in record and record.get("event") != "start":
            return super()._console_line(record)
        return _console_line(record, getattr(self, "samples", []))


def _console_line(record: dict[str, Any], samples: list[tuple[str, str]]) -> str:
    v = record["val"]
    val = f"val CIDEr {v.get('CIDEr', 0):.3f}  BLEU-4 {v.get('BLEU-4', 0):.4f}"
    if record.get("event") == "start":
        return f"start ({record['init']}): {val}"
    lines = [f"epoch {record['epoch']}: CIDEr-D reward of the samples {record['reward']:.3f}, of the greedy "
             f"captions {record['greedy_reward']:.3f}; loss {record['loss']:.4f}/word; {record['words']:.1f} words a "
             f"sample; {record['captions_per_s']:.0f} samples/s (lr {record['lr']:.2g})  {val}  "
             f"best CIDEr {record.get('best_cider', 0):.3f}"]
    return "\n".join([*lines, *sample_lines(samples)])


def read_scst_config(run_dir: str | Path) -> SCSTConfig:
    path = Path(run_dir) / SCST_CONFIG
    try:
        return SCSTConfig.from_dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise SatError(f"{run_dir} is not a self-critical run ({SCST_CONFIG} is missing); resume it with "
                       "python -m sat_core.train --resume.") from None
