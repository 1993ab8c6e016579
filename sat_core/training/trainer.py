"""The trainer: one run of the paper's objective over a Karpathy-format dataset (``python -m sat_core.train``).

``Trainer(cfg, resume).run()`` reads the data, builds the model, caches a frozen encoder's annotations, then
trains epoch by epoch: teacher forcing, ``losses.caption_loss`` (plus any extra term the config asks for,
``supervision.extra_terms``), validation by free-running decoding, ``best/`` and a resumable ``last/``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sat_core import checkpoint as ckpt
from sat_core.config import TrainConfig
from sat_core.data.imagestore import ImageStore, normalise
from sat_core.data.karpathy import CaptionDataset, EvalImages, build_vocab, load_karpathy
from sat_core.data.vocab import Vocab
from sat_core.decoding import beam_search, pick_device
from sat_core.errors import SatError
from sat_core.evaluation.card import annotation_statistics, domain_images, training_statistics
from sat_core.evaluation.confidence import ConfidenceReference
from sat_core.io import read_tensors, write_json_atomic
from sat_core.models.captioner import Captioner
from sat_core.models.encoder import Annotations
from sat_core.precision import autocast, grad_scaler, resolve_training
from sat_core.training import distributed
from sat_core.training.build import build_optimizer, load_weights, model_config, param_groups, preprocess_config
from sat_core.training.checks import check_out
from sat_core.training.console import SELECT_KEYS, console_line
from sat_core.training.distributed import make_loader  # --batch-size is the global batch: each process its share
from sat_core.training.feed import AnnotationFeed
from sat_core.training.logbook import Sample, StepLog
from sat_core.training.losses import MovingBaseline, caption_loss
from sat_core.training.state import (
    STATE_JSON, STATE_TENSORS, clear_earlier_run, flatten_state, restore_rngs, rng_json, rng_tensors, saved_world,
    unflatten_state,
)
from sat_core.training.schedule import Plateau, fitted_epochs, last_step, scaled_rate_note
from sat_core.training.supervision import extra_terms

SAMPLES = 2  # validation captions printed after each epoch


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived; a resumable checkpoint was written."""


class Trainer:
    def __init__(self, cfg: TrainConfig, resume: str | None = None, *, overwrite: bool = False) -> None:
        """``overwrite``: start afresh in a ``cfg.out`` that holds an earlier run (refused otherwise)."""
        self.cfg, self.run_dir = cfg, Path(resume or cfg.out)
        self.started = time.perf_counter()  # --max-minutes counts from here: reading and encoding images too
        self.rank, self.world = distributed.rank(), distributed.world_size()
        if resume:  # resumable state, and as many processes: refused alike everywhere, before any slow work
            distributed.check_world(saved_world(self.run_dir / "last"), self.run_dir)
        else:
            check_out(self.run_dir, overwrite)
        self.per_rank_batch = distributed.per_rank_batch(cfg.data.batch_size, self.world)
        self.device = self._setup_device()
        self.main_process = self.rank == 0
        self.stop_signal: int | None = None
        self.fillers: set[int] = set()
        self._read_dataset(resume)  # the JSON and the vocabulary: seconds
        self._build_model()  # encoder weights are found (or refused) before any image is decoded
        self._decode_images()
        features = self._feature_cache()  # None: every step encodes its images
        say = (lambda text: print(text, flush=True)) if self.main_process else None
        self.feed = AnnotationFeed(features, self.device, cfg.data.resident, say) if features is not None else None
        self.setup_s = time.perf_counter() - self.started
        self.epoch, self.batch_in_epoch, self.step = 0, 0, 0
        self.planned_epochs = cfg.optim.epochs  # fewer when the time budget cannot fit them (_fit_schedule)
        self.best, self.bad_epochs, self.train_seconds = -1.0, 0, 0.0
        self.baseline = MovingBaseline(cfg.model.hard.baseline_decay)
        self.plateau = Plateau.of(cfg.optim)
        self.confidence: dict[str, Any] | None = None  # from the latest validation (validate), or the resumed save
        if resume:
            self._restore()
        self.lr = self._rate()  # the schedule's rate; set before every step
        self.steps: StepLog | None = None  # per-step rows and TensorBoard events (rank 0)
        self.figures: list[Sample] = []
        if self.main_process:  # on resume too: flags given with --resume (--lr, --epochs) hold from now on
            self._open_run_folder(resume)

    # -- setup

    def _open_run_folder(self, resume: str | None) -> None:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if not resume and clear_earlier_run(self.run_dir):
            print(f"{self.run_dir} held an earlier run (--overwrite): its best/ and last/ are gone, its log is "
                  "now log.previous.jsonl", flush=True)
        write_json_atomic(self.run_dir / "train_config.json", cfg.to_dict())
        if cfg.log_every:
            self.steps = StepLog(self.run_dir, self._terms, resume_step=self.step if resume else None)
        if self.world > 1:
            print(f"batch: {cfg.data.batch_size} captions per optimizer step over {self.world} processes, "
                  f"{self.per_rank_batch} each (--lr {cfg.optim.lr:g} and --warmup-steps {cfg.optim.warmup_steps} "
                  "are those of this global batch)", flush=True)
        if note := scaled_rate_note(cfg.optim, cfg.data.batch_size):
            print(note, flush=True)
        self._log({"event": "setup", "seconds": round(self.setup_s, 1), "images": len(self.store)})

    @property
    def features(self) -> torch.Tensor | None:  # the cached annotations (on the GPU when resident); None: none
        return self.feed.features if self.feed is not None else None

    @property
    def _terms(self) -> list[str]:
        """The loss terms logged each step and epoch, each per caption word."""
        return ["loss", "nll", "dsa", "reinforce", "entropy", *(t.name for t in self.extra_terms)]

    def _setup_device(self) -> torch.device:
        if self.world > 1:
            import torch.distributed as dist

            backend = "nccl" if torch.cuda.is_available() and self.cfg.device != "cpu" else "gloo"
            dist.init_process_group(backend)
            if backend == "nccl":
                local = int(os.environ.get("LOCAL_RANK", 0))
                torch.cuda.set_device(local)
                return torch.device("cuda", local)
            return torch.device("cpu")
        return pick_device(self.cfg.device)

    def _read_dataset(self, resume: str | None) -> None:
        cfg = self.cfg
        self.data = load_karpathy(cfg.data.dataset, cfg.data.images)
        if cfg.data.train_images:
            self.data = self.data.first_of_split("train", cfg.data.train_images)
        self.preprocess = preprocess_config(cfg)
        if resume:
            config = json.loads((Path(resume) / "last" / "config.json").read_text())
            self.vocab = Vocab.from_dict(config["vocab"])
        else:
            self.vocab = build_vocab(self.data, min_count=cfg.data.min_word_count, max_size=cfg.data.max_vocab)
        if self.main_process:
            counts = self.data.split_counts
            captions = sum(len(self.data.images[i].sentences) for i in self.data.split("train"))
            print(f"data: {Path(cfg.data.dataset).name}: train {counts.get('train', 0)} images ({captions} captions), "
                  f"{cfg.data.val_split} {counts.get(cfg.data.val_split, 0)}, test {counts.get('test', 0)}; "
                  f"vocabulary {len(self.vocab)} words (min count {cfg.data.min_word_count})", flush=True)

    def _decode_images(self) -> None:
        cfg = self.cfg
        started = time.perf_counter()
        splits, show = ("train", cfg.data.val_split), cfg.progress and self.main_process
        if cfg.data.cache:  # memory-mapped from disk; decoded and written there first when no run did yet
            from sat_core.data.cache import image_store

            store = image_store(cfg.data.cache, self.data, self.preprocess, splits=splits, workers=cfg.data.workers,
                                progress=show, say=lambda text: print(text, flush=True) if self.main_process else None)
            where = f"memory-mapped from {store.folder}"
        else:
            store = ImageStore(self.data, self.preprocess, splits=splits, workers=cfg.data.workers, progress=show)
            where = "decoded into RAM (--cache DIR keeps them on disk for every later run)"
        if self.main_process:
            print(f"images: {len(store):,} at {self.preprocess.image_size} px {where} in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
        self.store = store
        self.train_set = CaptionDataset(self.data, "train", self.vocab, store)
        self.loader = make_loader(self.train_set, cfg.data.batch_size, shuffle=True, seed=cfg.seed,
                                  num_replicas=self.world, rank=self.rank, by_image=cfg.data.batching == "image",
                                  pin_memory=self.device.type == "cuda")
        self.val_images = EvalImages(self.data, cfg.data.val_split, store, batch_size=64)
        self.extra_terms = extra_terms(cfg, self.train_set, self.preprocess)  # beyond the paper: none by default
        # Kept in every checkpoint: the explorer's out-of-domain check and the error labels' word kinds.
        self.reference_images = domain_images(self.data) if self.main_process else []
        self.training_stats = (training_statistics(self.data, images=self.reference_images)
                               if self.main_process else {})
        self.annotation_stats: dict[str, Any] | None = None  # the encoder's view of reference_images
        self.annotation_step = -1
        if cfg.data.val_images:
            self.val_images.image_ids = self.val_images.image_ids[: cfg.data.val_images]

    def _build_model(self) -> None:
        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.model_config = model_config(cfg, len(self.vocab))
        local = bool(cfg.encoder_weights) and cfg.model.encoder != "small"  # ImageNet weights from a file
        self.model = Captioner(dataclasses.replace(self.model_config, pretrained=False) if local
                               else self.model_config)
        load_weights(self.model, cfg, self.vocab, self.preprocess, say=self.main_process)  # _restore replaces them
        self.model.to(self.device)
        cuda = self.device.type == "cuda"
        if cuda and cfg.channels_last:
            self.model.encoder.to(memory_format=torch.channels_last)
        if cfg.compile == "on" or cfg.compile == "auto" and cuda:
            self.model.decoder.compile_recurrence()
        self.train_model: torch.nn.Module = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.train_model = DDP(self.model, device_ids=[self.device.index] if cuda else None)
        self.optimizer = build_optimizer(cfg.optim.optimizer, param_groups(self.model, cfg.optim.encoder_lr_scale), lr=cfg.optim.lr,
                                         weight_decay=cfg.optim.weight_decay)
        self.precision = resolve_training(self.device, cfg.precision)
        self.scaler = grad_scaler(self.device, self.precision)  # fp16 only
        if self.world > 1:
            # DDP copies rank 0's initial weights; from here each rank draws its own dropout masks
            # and hard-attention samples (the same seed everywhere would repeat them on every rank).
            torch.manual_seed(cfg.seed + self.rank)

    def _dsa_lambda(self) -> float:
        """The paper's penalty is soft attention's; hard models use it only when ``hard.dsa`` asks."""
        cfg = self.cfg
        return cfg.optim.dsa_lambda if not self.model.hard or cfg.model.hard.dsa else 0.0

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def _annotations(self, rows: list[int]) -> torch.Tensor:
        """Cached annotations (U, L, D) of store rows; with --tune-blocks, through the trained blocks (fp32)."""
        cached = self.feed(rows).float()  # (U, L, D) on the device (``feed``: resident, or pinned and async)
        if not self.model.encoder.tune_blocks:
            return cached  # (U, L, D)
        with torch.autocast(self.device.type, enabled=False):  # the encoder runs in fp32 at inference too
            return self.model.encoder.from_cached(cached).feats  # (U, C, gh, gw) -> (U, L, D)

    def _feature_cache(self) -> torch.Tensor | None:
        """A frozen encoder gives the same annotations every epoch: compute them once (fp16) into one preallocated
        tensor in RAM or, with --cache DIR, into the on-disk cache, where later runs, resumes and ranks map them.

        With --tune-blocks the cache holds the frozen part's output (N, C, gh, gw) instead."""
        from sat_core.data.cache import DiskImageStore, annotation_cache, encode_rows, encoder_identity, gib

        cfg, encoder = self.cfg, self.model.encoder
        say = lambda text: print(text, flush=True) if self.main_process else None  # noqa: E731
        if encoder.trainable or cfg.data.cache_features == "off":
            return None
        n, size = len(self.store.images), self.preprocess.image_size
        on_disk = isinstance(self.store, DiskImageStore)
        estimate = n * (size // encoder.stride) ** 2 * self.model_config.feature_dim * 2
        if cfg.data.cache_features == "auto" and not on_disk and estimate > 4 * 2**30:
            say(f"encoder: not caching its annotations: {n:,} images would take {gib(estimate)} of RAM, over the "
                "4 GiB that --cache-features auto allows, so every image is encoded at every step. Give --cache DIR "
                "to keep them on disk, or --cache-features on to keep them in RAM all the same.")
            return None
        # Batches of 32 images at 224 px, 8 at 448 px: larger ones outgrow the cache (114 ms per 448 px
        # image in batches of 64 against 55 in batches of 8 on a 2-core EPYC).
        chunk = max(1, 32 * 224**2 // size**2)

        def encode(images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
            x = normalise(images.to(self.device), self.preprocess)  # (b, 3, S, S)
            if encoder.tune_blocks:
                fmap = encoder.cacheable(x.float())  # (b, C, gh, gw)
                return fmap.half().cpu(), (fmap.shape[2], fmap.shape[3])
            annotations = self.model.encode(x)
            return annotations.feats.half().cpu(), annotations.grid  # (b, L, D)

        def progress(items):
            return self._progress_over(items, "encoding", "batch")

        started = time.perf_counter()
        # A new module is in train mode: batch-norm would normalise each chunk by its own statistics
        # (features unlike those at inference) and overwrite the pretrained running averages.
        self.model.eval()
        with torch.no_grad():
            if on_disk:
                cached = annotation_cache(self.store, encoder_identity(self.model_config, encoder), encode,
                                          chunk=chunk, progress=progress, say=say)
                cache, self.grid, where = cached.tensor, cached.grid, f"memory-mapped from {cached.path}"
            else:  # minutes for a scenes world on 2 cores: say so before, not only after
                what = "the encoder's frozen blocks" if encoder.tune_blocks else "the frozen encoder"
                say(f"encoder: running {what} once over the {n:,} images (their output is kept for every epoch)…")
                cache, self.grid = encode_rows(self.store, encode, lambda shape: torch.empty((n, *shape),
                                               dtype=torch.float16), chunk=chunk, progress=progress)
                where = "kept in RAM"
        self.train_set.carry_images = False  # the annotations stand in for the images: batches read no pixels
        say(f"encoder: the annotations of {n:,} images ({gib(cache.numel() * 2)} in fp16) {where}, "
            f"{time.perf_counter() - started:.0f} s")
        return cache

    # -- one epoch

    def train_one_epoch(self) -> dict[str, float]:
        cfg = self.cfg
        self.train_model.train()
        self.loader.batch_sampler.set_epoch(self.epoch)
        self.fillers = distributed.fillers(self.loader)  # steps where this process holds a caption of weight 0
        totals = dict.fromkeys(self._terms, 0.0)
        batches, captions, started = 0, 0, time.perf_counter()
        last = started
        final = last_step(self.planned_epochs, len(self.loader))  # a plan fitted to --max-minutes may end mid-epoch
        for i, batch in enumerate(self._progress(self._batches())):
            if i < self.batch_in_epoch:
                continue  # resumed mid-epoch: these batches were already trained on
            if self.step >= final:
                break
            terms, step_captions = self._train_step(batch)
            for k in totals:
                totals[k] += terms[k]
            batches += 1
            captions += step_captions
            self.batch_in_epoch, self.step = i + 1, self.step + 1
            if self.steps is not None and self.step % cfg.log_every == 0:
                now = time.perf_counter()
                self.steps.step(self.step, self.epoch + 1, self.lr, step_captions, now - last, terms)
                last = now
            if distributed.any_process(self.stop_signal is not None, self.device):  # all stop after the same step
                self.save_last(refresh=False)
                distributed.barrier()
                raise Interrupted()
            if cfg.optim.save_every and self.step % cfg.optim.save_every == 0:
                self.save_last(refresh=False)
        elapsed = time.perf_counter() - started
        means = {k: v / max(batches, 1) for k, v in totals.items()}
        return {**means, "lr": self.lr, "captions_per_s": captions / max(elapsed, 1e-9), "time_s": elapsed}

    def _train_step(self, batch) -> tuple[dict[str, float], int]:
        """One optimizer step: (its loss terms per word over the global batch, its captions over all processes).
        Where this process holds a filler (``distributed``) its share counts 0."""
        cfg, filler = self.cfg, self.batch_in_epoch in self.fillers
        batch = batch.to(self.device, non_blocking=True)  # from pinned memory on a GPU: the copy overlaps
        with self._autocast():
            out = self._forward(batch)
            parts = caption_loss(out, batch.captions[:, 1:], dsa_lambda=self._dsa_lambda(),
                                 hard=cfg.model.hard if self.model.hard else None, baseline=self.baseline)
        total = parts.total
        terms = {"loss": 0.0, "nll": parts.nll, "dsa": parts.dsa, "reinforce": parts.reinforce, "entropy": parts.entropy}
        for term in self.extra_terms:  # objectives beyond the paper's, each behind its own config option
            value, terms[term.name] = term(out, batch)
            total = total + value
        terms["loss"] = float(total.detach())
        tokens = 0.0 if filler else float(parts.tokens)
        terms, all_tokens, captions = distributed.reduce_step(terms, tokens, 0 if filler else batch.captions.shape[0],
                                                              self.device)
        if not math.isfinite(terms["loss"]):  # the global batch's: every process stops here together
            raise self._non_finite("loss", terms["loss"], batch)
        self.optimizer.zero_grad(set_to_none=True)
        self._step(distributed.scale_to_global(total, tokens, all_tokens), batch)
        return terms, captions

    def _forward(self, batch):
        """The teacher-forced pass over a batch, from cached annotations when there are."""
        if self.feed is not None:
            rows = [self.store.row_of[i] for i in batch.image_ids]
            feats = self._annotations(rows)  # (U, L, D)
            return self.train_model(None, batch.captions, feats=feats, image_index=batch.image_index)
        images = normalise(batch.images, self.preprocess)  # (U, 3, S, S)
        if self.device.type == "cuda" and self.cfg.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.train_model(images, batch.captions, image_index=batch.image_index)

    def _step(self, loss: torch.Tensor, batch) -> None:
        """Backward pass, the step's rate, clipping and the optimizer step (through fp16's scaler when there is)."""
        scaler = self.scaler
        (scaler.scale(loss) if scaler else loss).backward()
        self.lr = self._rate()
        self._set_lr(self.lr)
        if scaler:
            scaler.unscale_(self.optimizer)
        # A finite loss can still have inf/NaN gradients; stepping on them would poison the weights
        # that the next save writes. max_norm=inf only measures.
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip or float("inf"))
        if scaler is None and not torch.isfinite(norm):
            raise self._non_finite("gradient norm", float(norm), batch)
        if scaler is None:
            self.optimizer.step()
        else:  # fp16 overflowed when the norm is inf: the scaler skips the step and lowers its scale
            scaler.step(self.optimizer)
            scaler.update()

    def _non_finite(self, what: str, value: float, batch) -> SatError:
        return SatError(
            f"The {what} became {value} at epoch {self.epoch + 1}, batch {self.batch_in_epoch + 1} "
            f"(images {batch.image_ids[:5]}…). Nothing from this step was saved; {self.run_dir / 'last'} "
            "holds the last good state. Lower --lr or --grad-clip, check those images, then --resume."
        )

    def _autocast(self):
        """bf16 (fp16) matrix products where ``--precision`` resolves to them; weights and optimizer stay fp32."""
        return autocast(self.device, self.precision)

    def _batches(self):
        """The loader's iterator, minus the global-RNG draw DataLoader makes for a worker seed: num_workers=0 never
        uses that seed, and a mid-epoch resume would draw it a second time, shifting every later random number (hard
        attention's samples, dropout) off the original run."""
        rng = torch.get_rng_state()
        batches = iter(self.loader)
        torch.set_rng_state(rng)
        return batches

    def _progress(self, loader):
        return self._progress_over(loader, f"epoch {self.epoch + 1}/{self.planned_epochs}", "batch",
                                   total=len(self.loader))

    def _progress_over(self, items, desc: str, unit: str, total: int | None = None):
        """A progress bar on a terminal with --progress; the items themselves otherwise."""
        from tqdm import tqdm

        return tqdm(items, total=total, desc=desc, unit=unit, leave=False,
                    disable=not (self.cfg.progress and self.main_process and sys.stderr.isatty()))

    # -- validation: free-running decoding, BLEU-4

    def validate(self) -> dict[str, float]:
        from sat_core.evaluation.metrics import caption_metrics

        refs, hyps, figures, logprobs = {}, {}, [], []
        for ids, images in self.val_images:
            if self.feed is not None:  # the cache holds the validation split too: no encoder pass
                with torch.no_grad():
                    feats = self._annotations([self.store.row_of[i] for i in ids])  # (U, L, D)
                inputs = Annotations(feats, self.grid)
            else:
                inputs = normalise(images, self.preprocess)
            results = beam_search(self.model, inputs, self.vocab, self.cfg.val)
            for k, (i, hyp) in enumerate(zip(ids, results)):
                hyps[i] = hyp[0].caption
                logprobs.append(hyp[0].logprob)
                refs[i] = [" ".join(s) for s in self.val_images.references(i)]
                if self.steps is not None and len(figures) < SAMPLES:
                    figures.append(Sample.of(images[k], hyp[0], refs[i][0]))
        self.figures = figures  # below: the unsure flag's reference (evaluation.confidence), saved with these weights
        self.confidence = ConfidenceReference.from_logprobs(logprobs, split=self.cfg.data.val_split).to_dict()
        self.samples = [(hyps[i], refs[i][0]) for i in list(hyps)[:SAMPLES]]  # shown on the console
        report = caption_metrics(refs, hyps, meteor=False)
        return report.corpus

    # -- checkpoints

    def save_last(self, refresh: bool = True) -> None:
        """Weights and resumable state in one atomic swap: a kill never leaves them mismatched.
        ``refresh=False`` (saves within an epoch) reuses the last out-of-domain statistics."""
        if not self.main_process:
            return
        tensors, skeleton = flatten_state({
            "optimizer": self.optimizer.state_dict(),
            **rng_tensors(),
            "scaler": self.scaler.state_dict() if self.scaler else {},
        })
        state = {
            "skeleton": skeleton, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "step": self.step, "best": self.best, "bad_epochs": self.bad_epochs,
            "planned_epochs": self.planned_epochs, "epochs": self.cfg.optim.epochs,
            "baseline": self.baseline.value, **rng_json(),
            "world": self.world, "plateau": self.plateau.state(), "train_seconds": self.train_seconds,
        }
        if self.steps is not None:
            self.steps.flush()  # the rows up to this state are on disk with it
        self._save_model(self.run_dir / "last", extra_json={STATE_JSON: state},
                         extra_tensors={STATE_TENSORS: tensors}, refresh=refresh)

    def _domain_statistics(self, refresh: bool) -> dict[str, Any]:
        """training_stats with the encoder's view of the reference images, recomputed (about 5 s for 100
        images on 2 CPU cores) when the encoder learns and has changed since, unless ``refresh`` is off."""
        stats = dict(self.training_stats)
        if "domain" not in stats:
            return stats
        learns = any(p.requires_grad for p in self.model.encoder.parameters())
        if self.annotation_stats is None or (learns and refresh and self.annotation_step != self.step):
            was_training = self.model.training
            self.model.eval()
            self.annotation_stats = annotation_statistics(self.model, self.preprocess, self.reference_images)
            self.model.train(was_training)
            self.annotation_step = self.step
        stats["domain"] = {**stats["domain"], "annotations": self.annotation_stats}
        return stats

    def _save_model(self, directory: Path, metrics: dict | None = None, *, refresh: bool = True,
                    **extra: Any) -> None:
        cfg = self.cfg
        training = {"train_config": cfg.to_dict(), "epoch": self.epoch, "step": self.step,
                    "planned_epochs": self.planned_epochs,  # the schedule's length, once fitted to --max-minutes
                    "dataset": str(cfg.data.dataset), **self._domain_statistics(refresh),
                    **({"confidence": self.confidence} if self.confidence else {}),
                    # what the model card says of the data, the choice of this epoch and the time it took
                    "images": {split: self.data.split_counts.get(split, 0) for split in ("train", cfg.data.val_split)},
                    "captions": len(self.train_set), "processes": self.world,
                    "selection": {"metric": SELECT_KEYS[cfg.optim.select_metric], "split": cfg.data.val_split,
                                  "best": self.best},
                    "train_minutes": round(self.train_seconds / 60, 2), "setup_minutes": round(self.setup_s / 60, 2)}
        ckpt.save_checkpoint(directory, self.model, model_config=self.model_config, vocab=self.vocab,
                             preprocess=self.preprocess, training=training, metrics=metrics, **extra)

    def _restore(self) -> None:
        last = self.run_dir / "last"
        tensors, config = ckpt.read_checkpoint(last)
        self.model.load_state_dict(tensors)
        self.confidence = (config.get("training") or {}).get("confidence")
        state = json.loads((last / STATE_JSON).read_text())
        flat, _meta = read_tensors(last / STATE_TENSORS)
        saved = unflatten_state(flat, state["skeleton"])
        self.optimizer.load_state_dict(saved["optimizer"])
        for group in self.optimizer.param_groups:  # the saved groups carry the old rate; the config wins
            group["weight_decay"] = self.cfg.optim.weight_decay
        self._set_lr(self.cfg.optim.lr)
        restore_rngs(saved, state)
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best, self.bad_epochs, self.baseline.value = state["best"], state["bad_epochs"], state["baseline"]
        self.plateau.load(state.get("plateau"))
        self.train_seconds = state.get("train_seconds", 0.0)
        if self.scaler and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        if state.get("epochs") == self.cfg.optim.epochs:  # a new --epochs on resume plans afresh
            self.planned_epochs = state.get("planned_epochs", self.cfg.optim.epochs)
        if self.world > 1:
            # Only rank 0's RNG and baseline are saved: the other ranks continue from a fresh
            # rank-dependent seed, so a multi-process resume is not bit-exact (README says so).
            torch.manual_seed(self.cfg.seed + self.rank + 1_000_003 * self.step)

    # -- the run

    def run(self) -> dict[str, Any]:
        previous = self._install_signal_handlers()
        try:
            return self._run_epochs()
        finally:  # a library caller (tests, notebooks) gets its own handlers back
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self.steps is not None:
                self.steps.close()
                self.steps = None

    def _run_epochs(self) -> dict[str, Any]:
        cfg = self.cfg
        epoch_s = train_s = 0.0  # the last epoch's seconds, all of it and its steps alone
        while self.epoch < self.planned_epochs:
            spent = (time.perf_counter() - self.started) / 60
            next_s = epoch_s - (1 - min(1.0, self.planned_epochs - self.epoch)) * train_s  # its planned share
            if cfg.optim.max_minutes and distributed.from_rank0(self.device, spent + next_s / 60) > cfg.optim.max_minutes:
                self._log({"event": "time_budget", "epoch": self.epoch, "minutes": spent})
                break
            epoch_started = time.perf_counter()
            stats = self.train_one_epoch()
            val = self.validate() if self.main_process else {}
            self.train_seconds += time.perf_counter() - epoch_started
            score = distributed.from_rank0(self.device, val.get(SELECT_KEYS[cfg.optim.select_metric], 0.0))  # only rank 0 validates
            improved = score > self.best
            self.best = max(self.best, score)
            self.bad_epochs = 0 if improved else self.bad_epochs + 1
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            if self.main_process:
                self._log({"epoch": self.epoch, "step": self.step, **stats, "precision": self.precision,
                           "baseline": self.baseline.value,
                           "val": val, self._best_key: self.best})
                if self.steps is not None:
                    self.steps.validation(self.step, val, self.figures)
                if improved:
                    self._save_model(self.run_dir / "best", metrics={f"val_{k}": v for k, v in val.items()})
            if cfg.optim.lr_schedule == "plateau" and self.plateau.after_validation(improved):
                self.lr = self._rate()
                self._log({"event": "plateau", "epoch": self.epoch, "lr": self.lr})
            self.save_last()
            distributed.barrier()
            epoch_s, train_s = time.perf_counter() - epoch_started, stats["time_s"]
            self._fit_schedule(epoch_s, train_s)
            if cfg.optim.patience and self.bad_epochs >= cfg.optim.patience:
                self._log({"event": "early_stop", "epoch": self.epoch, self._best_key: self.best})
                break
        return {"epochs": self.epoch, self._best_key: self.best, "run_dir": str(self.run_dir)}

    def _rate(self) -> float:
        return self.cfg.optim.lr_at(self.step, len(self.loader), epochs=self.planned_epochs, plateau=self.plateau.share,
                                    batch_size=self.cfg.data.batch_size)

    def _fit_schedule(self, epoch_s: float, train_s: float) -> None:
        """Shorten the plan to what still fits into --max-minutes (``fitted_epochs``), judged by the epoch just run,
        so that a cosine schedule ends where the run will end instead of being cut off at a high rate."""
        budget = self.cfg.optim.max_minutes
        if not budget or self.cfg.optim.lr_schedule != "cosine":
            return
        left = budget * 60 - (time.perf_counter() - self.started)  # seconds
        fit = distributed.from_rank0(self.device, fitted_epochs(self.epoch, left, epoch_s, train_s))
        if fit < self.planned_epochs:
            self.planned_epochs = int(fit) if fit.is_integer() else fit
            self._log({"event": "schedule", "epoch": self.epoch, "epochs": self.planned_epochs,
                       "minutes": budget - left / 60, "epoch_minutes": epoch_s / 60})

    @property
    def _best_key(self) -> str:
        return f"best_{self.cfg.optim.select_metric}"

    def _log(self, record: dict[str, Any]) -> None:
        if not self.main_process:
            return
        with open(self.run_dir / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        print(self._console_line(record), flush=True)

    def _console_line(self, record: dict[str, Any]) -> str:
        return console_line(record, self.cfg, getattr(self, "samples", []), [t.name for t in self.extra_terms])

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Turn SIGINT/SIGTERM into a flag checked after each step; returns the handlers replaced."""
        def handler(signum, _frame):
            self.stop_signal = signum

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
