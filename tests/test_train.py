"""The training CLI, driven through ``sat_core.train.main([...])`` on a tiny CPU model.

A tiny model memorises four captions until greedy decoding says them back; the saved checkpoint
reloads to the same logits; a run split by ``--resume`` (between epochs or mid-epoch, soft or hard
attention) ends bit-identical to an uninterrupted one; bad inputs exit with code 2 and a clear message.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
import torch

from sat_core import checkpoint as ckpt
from sat_core import train
from sat_core.training import trainer as training
from sat_core.config import DecodeConfig
from sat_core.data.imagestore import ImageStore, normalise
from sat_core.data.karpathy import load_karpathy
from sat_core.decoding import beam_search
from sat_core.io import read_tensors, save_tensors_atomic, write_json_atomic
from tests.fixtures_world import CAPTIONS, make_dataset, train_args


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> tuple[Path, Path]:
    """Four images, one distinct caption each, in train and again in val."""
    return make_dataset(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def world_data(tmp_path_factory) -> tuple[Path, Path]:
    """Six images with five varied world captions each: ~8 batches of 4 per epoch, mixed lengths."""
    root = tmp_path_factory.mktemp("world")
    from sat_core.worlds.writer import generate

    return generate(root, 6, 2, 0, seed=3, workers=1), root


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return read_tensors(run / "last" / ckpt.WEIGHTS_FILE)[0]


def _state(run: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    state = json.loads((run / "last" / training.STATE_JSON).read_text())
    return state, read_tensors(run / "last" / training.STATE_TENSORS)[0]


def assert_same_run(a: Path, b: Path) -> None:
    """Weights, optimizer moments, RNG streams and counters of ``a/last`` and ``b/last`` all equal."""
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    differ = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not differ, f"weights differ after resume: {differ[:5]}"
    (sa, ta), (sb, tb) = _state(a), _state(b)
    assert ta.keys() == tb.keys()
    differ = [k for k in ta if not torch.equal(ta[k], tb[k])]
    assert not differ, f"optimizer/RNG state differs after resume: {differ[:5]}"
    for key in ("epoch", "batch_in_epoch", "step", "baseline", "best", "bad_epochs", "numpy_rng", "python_rng"):
        assert sa[key] == sb[key], key


def _greedy(checkpoint: Path, data: Path, images: Path) -> list[str]:
    loaded = ckpt.load_checkpoint(checkpoint)
    dataset = load_karpathy(data, images)
    ids = dataset.split("train")
    store = ImageStore(dataset, loaded.preprocess, splits=("train",), progress=False)
    inputs = normalise(store.batch(ids), loaded.preprocess)  # (4, 3, S, S)
    hyps = beam_search(loaded.model, inputs, loaded.vocab, DecodeConfig(beam_size=1, max_len=12))
    return [h[0].caption for h in hyps]


# ----------------------------------------------------------------------------- learning


def test_tiny_model_overfits_four_captions_through_the_cli(tiny_data, tmp_path, capsys):
    data, images = tiny_data
    run = tmp_path / "run"
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    code = train.main(train_args(data, images, run, "--epochs", "40", "--lr", "1e-2", "--patience", "0"))
    assert code == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["best_bleu4"] > 0.999
    # A library call must leave the caller's signal handlers as they were.
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before

    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    epochs = [r for r in log if "val" in r]
    assert epochs[-1]["nll"] < 0.5 * epochs[0]["nll"], "the loss did not go down"
    assert [r["epoch"] for r in epochs] == list(range(1, 41)), "--patience 0 never stops early"
    assert _greedy(run / "best", data, images) == CAPTIONS
    best = json.loads((run / "best" / ckpt.CONFIG_FILE).read_text())
    assert best["metrics"]["val_BLEU-4"] > 0.999
    assert json.loads((run / "train_config.json").read_text())["optim"]["lr"] == 1e-2


def test_patience_stops_a_run_that_does_not_improve(tiny_data, tmp_path):
    data, images = tiny_data
    run = tmp_path / "run"
    assert train.main(train_args(data, images, run, "--epochs", "10", "--lr", "0", "--patience", "2")) == 0
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    # lr 0: BLEU never changes, so epoch 1 is the best and epochs 2-3 use up the patience.
    assert [r.get("epoch") for r in log if "val" in r] == [1, 2, 3]
    assert log[-1] == {"event": "early_stop", "epoch": 3, "best_bleu4": log[1]["val"]["BLEU-4"]}  # log[0]: setup
    assert _state(run)[0]["bad_epochs"] == 2


def test_save_then_load_gives_identical_logits(tiny_data, tmp_path):
    data, images = tiny_data
    cfg, resume = train.parse_config(train_args(data, images, tmp_path / "run", "--epochs", "2", "--lr", "1e-2"))
    trainer = training.Trainer(cfg, resume)
    trainer.run()
    loaded = ckpt.load_checkpoint(tmp_path / "run" / "last")
    assert loaded.vocab.to_dict() == trainer.vocab.to_dict()
    assert loaded.preprocess == trainer.preprocess

    live = trainer.model.eval()
    batch = next(iter(trainer.loader))
    inputs = normalise(batch.images, trainer.preprocess)  # (U, 3, S, S)
    with torch.no_grad():
        a = live(inputs, batch.captions, image_index=batch.image_index).logits  # (B, T, V)
        b = loaded.model(inputs, batch.captions, image_index=batch.image_index).logits
    assert a.shape == (batch.captions.shape[0], batch.captions.shape[1] - 1, len(trainer.vocab))
    assert torch.equal(a, b)
    for k, v in live.state_dict().items():
        assert torch.equal(v, loaded.model.state_dict()[k]), k
    # the unsure flag's reference: the validation captions of the weights saved, decoded as the trainer validates
    from sat_core.evaluation.confidence import ConfidenceReference, stored_reference
    from sat_core.evaluation.evaluate import decode_split

    decoded, _ = decode_split(loaded, load_karpathy(data, images), "val", trainer.cfg.val)
    expected = ConfidenceReference.from_logprobs([d.hypothesis.logprob for d in decoded])
    kept = stored_reference(loaded.config)
    assert kept.captions == 4 and kept.split == "val" and kept.threshold == pytest.approx(expected.threshold, abs=1e-3)


# ----------------------------------------------------------------------------- exact resume


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_resume_between_epochs_matches_an_uninterrupted_run(world_data, tmp_path, attention):
    data, images = world_data
    # dropout > 0: soft attention draws random numbers too, so a resume that loses the RNG shows
    flags = ("--attention", attention, "--batch-size", "4", "--lr", "3e-3", "--patience", "0", "--seed", "7",
             "--dropout", "0.2")
    assert train.main(train_args(data, images, tmp_path / "a", "--epochs", "2", *flags)) == 0
    assert train.main(train_args(data, images, tmp_path / "b", "--epochs", "1", *flags)) == 0
    assert _state(tmp_path / "b")[0]["epoch"] == 1
    assert not _weights_equal(tmp_path / "a", tmp_path / "b"), "one epoch vs two: the test cannot tell"
    assert train.main(["--resume", str(tmp_path / "b"), "--epochs", "2"]) == 0
    assert_same_run(tmp_path / "a", tmp_path / "b")
    state = _state(tmp_path / "b")[0]
    if attention == "hard":
        assert isinstance(state["baseline"], float), "hard attention must carry its moving baseline"
    else:
        assert state["baseline"] is None
    logs = [[json.loads(x) for x in (tmp_path / r / "log.jsonl").read_text().splitlines()] for r in ("a", "b")]
    assert [x.get("event", "epoch") for x in logs[1]] == ["setup", "epoch", "setup", "epoch"]  # b started twice
    assert [x["epoch"] for x in logs[1] if "val" in x] == [1, 2]
    assert logs[0][2]["loss"] == logs[1][3]["loss"]


def _weights_equal(a: Path, b: Path) -> bool:
    wa, wb = _weights(a), _weights(b)
    return all(torch.equal(wa[k], wb[k]) for k in wa)


def _frozen_encoder(path: Path) -> Path:
    """A small-encoder weights file, as ``sat_core.pretrain`` writes: training then freezes and caches it."""
    from sat_core.config import ModelConfig
    from sat_core.models.encoder import Encoder

    torch.manual_seed(123)
    config = ModelConfig(small_channels=(8, 16, 16), feature_dim=16, vocab_size=10)
    save_tensors_atomic(path, Encoder(config).state_dict())
    return path


@pytest.mark.parametrize("attention, extra", [
    ("soft", ()),
    ("hard", ()),
    ("hard", ("--batching", "image", "--encoder-weights", "FROZEN")),  # cached features, image batches
    ("soft", ("--lr-schedule", "cosine", "--lr-final", "0.1")),  # the resumed steps' rates follow the schedule
], ids=["soft", "hard", "hard-frozen-image-batches", "soft-cosine"])
def test_resume_mid_epoch_after_sigterm_matches_an_uninterrupted_run(world_data, tmp_path, monkeypatch,
                                                                      attention, extra):
    data, images = world_data
    if "FROZEN" in extra:
        extra = tuple(str(_frozen_encoder(tmp_path / "encoder.safetensors")) if e == "FROZEN" else e for e in extra)
    flags = ("--attention", attention, "--batch-size", "4", "--lr", "3e-3", "--patience", "0", "--seed", "1",
             "--epochs", "2", "--dropout", "0.2", *extra)
    assert train.main(train_args(data, images, tmp_path / "a", *flags)) == 0

    # Deliver "SIGTERM" during the 3rd optimizer step of run b: the handler's flag, as a real signal sets it.
    original = training.Trainer._train_step

    def step_then_signal(self, batch):
        out = original(self, batch)
        if self.step == 2:
            self.stop_signal = signal.SIGTERM
        return out

    monkeypatch.setattr(training.Trainer, "_train_step", step_then_signal)
    assert train.main(train_args(data, images, tmp_path / "b", *flags)) == 130
    monkeypatch.setattr(training.Trainer, "_train_step", original)
    state = _state(tmp_path / "b")[0]
    assert (state["epoch"], state["batch_in_epoch"], state["step"]) == (0, 3, 3)
    assert train.main(["--resume", str(tmp_path / "b")]) == 0
    assert_same_run(tmp_path / "a", tmp_path / "b")
    if "--encoder-weights" in extra:  # the pretrained encoder stayed frozen through training and resume
        frozen = read_tensors(tmp_path / "encoder.safetensors")[0]
        weights = _weights(tmp_path / "b")
        assert all(torch.equal(weights["encoder." + k], v) for k, v in frozen.items())


def test_resume_applies_a_new_learning_rate_and_remembers_it(tiny_data, tmp_path):
    """The NaN message says "lower --lr, then --resume": the lower rate must reach the optimizer."""
    data, images = tiny_data
    run = tmp_path / "run"
    assert train.main(train_args(data, images, run, "--epochs", "1", "--lr", "1e-2")) == 0
    trainer = training.Trainer(*train.parse_config(["--resume", str(run), "--lr", "1e-4", "--epochs", "2"]))
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [1e-4]
    assert trainer.optimizer.state, "the optimizer moments were restored"
    trainer.run()
    # A later plain --resume keeps the lowered rate instead of going back to the first one.
    again = training.Trainer(*train.parse_config(["--resume", str(run), "--epochs", "3"]))
    assert [g["lr"] for g in again.optimizer.param_groups] == [1e-4]


def _rates_seen(trainer) -> list[float]:
    """The rate of every optimizer step the trainer takes from now on, filled as it trains."""
    seen, original = [], trainer.optimizer.step

    def step(*args, **kwargs):
        seen.append(trainer.optimizer.param_groups[0]["lr"])
        return original(*args, **kwargs)

    trainer.optimizer.step = step
    return seen


def test_cosine_schedule_sets_every_steps_rate_and_logs_it(world_data, tmp_path):
    data, images = world_data
    trainer = training.Trainer(*train.parse_config(train_args(
        data, images, tmp_path / "run", "--epochs", "2", "--batch-size", "4", "--lr", "4e-3",
        "--lr-schedule", "cosine", "--lr-final", "0.25", "--patience", "0")))
    seen = _rates_seen(trainer)
    trainer.run()
    steps = len(trainer.loader)
    assert len(seen) == 2 * steps > 4
    assert seen == pytest.approx([trainer.cfg.optim.lr_at(i, steps) for i in range(2 * steps)])
    assert seen[0] == pytest.approx(4e-3) and 1e-3 < seen[-1] < 1.1e-3  # near the final 0.25 × 4e-3
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert log[0]["event"] == "setup" and log[0]["images"] == 8 and log[0]["seconds"] >= 0  # 6 train + 2 val
    assert [x["lr"] for x in log[1:]] == pytest.approx([seen[steps - 1], seen[-1]])


def test_a_rate_chosen_for_a_smaller_batch_is_scaled_and_said(world_data, tmp_path, capsys):
    data, images = world_data
    trainer = training.Trainer(*train.parse_config(train_args(
        data, images, tmp_path / "run", "--epochs", "1", "--batch-size", "4", "--lr", "1e-3", "--lr-batch", "1")))
    seen = _rates_seen(trainer)
    trainer.run()
    assert seen and seen == pytest.approx([2e-3] * len(seen))  # √(4 / 1) × 1e-3
    out = capsys.readouterr().out
    assert "at batch 4 the rate peaks at 0.002 (√4/1, the square-root rule)" in out and "--warmup-steps" in out


def test_plateau_cuts_the_rate_after_an_epoch_without_a_better_figure_and_a_resume_keeps_the_cut(
        tiny_data, tmp_path, capsys):
    """A few epochs at 1e-3 leave the tiny model's validation BLEU-4 where the first epoch put it: each epoch
    after the second (warmup first) runs at half the rate of the one before."""
    import csv

    data, images = tiny_data
    run = tmp_path / "run"
    flags = ("--lr-schedule", "plateau", "--plateau-patience", "1", "--patience", "0", "--warmup-steps", "2",
             "--batch-size", "2", "--lr", "1e-3", "--lr-final", "0")
    assert train.main(train_args(data, images, run, "--epochs", "3", *flags)) == 0
    assert "no better validation BLEU-4 for 1 epoch(s): the rate is now 0.0005 (×0.5)" in capsys.readouterr().out
    with open(run / "steps.csv", newline="") as f:
        rows = [(int(r["epoch"]), float(r["lr"])) for r in csv.DictReader(f)]
    by_epoch = {e: sorted({lr for ep, lr in rows if ep == e}) for e in (1, 2, 3)}
    assert by_epoch[1] == pytest.approx([5e-4, 1e-3])  # two steps of warmup: 1/2, then 2/2 of --lr
    assert by_epoch[2] == pytest.approx([1e-3]) and by_epoch[3] == pytest.approx([5e-4])
    assert train.main(["--resume", str(run), "--epochs", "4"]) == 0
    with open(run / "steps.csv", newline="") as f:
        assert {float(r["lr"]) for r in csv.DictReader(f) if r["epoch"] == "4"} == {2.5e-4}


@pytest.mark.parametrize("minutes, planned", [(10, 7.14), (9.45, 7)])
def test_a_time_budget_that_fits_fewer_epochs_ends_the_cosine_schedule_with_them(world_data, tmp_path, monkeypatch,
                                                                                  capsys, minutes, planned):
    """--max-minutes counts from the start (setup included); after each epoch the plan shrinks to the
    epochs that still fit, and the cosine rate reaches its floor at the last of them, not half way."""
    data, images = world_data
    clock = [1000.0]
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock[0])
    trainer = training.Trainer(*train.parse_config(train_args(
        data, images, tmp_path / "run", "--epochs", "10", "--batch-size", "4", "--lr", "4e-3",
        "--lr-schedule", "cosine", "--lr-final", "0.25", "--patience", "0", "--max-minutes", str(minutes))))
    clock[0] += 60  # one minute of setup
    steps, seen = len(trainer.loader), []
    original = trainer.optimizer.step

    def step(*args, **kwargs):  # every optimizer step costs 0.7 min / steps: epochs of 0.7 min + validation
        seen.append(trainer.optimizer.param_groups[0]["lr"])
        clock[0] += 42 / steps
        return original(*args, **kwargs)

    trainer.optimizer.step = step
    trainer.validate = lambda: (clock.__setitem__(0, clock[0] + 30), {"BLEU-4": 0.5})[1]  # 0.5 min each
    trainer.run()
    # 1 min setup + 1.2 min per epoch: after epoch 1 (2.2 min) 7.8 min are left: 6 more epochs (7.2 min), and of
    # the 0.6 min after them 0.5 for the validation, 0.1 for 0.14 of an epoch's steps. Of 9.45: the 6 epochs and
    # 0.05 min, too little for a validation.
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    plan = [x for x in log if x.get("event") == "schedule"]
    assert [(x["epoch"], x["epochs"]) for x in plan] == [(1, planned)]
    assert [x["epoch"] for x in log if "val" in x] == list(range(1, math.ceil(planned) + 1))  # a share validated too
    last = math.floor(planned * steps + 1e-6)
    assert trainer.planned_epochs == planned and len(seen) == last == trainer.step and last >= 7 * steps
    assert seen == pytest.approx([trainer.cfg.optim.lr_at(i, steps, epochs=planned) if i >= steps else
                                  trainer.cfg.optim.lr_at(i, steps) for i in range(last)])
    assert 1e-3 < seen[-1] < 1.05e-3  # at the floor, 0.25 × 4e-3, by the last step that fits
    assert clock[0] - 1000 <= minutes * 60  # inside the budget: 1 + 7 × 1.2 (+ 0.14 × 0.7 + 0.5)
    assert f"--max-minutes {minutes:g} fits {planned} epochs at 1.2 min each, not 10" in capsys.readouterr().out
    assert _state(tmp_path / "run")[0]["planned_epochs"] == planned
    saved = json.loads((tmp_path / "run" / "last" / ckpt.CONFIG_FILE).read_text())["training"]
    assert saved["planned_epochs"] == planned  # what the model card names the cosine schedule by


@pytest.mark.parametrize("done, left_s, planned", [
    (1, 468.0, 7.14),  # 6 epochs of 72 s, then 36 s: 30 for the validation, 6 for 0.14 of the 42 s of steps
    (1, 436.0, 7),  # 4 s after the whole epochs: no time for a validation, no share begun
    (1, 464.5, 7),  # 32.5 s after the whole epochs: a share under a tenth of an epoch (0.05) is not begun
    (3, 10.0, 3),  # nothing fits
    (0, 174.0, 2),  # two epochs, and the validation's 30 s after them
])
def test_the_fitted_plan_is_whole_epochs_then_a_share_in_hundredths(done, left_s, planned):
    from sat_core.training.schedule import fitted_epochs, last_step

    assert fitted_epochs(done, left_s, 72.0, 42.0) == planned
    assert last_step(7.14, 100) == 714 and last_step(4, 7) == 28  # 7.14 × 100 is 713.999… in floating point


def test_a_run_resumed_inside_its_last_share_of_an_epoch_ends_where_the_uninterrupted_one_did(world_data, tmp_path,
                                                                                               monkeypatch):
    data, images = world_data
    clock = [1000.0]
    monkeypatch.setattr(training.time, "perf_counter", lambda: clock[0])
    original = training.Trainer._train_step
    interrupt = [None]

    def step(self, batch):  # every epoch's steps cost one minute on the clock; validation none
        out = original(self, batch)
        clock[0] += 60 / len(self.loader)
        if self.step == interrupt[0]:
            self.stop_signal = signal.SIGTERM
        return out

    monkeypatch.setattr(training.Trainer, "_train_step", step)
    flags = ("--epochs", "10", "--batch-size", "4", "--lr", "4e-3", "--lr-schedule", "cosine", "--patience", "0",
             "--max-minutes", "4.5", "--seed", "1", "--dropout", "0.2")
    assert train.main(train_args(data, images, tmp_path / "a", *flags)) == 0
    state = _state(tmp_path / "a")[0]
    log = [json.loads(x) for x in (tmp_path / "a" / "log.jsonl").read_text().splitlines()]
    steps = next(x["step"] for x in log if x.get("epoch") == 1 and "val" in x)  # an epoch's
    # after epoch 1, 3.5 minutes are left: three more epochs and half of one
    assert state["planned_epochs"] == 4.5 and state["epoch"] == 5 and state["step"] == math.floor(4.5 * steps + 1e-6)

    interrupt[0] = 4 * steps  # during the half epoch's second step (self.step counts the steps before it)
    assert train.main(train_args(data, images, tmp_path / "b", *flags)) == 130
    assert _state(tmp_path / "b")[0]["step"] == 4 * steps + 1
    assert train.main(["--resume", str(tmp_path / "b")]) == 0
    resumed = _state(tmp_path / "b")[0]
    assert (resumed["planned_epochs"], resumed["epoch"], resumed["step"]) == (4.5, 5, state["step"])
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_cached_features_are_what_the_saved_model_computes(tiny_data, tmp_path):
    """A frozen encoder's annotations are cached once; inference must see the same ones (batch-norm in eval)."""
    data, images = tiny_data
    enc = _frozen_encoder(tmp_path / "encoder.safetensors")
    trainer = training.Trainer(*train.parse_config(train_args(data, images, tmp_path / "run", "--epochs", "1",
                                                           "--encoder-weights", str(enc))))
    assert trainer.features is not None, "a frozen encoder should be cached"
    trainer.run()
    loaded = ckpt.load_checkpoint(tmp_path / "run" / "last")
    with torch.no_grad():
        feats = loaded.model.encode(normalise(trainer.store.images, loaded.preprocess)).feats  # (N, L, D)
    assert feats.shape == trainer.features.shape
    torch.testing.assert_close(trainer.features.float(), feats, atol=2e-3, rtol=2e-3)  # fp16 cache
    frozen = read_tensors(enc)[0]
    saved = loaded.model.encoder.state_dict()
    assert all(torch.equal(saved[k], v) for k, v in frozen.items()), "batch-norm statistics were overwritten"


def test_save_every_writes_mid_epoch_state(world_data, tmp_path, monkeypatch):
    data, images = world_data
    seen: list[tuple[int, int]] = []
    original = training.Trainer.save_last

    def spy(self, refresh=True):
        original(self, refresh)
        state = json.loads((self.run_dir / "last" / training.STATE_JSON).read_text())
        seen.append((state["step"], state["batch_in_epoch"]))

    monkeypatch.setattr(training.Trainer, "save_last", spy)
    args = train_args(data, images, tmp_path / "run", "--epochs", "1", "--batch-size", "4", "--save-every", "3")
    assert train.main(args) == 0
    last_step = seen[-1][0]
    assert last_step >= 6, "the dataset should give several batches an epoch"
    assert [s for s, _ in seen[:-1]] == list(range(3, last_step + 1, 3))
    assert all(b == s for s, b in seen[:-1]), "mid-epoch saves record their position in the epoch"
    assert seen[-1][1] == 0, "the epoch-end save starts the next epoch at batch 0"


# ----------------------------------------------------------------------------- bad inputs


def _fails(argv: list[str], capsys) -> str:
    assert train.main(argv) == 2
    return capsys.readouterr().err


def test_missing_dataset_file_is_a_clear_error(tiny_data, tmp_path, capsys):
    _, images = tiny_data
    err = _fails(train_args(tmp_path / "nope.json", images, tmp_path / "run"), capsys)
    assert "nope.json" in err and "does not exist" in err


def test_non_json_dataset_is_a_clear_error(tiny_data, tmp_path, capsys):
    _, images = tiny_data
    bad = tmp_path / "bad.json"
    bad.write_text("this is { not json")
    err = _fails(train_args(bad, images, tmp_path / "run"), capsys)
    assert "bad.json" in err and "not valid JSON" in err


def test_unknown_optimizer_is_refused_before_any_work(tiny_data, tmp_path, capsys):
    data, images = tiny_data
    err = _fails(train_args(data, images, tmp_path / "run", "--optimizer", "sgd"), capsys)
    assert "--optimizer" in err and "adam" in err and "'sgd'" in err
    assert not (tmp_path / "run").exists()


def test_missing_data_flags_are_a_clear_error(tmp_path, capsys):
    err = _fails(["--out", str(tmp_path / "run")], capsys)
    assert "--data" in err and "--images" in err


@pytest.mark.parametrize("content", ["nothing", "config only", "config and weights"])
def test_resume_without_state_is_a_clear_error(tiny_data, tmp_path, capsys, content):
    data, images = tiny_data
    run = tmp_path / "run"
    run.mkdir()
    if content != "nothing":  # a run killed before its first checkpoint, or a plain model folder
        train_cfg = train.parse_config(train_args(data, images, run))[0]
        write_json_atomic(run / "train_config.json", train_cfg.to_dict())
    if content == "config and weights":
        trainer = training.Trainer(*train.parse_config(train_args(data, images, tmp_path / "other")))
        trainer._save_model(run / "last")  # weights and config.json, no resumable state
    err = _fails(["--resume", str(run)], capsys)
    assert "--resume" in err or "resumable" in err
    assert str(run) in err


@pytest.mark.parametrize("attention, flag, expected", [
    ("soft", None, 0.5), ("hard", None, 0.0), ("hard", "--hard-dsa", 0.5), ("hard", "--no-hard-dsa", 0.0)])
def test_the_doubly_stochastic_penalty_is_soft_attentions_unless_hard_dsa_asks(
        tiny_data, tmp_path, monkeypatch, attention, flag, expected):
    data, images = tiny_data
    seen = []

    def recording_loss(*args, dsa_lambda, **kwargs):
        seen.append(dsa_lambda)
        return caption_loss(*args, dsa_lambda=dsa_lambda, **kwargs)

    caption_loss = training.caption_loss
    monkeypatch.setattr(training, "caption_loss", recording_loss)
    extra = ["--attention", attention, "--dsa-lambda", "0.5", "--epochs", "1", *([flag] if flag else [])]
    assert train.main(train_args(data, images, tmp_path / "run", *extra)) == 0
    assert seen and set(seen) == {expected}
    saved = json.loads((tmp_path / "run" / "train_config.json").read_text())
    assert saved["model"]["hard"]["dsa"] is (flag == "--hard-dsa")


def test_a_run_folder_is_never_trained_into_afresh_without_overwrite(tiny_data, tmp_path, capsys):
    """A second run into a finished run's folder is refused and leaves its best/ byte for byte; --overwrite
    starts afresh (the old log kept aside), --resume goes on in the same log."""
    data, images = tiny_data
    run = tmp_path / "run"
    assert train.main(train_args(data, images, run, "--epochs", "2")) == 0
    before = {p.relative_to(run): p.read_bytes() for p in (run / "best").rglob("*") if p.is_file()}
    first = (run / "log.jsonl").read_text()
    capsys.readouterr()
    assert train.main(train_args(data, images, run, "--epochs", "1")) == 2
    err = capsys.readouterr().err
    assert f"{run} holds an earlier run" in err and "--resume" in err and "--overwrite" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    after = {p.relative_to(run): p.read_bytes() for p in (run / "best").rglob("*") if p.is_file()}
    assert before and after == before
    assert (run / "log.jsonl").read_text() == first

    assert train.main(train_args(data, images, run, "--epochs", "1", "--overwrite")) == 0
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert [x.get("epoch") for x in log if "val" in x] == [1]  # not 1, 2, 1
    assert (run / "log.previous.jsonl").read_text() == first
    assert "its log is now log.previous.jsonl" in capsys.readouterr().out
    assert train.main(["--resume", str(run), "--epochs", "2"]) == 0  # a resume goes on in the same log
    log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert [x.get("epoch") for x in log if "val" in x] == [1, 2]
    assert train.main(["--resume", str(run), "--overwrite"]) == 2
    assert "give one of them" in capsys.readouterr().err


def test_train_images_trains_on_the_first_images_and_refuses_more_than_there_are(world_data, tmp_path, capsys):
    data, images = world_data
    code = train.main(train_args(data, images, tmp_path / "run", "--epochs", "1", "--train-images", "4"))
    assert code == 0, capsys.readouterr().err
    assert "train 4 images (20 captions)" in capsys.readouterr().out
    err = _fails(train_args(data, images, tmp_path / "run2", "--train-images", "7"), capsys)
    assert "has 6 train images, fewer than the 7 asked for" in err and "at most 6" in err


def test_attention_targets_put_each_linked_word_on_its_objects_cells(tmp_path):
    """q_t of a linked word lies on the cells its objects cover (share by cover, summing to 1); words
    without links are not supervised."""
    from sat_core.worlds import writer
    from sat_core.config import PreprocessConfig
    from sat_core.data.karpathy import CaptionDataset, build_vocab, load_karpathy
    from sat_core.data.masks import rle_decode
    from sat_core.regions import cell_cover
    from sat_core.training.supervision import AttentionTargets

    path = writer.generate(tmp_path / "scenes", 3, 1, 0, seed=5, workers=1, kind="scenes")
    data = load_karpathy(path, tmp_path / "scenes")
    pre = PreprocessConfig(image_size=224)
    store = ImageStore(data, pre, splits=("train",))
    captions = CaptionDataset(data, "train", build_vocab(data, min_count=1), store)
    targets = AttentionTargets(captions, pre)
    q, linked = targets.batch([0, 1], 12, 196)
    assert q.shape == (2, 12, 196) and linked.shape == (2, 12)
    for b in range(2):
        image, sentence = captions.sentence_of[b]
        record = data.images[image]
        links = {t: ids for t, ids in record.links[sentence] if t < 12}
        assert set(torch.nonzero(linked[b]).squeeze(1).tolist()) == set(links)
        for t, ids in links.items():
            crop = _crop(record, pre)
            cover = sum(cell_cover(rle_decode(o["mask"]), crop, (14, 14)).ravel()
                        for o in record.objects if o["id"] in ids)
            assert torch.allclose(q[b, t], torch.tensor(cover / cover.sum(), dtype=torch.float32), atol=1e-6)
            assert abs(float(q[b, t].sum()) - 1) < 1e-5
        for t in set(range(12)) - set(links):
            assert float(q[b, t].abs().sum()) == 0


def _crop(record, pre):
    from sat_core.data.images import crop_info
    from sat_core.data.masks import rle_decode
    mask = rle_decode(record.objects[0]["mask"])
    return crop_info((mask.shape[1], mask.shape[0]), pre)


def test_attention_lambda_pulls_alpha_onto_the_named_objects(tmp_path, capsys):
    """--attention-lambda on a tiny scenes world: its term (the cross-entropy from the objects' cells to α)
    falls over training and is stored in the run's config; a dataset without links is refused with a message."""
    from sat_core.worlds import writer
    data = writer.generate(tmp_path / "scenes", 12, 2, 0, seed=5, workers=1, kind="scenes")
    flags = ["--epochs", "6", "--lr", "1e-2", "--patience", "0", "--allow-random-encoder"]
    supervised = tmp_path / "run"
    assert train.main(train_args(data, tmp_path / "scenes", supervised, *flags, "--attention-lambda", "1")) == 0
    epochs = [r for r in map(json.loads, (supervised / "log.jsonl").read_text().splitlines()) if "attention" in r]
    assert len(epochs) == 6 and epochs[-1]["attention"] < epochs[0]["attention"] - 0.3
    assert ckpt.load_checkpoint(supervised / "last").optim.attention_lambda == 1
    shapes, _ = make_dataset(tmp_path / "shapes")
    assert train.main(train_args(shapes, tmp_path / "shapes" / "world", tmp_path / "run2", *flags,
                                 "--attention-lambda", "1")) == 2
    assert "--attention-lambda needs every caption's words linked to object masks" in capsys.readouterr().err


def test_init_from_starts_a_hard_model_from_a_soft_ones_weights_and_refuses_what_does_not_fit(
        tiny_data, world_data, tmp_path, capsys):
    data, images = tiny_data
    soft = tmp_path / "soft"
    assert train.main(train_args(data, images, soft, "--epochs", "2", "--lr", "1e-2")) == 0
    capsys.readouterr()
    # --lr 0: the hard model's weights stay what --init-from gave it, so they equal the soft model's.
    hard = tmp_path / "hard"
    code = train.main(train_args(data, images, hard, "--epochs", "1", "--lr", "0", "--attention", "hard",
                                 "--init-from", str(soft / "last")))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "starts from" in out and "decoder.f_beta.weight" in out  # soft's gate β: no place in a hard model
    soft_weights, hard_weights = _weights(soft), _weights(hard)
    assert "decoder.f_beta.weight" in soft_weights and "decoder.f_beta.weight" not in hard_weights
    assert hard_weights.keys() <= soft_weights.keys()
    learnt = [k for k in hard_weights if "running_" not in k and "num_batches" not in k]  # BatchNorm's statistics
    assert len(learnt) > 10                                                              # move in training mode
    differ = [k for k in learnt if not torch.equal(hard_weights[k], soft_weights[k])]
    assert not differ, differ
    assert json.loads((hard / "train_config.json").read_text())["init_from"] == str(soft / "last")

    err = _fails(train_args(data, images, tmp_path / "a", "--init-from", str(tmp_path / "nowhere")), capsys)
    assert "--init-from" in err and "no such checkpoint" in err
    # Another vocabulary: its embeddings would mean other words.
    world, world_images = world_data
    err = _fails(train_args(world, world_images, tmp_path / "b", "--init-from", str(soft / "last")), capsys)
    assert "vocabulary" in err and "--min-word-count" in err
    # Another size of the same vocabulary's model.
    err = _fails(train_args(data, images, tmp_path / "c", "--hidden-dim", "24", "--init-from", str(soft / "last")),
                 capsys)
    assert "do not fit" in err and "decoder" in err and "--no-gate" not in err
    # A soft model with the gate β cannot start from a hard one, which has none: the message says which flag.
    err = _fails(train_args(data, images, tmp_path / "d", "--init-from", str(hard / "last")), capsys)
    assert "decoder.f_beta.weight is missing" in err and "--no-gate" in err


def test_a_run_on_the_disk_cache_ends_as_one_that_read_the_images_into_ram(world_data, tmp_path):
    """What the ship's data/cache promises: the same model, only the setup saved, whether the run writes the
    cache (the first build) or maps what an earlier one wrote."""
    data, images = world_data
    enc = str(_frozen_encoder(tmp_path / "encoder.safetensors"))
    flags = ("--attention", "hard", "--batching", "image", "--encoder-weights", enc, "--batch-size", "4",
             "--epochs", "2", "--seed", "1")
    assert train.main(train_args(data, images, tmp_path / "ram", *flags)) == 0
    for run in ("writes", "maps"):
        assert train.main(train_args(data, images, tmp_path / run, *flags, "--cache", str(tmp_path / "cache"))) == 0
        assert_same_run(tmp_path / "ram", tmp_path / run)
    assert len(list((tmp_path / "cache").glob("images-*/annotations-*.npy"))) == 1  # written once, then mapped
