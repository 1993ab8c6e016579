"""Training over several processes as users expect: a global --batch-size, the same losses as one process, resumes
refused with another number of processes, one console, and a clean Ctrl-C on every process (gloo on CPU)."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from sat_core import train
from sat_core.data.karpathy import BucketBatchSampler
from sat_core.errors import SatError
from sat_core.training import distributed
from sat_core.training.state import STATE_JSON
from tests.fixtures_world import REPO_ROOT, python_module, subprocess_env, train_args
from tests.test_train import _frozen_encoder
from tests.test_train_reliability import _free_port

# Global batches of 4 captions over the world's 8 images (5 captions each); fp32 so that the two layouts round
# alike; no dropout (TINY_MODEL), so the processes' different random streams do not matter.
FLAGS = ("--batch-size", "4", "--lr", "3e-3", "--patience", "0", "--seed", "5", "--precision", "fp32")


@pytest.fixture(scope="module")
def world_data(tmp_path_factory) -> tuple[Path, Path]:
    from sat_core.worlds.writer import generate

    root = tmp_path_factory.mktemp("world")
    return generate(root, 8, 2, 0, seed=11, workers=1), root


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the OMP_NUM_THREADS=1 children
    yield
    torch.set_num_threads(threads)


def _gloo():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available in this torch build")


def _torchrun(*args: str) -> list[str]:
    return python_module("torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2", "--master_addr",
                         "127.0.0.1", "--master_port", str(_free_port()), "-m", "sat_core.train", *args)


def _steps(run: Path) -> list[dict[str, str]]:
    with open(run / "steps.csv", newline="") as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------- the global batch, unit by unit


def test_every_process_takes_its_share_of_each_global_batch_and_a_filler_where_none_is_left():
    lengths = [5] * 9 + [7] * 3 + [9]  # buckets of 9, 3 and 1 captions
    whole = BucketBatchSampler(lengths, 4, seed=2)
    shards = [distributed.GlobalBatches(BucketBatchSampler(lengths, 4, seed=2), r, 2) for r in range(2)]
    batches = whole.batches()
    assert all(len(s) == len(whole) == len(batches) for s in shards)  # every process runs every step
    fillers = [s.fillers() for s in shards]
    for i, (a, b, batch) in enumerate(zip(*(list(s) for s in shards), batches)):
        if len(batch) == 1:  # the one-caption tail: one process holds it again, at weight 0
            assert a == b == batch and (i in fillers[0]) != (i in fillers[1])
        else:
            assert a + b == batch and abs(len(a) - len(b)) <= 1
    assert sum(map(len, fillers)) == sum(len(b) == 1 for b in batches) == 2  # the tails of 9 and of 1


def test_the_global_batch_must_split_evenly_and_each_share_is_said():
    assert distributed.per_rank_batch(64, 4) == 16
    with pytest.raises(SatError, match=r"--batch-size 9 is the global batch .* 2 processes.* give 8 or 10"):
        distributed.per_rank_batch(9, 2)


def test_the_resume_hint_names_the_launcher_that_was_used(monkeypatch, tmp_path):
    assert distributed.resume_hint(tmp_path) == f"python -m sat_core.train --resume {tmp_path}"
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert distributed.resume_hint(tmp_path) == (f"torchrun --nnodes 2 --nproc_per_node 4 -m sat_core.train "
                                                 f"--resume {tmp_path}")


def test_a_run_resumed_with_another_number_of_processes_is_refused(world_data, tmp_path, monkeypatch, capsys):
    data, images = world_data
    run = tmp_path / "run"
    assert train.main(train_args(data, images, run, "--epochs", "1", "--log-every", "0", *FLAGS)) == 0
    assert json.loads((run / "last" / STATE_JSON).read_text())["world"] == 1
    capsys.readouterr()
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun --nproc_per_node 2 would: refused before joining a group
    assert train.main(["--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "trained by one process and this is 2 processes" in err
    assert f"python -m sat_core.train --resume {run}" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- two real processes


@pytest.mark.slow
def test_two_processes_give_one_process_s_losses_over_the_same_global_batch(world_data, tmp_path, capsys):
    """gloo on CPU: each step's loss terms (steps.csv) and the epoch's are those of one process with the same
    --batch-size, to float rounding; the two processes map the on-disk cache the one process wrote (images and
    annotations); only the first process writes; resuming it in one process is refused.

    The encoder is a frozen (pretrained) one, as in the paper: a small encoder trained from scratch normalises its
    batch-norm over each process's share of the batch, as DDP does without SyncBatchNorm, and would differ."""
    _gloo()
    data, images = world_data
    one, two = tmp_path / "one", tmp_path / "two"
    flags = ("--epochs", "1", "--encoder-weights", str(_frozen_encoder(tmp_path / "encoder.safetensors")),
             "--cache", str(tmp_path / "cache"), *FLAGS)
    assert train.main(train_args(data, images, one, *flags)) == 0
    assert "cache: writing the encoder's annotations" in capsys.readouterr().out
    proc = subprocess.run(_torchrun(*train_args(data, images, two, *flags)), cwd=REPO_ROOT,
                          env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("batch: 4 captions per optimizer step over 2 processes, 2 each") == 1
    assert proc.stdout.count("epoch 1: loss") == 1 and proc.stdout.count("data: ") == 1, "rank 0 speaks alone"
    assert "memory-mapped from" in proc.stdout and "cache: writing" not in proc.stdout + proc.stderr
    assert "cache: decoding" not in proc.stdout + proc.stderr, "the 2 processes read what one process wrote"

    a, b = _steps(one), _steps(two)
    assert len(a) == len(b) == json.loads((two / "last" / STATE_JSON).read_text())["step"] >= 10
    for x, y in zip(a, b):
        assert x["captions"] == y["captions"] and x["lr"] == y["lr"]
        for term in ("loss", "nll", "dsa"):
            assert float(y[term]) == pytest.approx(float(x[term]), rel=1e-5, abs=1e-6), (x["step"], term)
    epoch = [[json.loads(line) for line in (r / "log.jsonl").read_text().splitlines() if '"val"' in line][0]
             for r in (one, two)]
    assert epoch[1]["loss"] == pytest.approx(epoch[0]["loss"], rel=1e-5)  # measured: 2.5e-7 at most

    capsys.readouterr()
    assert train.main(["--resume", str(two), "--epochs", "2"]) == 2  # one process for a 2-process run
    err = capsys.readouterr().err
    assert "trained by 2 processes and this is one process" in err
    assert f"torchrun --nproc_per_node 2 -m sat_core.train --resume {two}" in err


def _rank(rank: int, port: int, args: list[str]) -> subprocess.Popen:
    """One process of a 2-process run, in the environment torchrun gives its workers."""
    env = subprocess_env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="test")
    return subprocess.Popen(python_module("sat_core.train", *args), cwd=REPO_ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_ctrl_c_under_torchrun_saves_and_exits_130_on_every_process_without_a_traceback(world_data, tmp_path):
    """SIGINT reaching one process stops both after the same step; rank 0 alone names the torchrun command."""
    _gloo()
    data, images = world_data
    run = tmp_path / "run"
    args = train_args(data, images, run, "--epochs", "1000", "--save-every", "1", "--log-every", "0", *FLAGS)
    port = _free_port()
    procs = [_rank(r, port, args) for r in range(2)]
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if json.loads((run / "last" / STATE_JSON).read_text())["step"] >= 2:
                    break
            except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
                pass
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        os.kill(procs[1].pid, signal.SIGINT)  # one process only: the other must stop with it
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 130, err[-2000:]
        assert "Traceback" not in err, err[-2000:]
    hint = f"Continue with: torchrun --nproc_per_node 2 -m sat_core.train --resume {run}"
    assert hint in outs[0][1] and "Continue with" not in outs[1][1]
    state = json.loads((run / "last" / STATE_JSON).read_text())
    assert state["world"] == 2 and state["step"] >= 2
