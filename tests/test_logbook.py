"""Per-step logging: RUN/steps.csv has a row per optimizer step, RUN/tb/ TensorBoard scalars per step, validation
figures and sample captions with their α; a resume drops what it trains again; --log-every 0 writes neither."""

from __future__ import annotations

import csv
import json

import pytest

from sat_core import train
from sat_core.errors import SatError
from sat_core.training import logbook
from sat_core.training.state import STATE_JSON
from tests.fixtures_world import make_dataset, train_args


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("logbook"), [["a red circle", "a red circle again"],
                                                            ["two blue squares", "blue squares"],
                                                            "a green star left of a circle", "a yellow triangle"])


def _rows(run):
    with open(run / logbook.STEPS_CSV, newline="") as f:
        return list(csv.DictReader(f))


def _events(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / logbook.TB_DIR), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    return events


def test_every_step_has_a_csv_row_and_tensorboard_scalars_and_every_validation_its_figures(tiny_data, tmp_path):
    data, images = tiny_data
    run = tmp_path / "run"
    assert train.main(train_args(data, images, run, "--epochs", "2", "--batch-size", "2")) == 0
    steps = json.loads((run / "last" / STATE_JSON).read_text())["step"]
    rows = _rows(run)
    assert steps >= 4 and [int(r["step"]) for r in rows] == list(range(1, steps + 1))
    assert {r["epoch"] for r in rows} == {"1", "2"}
    for r in rows:
        assert float(r["loss"]) == pytest.approx(float(r["nll"]) + float(r["dsa"]), abs=2e-6)  # per word, λ = 1
        assert float(r["lr"]) == 1e-3 and int(r["captions"]) >= 1 and float(r["captions_per_s"]) > 0

    events = _events(run)
    tags = events.Tags()
    assert {"train/loss", "train/nll", "train/dsa", "train/lr", "train/captions_per_s", "val/BLEU-4",
            "val/CIDEr"} <= set(tags["scalars"])
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, steps + 1))
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx([float(r["loss"]) for r in rows], abs=1e-5)
    assert len(events.Scalars("val/CIDEr")) == 2  # one a validation
    assert {"val/sample_0", "val/sample_1"} <= set(tags["images"])
    figure = events.Images("val/sample_0")[-1]
    assert figure.width > figure.height > 0  # the image, then a panel a word


def test_a_resume_drops_the_rows_it_trains_again_and_log_every_0_writes_nothing(tiny_data, tmp_path):
    data, images = tiny_data
    run = tmp_path / "run"
    assert train.main(train_args(data, images, run, "--epochs", "1", "--batch-size", "2")) == 0
    steps = len(_rows(run))
    with open(run / logbook.STEPS_CSV, "a", newline="") as f:  # rows of a crashed run that went past last/
        csv.writer(f).writerow([steps + 1, 2, 0.001, 2, 10.0, 9.9, 9.9, 0.0, 0.0, 0.0])
    assert train.main(["--resume", str(run), "--epochs", "2"]) == 0
    rows = _rows(run)
    assert [int(r["step"]) for r in rows] == list(range(1, len(rows) + 1)) and len(rows) > steps
    assert all(float(r["loss"]) != 9.9 for r in rows)

    quiet = tmp_path / "quiet"
    assert train.main(train_args(data, images, quiet, "--epochs", "1", "--log-every", "0")) == 0
    assert not (quiet / logbook.STEPS_CSV).exists() and not (quiet / logbook.TB_DIR).exists()


def test_a_missing_tensorboard_is_refused_with_what_to_do(monkeypatch):
    monkeypatch.setattr(logbook.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SatError, match=r"pip install tensorboard==2\.21\.0.*--log-every 0"):
        logbook.check_available()
