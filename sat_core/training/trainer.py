"""The trainer: one run of the paper's objective over a Karpathy-format dataset (``python -m sat_core.train``).

``Trainer(cfg, resume).run()`` reads the data, builds the model, caches a frozen encoder's annotations, then
trains epoch by epoch: teacher forcing, ``losses.caption_loss`` (plus any extra term the config asks for,
``supervision.extra_terms``), validation by free-running decoding, ``best/`` and a resumable ``last/``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sat_core import checkpoint as ckpt
from sat_core.config import ModelConfig, PreprocessConfig, TrainConfig
from sat_core.data.karpathy import (
    CaptionDataset, EvalImages, ImageStore, build_vocab, load_karpathy, make_loader, normalise,
)
from sat_core.data.vocab import Vocab
from sat_core.decoding import beam_search, pick_device
from sat_core.errors import SatError
from sat_core.evaluation.card import annotation_statistics, domain_images, training_statistics
from sat_core.io import read_tensors, write_json_atomic
from sat_core.models.captioner import Captioner
from sat_core.models.encoder import FEATURE_DIMS, Annotations, load_torchvision_weights
from sat_core.precision import autocast, resolve
from sat_core.training.losses import MovingBaseline, caption_loss
from sat_core.training.state import (
    STATE_JSON, STATE_TENSORS, flatten_state, numpy_state, python_rng, python_state, require_state, unflatten_state,
)
from sat_core.training.supervision import extra_terms

SELECT_KEYS = {"bleu4": "BLEU-4", "cider": "CIDEr"}  # --select-metric -> caption_metrics key
SAMPLES = 2  # validation captions printed after each epoch


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived; a resumable checkpoint was written."""


def build_optimizer(name: str, params: Any, *, lr: float, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """Adam or RMSprop over ``params``. Adam runs its fused kernel: one pass over each parameter
    instead of a dozen elementwise ops (on this project's 2-core CPU 11 ms a step instead of 42 for
    the COCO-size decoder's 21 M parameters); the same update to float rounding."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, fused=True)
    return torch.optim.RMSprop(params, lr=lr, weight_decay=weight_decay)


def model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    """The configured model with what the data and the encoder decide filled in."""
    m = cfg.model
    feature_dim = m.small_channels[-1] if m.encoder == "small" else FEATURE_DIMS[m.encoder]
    if m.multiscale:
        from sat_core.models.efficientnet import MULTISCALE_DIM

        feature_dim = MULTISCALE_DIM
    if m.coarse:
        feature_dim = 320  # EfficientNet-Lite0's stride-32 stage
    if m.shallow:
        feature_dim = 80  # the end of its first stride-16 stage
    # efficientnet_lite0's ImageNet weights always come with it (pip): a frozen random net is useless
    pretrained = m.pretrained or bool(cfg.encoder_weights) or m.encoder == "efficientnet_lite0"
    return dataclasses.replace(m, feature_dim=feature_dim, vocab_size=vocab_size, pretrained=pretrained)


def preprocess_config(cfg: TrainConfig) -> PreprocessConfig:
    size = cfg.data.image_size or (112 if cfg.model.encoder == "small" else 224)
    if cfg.model.encoder == "efficientnet_lite0":  # its TensorFlow training scaled pixels to [-1, 1]
        from sat_core.models.efficientnet import MEAN, STD

        # crop 1: the whole image; ImageNet's 0.875 evaluation crop would cut off objects at the edges
        return PreprocessConfig(image_size=size, mean=MEAN, std=STD, crop=1.0)
    return PreprocessConfig(image_size=size)


class Trainer:
    def __init__(self, cfg: TrainConfig, resume: str | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(resume or cfg.out)
        self.started = time.perf_counter()  # --max-minutes counts from here: reading and encoding images too
        self.rank, self.world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        self.device = self._setup_device()
        self.main_process = self.rank == 0
        self.stop_signal: int | None = None
        self._read_dataset(resume)  # the JSON and the vocabulary: seconds
        self._build_model()  # encoder weights are found (or refused) before any image is decoded
        self._decode_images()
        self.features = self._feature_cache()
        self.setup_s = time.perf_counter() - self.started
        self.epoch, self.batch_in_epoch, self.step = 0, 0, 0
        self.planned_epochs = cfg.optim.epochs  # fewer when the time budget cannot fit them (_fit_schedule)
        self.best, self.bad_epochs = -1.0, 0
        self.baseline = MovingBaseline(cfg.model.hard.baseline_decay)
        if resume:
            self._restore()
        self.lr = self._rate()  # the schedule's rate; set before every step
        if self.main_process:  # on resume too: flags given with --resume (--lr, --epochs) hold from now on
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not resume:
                self._set_aside_old_log()
            write_json_atomic(self.run_dir / "train_config.json", cfg.to_dict())
            self._log({"event": "setup", "seconds": round(self.setup_s, 1), "images": len(self.store)})

    # -- setup

    def _set_aside_old_log(self) -> None:
        """A new run in the folder of an earlier one starts its own log.jsonl: mixed with the old epochs,
        it would misreport the run (the ship's epochs, minutes and best epoch). The old log is kept."""
        log = self.run_dir / "log.jsonl"
        if log.is_file():
            log.replace(self.run_dir / "log.previous.jsonl")
            print(f"{self.run_dir} held an earlier run: its log is now log.previous.jsonl", flush=True)

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
        if resume:
            require_state(Path(resume) / "last")  # before the slow part: decoding every image
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
                                  num_replicas=self.world, rank=self.rank, by_image=cfg.data.batching == "image")
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
        if cfg.encoder_weights:
            self._load_encoder(Path(cfg.encoder_weights))
        self.model.to(self.device)
        cuda = self.device.type == "cuda"
        if cuda and cfg.channels_last:
            self.model.encoder.to(memory_format=torch.channels_last)
        self.train_model: torch.nn.Module = self.model
        if self.world > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.train_model = DDP(self.model, device_ids=[self.device.index] if cuda else None)
        self.optimizer = build_optimizer(cfg.optim.optimizer, self._param_groups(), lr=cfg.optim.lr,
                                         weight_decay=cfg.optim.weight_decay)
        self.precision = resolve(self.device, cfg.precision)
        if self.world > 1:
            # DDP copies rank 0's initial weights; from here each rank draws its own dropout masks
            # and hard-attention samples (the same seed everywhere would repeat them on every rank).
            torch.manual_seed(cfg.seed + self.rank)

    def _load_encoder(self, path: Path) -> None:
        if self.cfg.model.encoder != "small":
            load_torchvision_weights(self.model.encoder, self.cfg.model.encoder, path)
            return
        tensors, _meta = read_tensors(path)
        try:
            self.model.encoder.load_state_dict(tensors)
        except RuntimeError as exc:
            raise SatError(f"{path} does not fit the small encoder {list(self.cfg.model.small_channels)}: "
                           f"{str(exc).splitlines()[0]} Use the --small-channels it was pretrained with.") from None

    def _dsa_lambda(self) -> float:
        """The paper's penalty is soft attention's; hard models use it only when ``hard.dsa`` asks."""
        cfg = self.cfg
        return cfg.optim.dsa_lambda if not self.model.hard or cfg.model.hard.dsa else 0.0

    def _param_groups(self) -> list[dict]:
        """Everything that learns, at --lr; encoder blocks trained with --tune-blocks at a share of it."""
        encoder = self.model.encoder
        tuned = encoder.body.tail_parameters() if encoder.tune_blocks else []
        rest = [p for p in self.model.parameters() if p.requires_grad and all(p is not q for q in tuned)]
        groups = [{"params": rest, "lr_scale": 1.0}]
        if tuned:
            groups.append({"params": tuned, "lr_scale": self.cfg.optim.encoder_lr_scale})
        return groups

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)

    def _annotations(self, rows: list[int]) -> torch.Tensor:
        """Cached annotations (U, L, D) of store rows; with --tune-blocks, through the trained blocks (fp32)."""
        cached = self.features[rows].to(self.device).float()
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
        cfg, model = self.cfg, self.train_model
        model.train()
        self.loader.batch_sampler.set_epoch(self.epoch)
        totals = dict.fromkeys(["loss", "nll", "dsa", "reinforce", "entropy", *(t.name for t in self.extra_terms)], 0.0)
        batches, captions, started = 0, 0, time.perf_counter()
        for i, batch in enumerate(self._progress(self._batches())):
            if i < self.batch_in_epoch:
                continue  # resumed mid-epoch: these batches were already trained on
            parts = self._train_step(batch)
            for k in totals:
                totals[k] += parts[k]
            batches += 1
            captions += batch.captions.shape[0]
            self.batch_in_epoch, self.step = i + 1, self.step + 1
            if self.stop_signal is not None:
                self.save_last(refresh=False)
                raise Interrupted()
            if cfg.optim.save_every and self.step % cfg.optim.save_every == 0:
                self.save_last(refresh=False)
        elapsed = time.perf_counter() - started
        means = {k: v / max(batches, 1) for k, v in totals.items()}
        return {**means, "lr": self.lr, "captions_per_s": captions * self.world / max(elapsed, 1e-9),
                "time_s": elapsed}

    def _train_step(self, batch) -> dict[str, float]:
        cfg = self.cfg
        batch = batch.to(self.device)
        with self._autocast():
            if self.features is not None:
                rows = [self.store.row_of[i] for i in batch.image_ids]
                feats = self._annotations(rows)  # (U, L, D)
                out = self.train_model(None, batch.captions, feats=feats, image_index=batch.image_index)
            else:
                images = normalise(batch.images, self.preprocess)  # (U, 3, S, S)
                if self.device.type == "cuda" and cfg.channels_last:
                    images = images.contiguous(memory_format=torch.channels_last)
                out = self.train_model(images, batch.captions, image_index=batch.image_index)
            parts = caption_loss(out, batch.captions[:, 1:], dsa_lambda=self._dsa_lambda(),
                                 hard=cfg.model.hard if self.model.hard else None, baseline=self.baseline)
        total, extras = parts.total, {}
        for term in self.extra_terms:  # objectives beyond the paper's, each behind its own config option
            value, extras[term.name] = term(out, batch)
            total = total + value
        if not torch.isfinite(total):
            raise self._non_finite("loss", float(total.detach()), batch)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        self.lr = self._rate()
        self._set_lr(self.lr)
        # A finite loss can still have inf/NaN gradients; stepping on them would poison the weights
        # that the next save writes. max_norm=inf only measures.
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.grad_clip or float("inf"))
        if not torch.isfinite(norm):
            raise self._non_finite("gradient norm", float(norm), batch)
        self.optimizer.step()
        return {"loss": float(total.detach()), "nll": parts.nll, "dsa": parts.dsa,
                "reinforce": parts.reinforce, "entropy": parts.entropy, **extras}

    def _non_finite(self, what: str, value: float, batch) -> SatError:
        return SatError(
            f"The {what} became {value} at epoch {self.epoch + 1}, batch {self.batch_in_epoch + 1} "
            f"(images {batch.image_ids[:5]}…). Nothing from this step was saved; {self.run_dir / 'last'} "
            "holds the last good state. Lower --lr or --grad-clip, check those images, then --resume."
        )

    def _autocast(self):
        """bf16 matrix products where ``--precision`` resolves to bf16; weights and optimizer stay fp32."""
        return autocast(self.device, self.cfg.precision)

    def _batches(self):
        """The loader's iterator, minus the global-RNG draw DataLoader makes for a worker seed.

        num_workers=0 never uses that seed, and a mid-epoch resume would draw it a second time,
        shifting every later random number (hard attention's samples, dropout) off the original run.
        """
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

        refs, hyps = {}, {}
        for ids, images in self.val_images:
            if self.features is not None:  # the cache holds the validation split too: no encoder pass
                with torch.no_grad():
                    feats = self._annotations([self.store.row_of[i] for i in ids])  # (U, L, D)
                inputs = Annotations(feats, self.grid)
            else:
                inputs = normalise(images, self.preprocess)
            results = beam_search(self.model, inputs, self.vocab, self.cfg.val)
            for i, hyp in zip(ids, results):
                hyps[i] = hyp[0].caption
                refs[i] = [" ".join(s) for s in self.val_images.references(i)]
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
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        })
        state = {
            "skeleton": skeleton, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "step": self.step, "best": self.best, "bad_epochs": self.bad_epochs,
            "planned_epochs": self.planned_epochs, "epochs": self.cfg.optim.epochs,
            "baseline": self.baseline.value, "numpy_rng": numpy_state(), "python_rng": python_state(),
        }
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
        training = {"train_config": self.cfg.to_dict(), "epoch": self.epoch, "step": self.step,
                    "planned_epochs": self.planned_epochs,  # the schedule's length, once fitted to --max-minutes
                    "dataset": str(self.cfg.data.dataset), **self._domain_statistics(refresh)}
        ckpt.save_checkpoint(directory, self.model, model_config=self.model_config, vocab=self.vocab,
                             preprocess=self.preprocess, training=training, metrics=metrics, **extra)

    def _restore(self) -> None:
        last = self.run_dir / "last"
        tensors, _config = ckpt.read_checkpoint(last)
        self.model.load_state_dict(tensors)
        state = json.loads((last / STATE_JSON).read_text())
        flat, _meta = read_tensors(last / STATE_TENSORS)
        saved = unflatten_state(flat, state["skeleton"])
        self.optimizer.load_state_dict(saved["optimizer"])
        for group in self.optimizer.param_groups:  # the saved groups carry the old rate; the config wins
            group["weight_decay"] = self.cfg.optim.weight_decay
        self._set_lr(self.cfg.optim.lr)
        torch.set_rng_state(saved["torch_rng"])
        if saved["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        name, keys, pos, has_gauss, cached = state["numpy_rng"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
        random.setstate(python_rng(state["python_rng"]))
        self.epoch, self.batch_in_epoch, self.step = state["epoch"], state["batch_in_epoch"], state["step"]
        self.best, self.bad_epochs, self.baseline.value = state["best"], state["bad_epochs"], state["baseline"]
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

    def _run_epochs(self) -> dict[str, Any]:
        cfg = self.cfg
        epoch_s = 0.0
        while self.epoch < self.planned_epochs:
            spent = (time.perf_counter() - self.started) / 60
            if cfg.optim.max_minutes and self._from_rank0(spent + epoch_s / 60) > cfg.optim.max_minutes:
                self._log({"event": "time_budget", "epoch": self.epoch, "minutes": spent})
                break
            epoch_started = time.perf_counter()
            stats = self.train_one_epoch()
            val = self.validate() if self.main_process else {}
            score = self._from_rank0(val.get(SELECT_KEYS[cfg.optim.select_metric], 0.0))  # only rank 0 validates
            improved = score > self.best
            self.best = max(self.best, score)
            self.bad_epochs = 0 if improved else self.bad_epochs + 1
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
            if self.main_process:
                self._log({"epoch": self.epoch, "step": self.step, **stats, "precision": self.precision,
                           "baseline": self.baseline.value,
                           "val": val, self._best_key: self.best})
                if improved:
                    self._save_model(self.run_dir / "best", metrics={f"val_{k}": v for k, v in val.items()})
            self.save_last()
            self._barrier()
            epoch_s = time.perf_counter() - epoch_started
            self._fit_schedule(epoch_s)
            if cfg.optim.patience and self.bad_epochs >= cfg.optim.patience:
                self._log({"event": "early_stop", "epoch": self.epoch, self._best_key: self.best})
                break
        return {"epochs": self.epoch, self._best_key: self.best, "run_dir": str(self.run_dir)}

    def _rate(self) -> float:
        return self.cfg.optim.lr_at(self.step, len(self.loader), epochs=self.planned_epochs)

    def _fit_schedule(self, epoch_s: float) -> None:
        """Shorten the plan to the epochs that still fit into --max-minutes, judged by the epoch just run,
        so that a cosine schedule ends where the run will end instead of being cut off at a high rate."""
        budget = self.cfg.optim.max_minutes
        if not budget or self.cfg.optim.lr_schedule == "constant":
            return
        left = budget - (time.perf_counter() - self.started) / 60
        fit = int(self._from_rank0(self.epoch + max(0, int(left * 60 // max(epoch_s, 1e-9)))))  # ≥ self.epoch
        if fit < self.planned_epochs:
            self.planned_epochs = fit
            self._log({"event": "schedule", "epoch": self.epoch, "epochs": self.planned_epochs,
                       "minutes": budget - left, "epoch_minutes": epoch_s / 60})

    @property
    def _best_key(self) -> str:
        return f"best_{self.cfg.optim.select_metric}"

    def _log(self, record: dict[str, Any]) -> None:
        if not self.main_process:
            return
        with open(self.run_dir / "log.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        print(_console_line(record, self.cfg, getattr(self, "samples", []), [t.name for t in self.extra_terms]),
              flush=True)

    def _from_rank0(self, value: float) -> float:
        """Rank 0's value on every rank: a decision to stop must agree, or the other ranks hang in DDP."""
        if self.world == 1:
            return value
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.broadcast(tensor, src=0)
        return float(tensor)

    def _barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Turn SIGINT/SIGTERM into a flag checked after each step; returns the handlers replaced."""
        def handler(signum, _frame):
            self.stop_signal = signum

        return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def _console_line(record: dict[str, Any], cfg: TrainConfig, samples: list[tuple[str, str]],
                  extra: list[str] = ()) -> str:
    """What a person watching the run reads: the loss by term, validation, samples, why it stopped."""
    metric = SELECT_KEYS[cfg.optim.select_metric]
    best = record.get(f"best_{cfg.optim.select_metric}", 0.0)
    if record.get("event") == "early_stop":
        return (f"early stop after epoch {record['epoch']}: no better validation {metric} for "
                f"{cfg.optim.patience} epochs (best {best:.4f})")
    if record.get("event") == "setup":
        return f"setup: {record['seconds']:.0f} s before the first step (counted in --max-minutes)"
    if record.get("event") == "schedule":
        return (f"--max-minutes {cfg.optim.max_minutes:g} fits {record['epochs']} epochs at "
                f"{record['epoch_minutes']:.1f} min each, not {cfg.optim.epochs}: the cosine schedule now ends "
                f"after epoch {record['epochs']}")
    if record.get("event") == "time_budget":
        return (f"stopped before epoch {record['epoch'] + 1}: it would end past --max-minutes "
                f"{cfg.optim.max_minutes:g} ({record['minutes']:.1f} min spent)")
    v = record["val"]
    terms = f"nll {record['nll']:.3f}  dsa {record['dsa']:.3f}  reinforce {record['reinforce']:.3f}  entropy {record['entropy']:.3f}"
    terms += "".join(f"  {name} {record.get(name, 0.0):.3f}" for name in extra)
    lines = [f"epoch {record['epoch']}: loss {record['loss']:.3f} ({terms})  {record['captions_per_s']:.0f} captions/s "
             f"({record['precision']}, lr {record.get('lr', cfg.optim.lr):.2g})  "
             f"val BLEU-4 {v.get('BLEU-4', 0):.4f}  CIDEr {v.get('CIDEr', 0):.3f}  "
             f"best {metric} {best:.4f}"]
    lines += [f"  sample: {hyp or '(empty)'}  |  reference: {ref}" for hyp, ref in samples]
    return "\n".join(lines)
