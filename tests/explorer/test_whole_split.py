"""Error analysis on the whole split: with no data folder the explorer draws the shipped models' test split and
opens on their stored records; a row opens Step through at its first wrong word with its error labels."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from explorer import resources as res
from explorer.settings import DEFAULT_CHECKPOINTS
from tests.explorer.conftest import APP
from tests.explorer.test_pages import open_page


def _loadable(name: str) -> bool:
    from sat_core.checkpoint import load_checkpoint
    from sat_core.errors import SatError

    try:
        load_checkpoint(DEFAULT_CHECKPOINTS / name)
    except (SatError, OSError):
        return False
    return (DEFAULT_CHECKPOINTS / name / res.EVAL_RECORDS_FILE).is_file()


# Whatever checkpoints ship: every one that loads and carries its records, its world read from its config.
SHIPPED = [p.name for p in sorted(DEFAULT_CHECKPOINTS.glob("*")) if (p / "config.json").is_file()]


def _world(name: str) -> str:
    config = json.loads((DEFAULT_CHECKPOINTS / name / "config.json").read_text())
    return "scenes" if "scenes" in config["training"]["train_config"]["data"]["dataset"] else "shapes"


@pytest.fixture
def no_data_folder(tmp_path, monkeypatch):
    """A fresh clone: no data/ folder, an empty per-machine cache, the repo's checkpoints."""
    from explorer import settings

    for kind in list(settings.DEFAULT_WORLDS):
        monkeypatch.setitem(settings.DEFAULT_WORLDS, kind, tmp_path / f"no-{kind}-here")
    for key in ("SAT_WORLD_DIR", "SAT_CHECKPOINT_DIRS", "SAT_DATA", "SAT_IMAGES", "SAT_SPLIT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    res.load_gallery.clear()
    yield tmp_path
    res.load_gallery.clear()


def _no_decoding(*args, **kwargs):
    raise AssertionError("error analysis decoded the split instead of reading the records stored with the checkpoint")


@pytest.mark.parametrize("name", SHIPPED)
def test_error_analysis_opens_on_the_stored_records_of_the_whole_test_split(name, no_data_folder, monkeypatch):
    from streamlit.testing.v1 import AppTest

    if not _loadable(name):
        pytest.skip(f"{name} does not load here (or carries no {res.EVAL_RECORDS_FILE})")
    stored = json.loads((DEFAULT_CHECKPOINTS / name / res.EVAL_RECORDS_FILE).read_text())["records"]
    assert len(stored) >= 500
    at = AppTest.from_file(APP, default_timeout=600)
    at.query_params = {"ckpt": name}
    at.run()  # the first start draws the world's test split
    assert not at.exception, at.exception
    at.switch_page("views/errors.py")
    monkeypatch.setattr(res, "compute_records", _no_decoding)  # the first open reads, it decodes nothing
    at.run()
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert len(table) == len(stored) and set(table["image_id"]) == {r["image_id"] for r in stored}
    assert any("stored with the checkpoint" in c.value for c in at.caption)
    by_id = {r["image_id"]: r for r in stored}
    row = table.iloc[0]
    assert row["caption"] == by_id[int(row["image_id"])]["caption"]
    # the gallery holds the very scenes the records describe: their references match
    gallery = res.load_gallery.__wrapped__(at.session_state["_ctx"].source)
    assert f"{len(stored)} generated test scenes of the {_world(name)} world" in gallery.note
    some = int(row["image_id"])
    assert [" ".join(s) for s in gallery.by_id[some].sentences] == by_id[some]["references"]


def test_a_row_opens_step_through_at_its_first_wrong_word_with_its_labels(explorer_env):
    at = open_page("errors")
    table = at.dataframe[0].value
    wrong = table[table["first wrong word"] != ""]
    assert len(wrong), "the tiny model makes no wrong word on any scene"
    row = wrong.iloc[0]
    labels = row["errors"].split(", ")
    at.multiselect(key="err_labels").set_value([labels[0]]).run()
    at.selectbox(key="err_open").set_value(int(row["image_id"]))
    at.button(key="err_open_button").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Step through"
    n, word = row["first wrong word"].split(": ", 1)
    assert any(m.value.startswith(f"**Step {n}:**") and word in m.value for m in at.markdown)
    origin = next(w.value for w in at.warning if w.value.startswith("**From error analysis**"))
    assert all(f"**{label}**" in origin for label in labels)
    assert f"filtered on {labels[0]}" in origin and f"first wrong word, '{word}' (word {n})" in origin
    at.switch_page("views/step.py")  # AppTest reruns the page it was given: follow the app's switch
    at.button(key="step_next").click().run()  # the label stays while the user steps on from there
    assert any(w.value.startswith("**From error analysis**") for w in at.warning)
    at.sidebar.selectbox(key="scene").set_value(next(i for i in table["image_id"] if i != row["image_id"])).run()
    assert not any(w.value.startswith("**From error analysis**") for w in at.warning)  # another image: gone


def test_the_gallery_is_pictures_and_a_click_shows_one(explorer_env):
    at = open_page("caption")
    ids = explorer_env.test_ids()
    buttons = [b for b in at.sidebar.button if b.key and b.key.startswith("thumb_")]
    assert [int(b.key.removeprefix("thumb_")) for b in buttons] == ids[:6]  # the first page of the split
    assert len(at.sidebar.get("image")) >= 6  # a picture above each button
    at.sidebar.button(key=f"thumb_{ids[4]}").click().run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="scene").value == ids[4]
    assert at.session_state["_ctx"].image.record.id == ids[4]  # the page shows that scene


def test_curated_scenes_come_from_the_stored_records_with_why():
    name = next((n for n in SHIPPED if _loadable(n)), None)
    if name is None:
        pytest.skip("no shipped checkpoint loads here")
    records = json.loads((DEFAULT_CHECKPOINTS / name / res.EVAL_RECORDS_FILE).read_text())["records"]
    picks = res.curated(records)
    assert 2 <= len(picks) <= 4 and len({i for i, _ in picks}) == len(picks)
    by_id = {r["image_id"]: r for r in records}
    whys = dict((why, i) for i, why in picks)
    if "looks at what it names" in whys:
        chosen = by_id[whys["looks at what it names"]]["attention_correctness"]
        assert chosen == max(r["attention_correctness"] for r in records
                             if r.get("attention_correctness") is not None and (r.get("n_objects") or 0) >= 2)
    if "a mistake to step through" in whys:
        assert by_id[whys["a mistake to step through"]]["first_error"] is not None
