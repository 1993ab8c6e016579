"""Started with no arguments, the explorer opens on the shipped scenes models and the scenes world."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from PIL import Image

from sat_core.checkpoint import load_checkpoint
from sat_core.decoding import beam_search
from sat_core.images import load_image, preprocess

from explorer import resources as res
from explorer.settings import DEFAULT_CHECKPOINTS, parse_settings

APP = str(Path(__file__).resolve().parents[2] / "explorer" / "app.py")
SCENES_SOFT = DEFAULT_CHECKPOINTS / "scenes_soft"


@pytest.mark.skipif(not (SCENES_SOFT / "config.json").is_file(), reason="checkpoints/scenes_soft is not shipped")
@pytest.mark.parametrize("repo_has_scenes", [True, False])
def test_no_arguments_open_the_scenes_soft_model_on_a_scenes_gallery(repo_has_scenes, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from explorer import settings

    if not repo_has_scenes:  # a fresh clone: no data/scenes, so the app generates a small gallery
        monkeypatch.setitem(settings.DEFAULT_WORLDS, "scenes", tmp_path / "no-scenes-here")

    for key in ("SAT_WORLD_DIR", "SAT_CHECKPOINT_DIRS", "SAT_DATA", "SAT_IMAGES", "SAT_SPLIT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # a gallery generated here when the repo has no data/scenes
    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="ckpt").value == "scenes_soft"
    scene = at.sidebar.selectbox(key="scene")
    assert ("generated test scenes of the scenes world" in scene.help) == (not repo_has_scenes
                                                                           or not settings.DEFAULT_WORLDS["scenes"].is_dir())
    # the caption shown is the scenes model's beam search on the chosen 224 px scene
    gallery = res.load_gallery.__wrapped__(parse_settings([], {}).source)  # the same gallery, outside the app
    path = gallery.by_id[scene.value].path
    assert Image.open(path).size == (224, 224)
    loaded = load_checkpoint(SCENES_SOFT)
    tensor, _ = preprocess(load_image(path), loaded.preprocess)
    lnorm = at.sidebar.slider(key="lnorm").value
    assert lnorm == loaded.length_norm  # the checkpoint's own setting
    assert at.sidebar.checkbox(key="distinct").value == loaded.distinct_content  # and its other settings
    assert at.sidebar.checkbox(key="kinds").value == loaded.one_mention_per_kind
    assert at.sidebar.checkbox(key="relations").value == (loaded.relation_prior > 0)
    cfg = dataclasses.replace(loaded.decode_defaults(), beam_size=at.sidebar.slider(key="beam").value,
                              max_len=at.sidebar.slider(key="maxlen").value)
    best = beam_search(loaded.model, tensor[None], loaded.vocab, cfg)[0][0]
    assert any(best.caption in m.value for m in at.markdown), best.caption


SCENES_HARD = DEFAULT_CHECKPOINTS / "scenes_hard"


@pytest.mark.skipif(not (SCENES_HARD / "config.json").is_file(), reason="checkpoints/scenes_hard is not shipped")
def test_the_hard_model_is_ranked_by_its_relation_judge_as_evaluated(tmp_path, monkeypatch):
    """The sidebar follows the hard model's decoding — distinct contents, raw sums, the count head and the relation
    judge — the caption shown is that decoding's, and the beam table names the prior that ranked it."""
    from streamlit.testing.v1 import AppTest

    for key in ("SAT_WORLD_DIR", "SAT_CHECKPOINT_DIRS", "SAT_DATA", "SAT_IMAGES", "SAT_SPLIT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.sidebar.selectbox(key="ckpt").set_value("scenes_hard").run()
    assert not at.exception, at.exception
    loaded = load_checkpoint(SCENES_HARD)
    assert loaded.relation_prior > 0 and loaded.count_prior > 0 and loaded.distinct_content
    sidebar = at.sidebar
    assert sidebar.checkbox(key="relations").value is True and not sidebar.checkbox(key="relations").disabled
    assert sidebar.slider(key="lnorm").value == loaded.length_norm == 0.0
    gallery = res.load_gallery.__wrapped__(parse_settings([], {}).source)
    tensor, _ = preprocess(load_image(gallery.by_id[sidebar.selectbox(key="scene").value].path), loaded.preprocess)
    hyps = beam_search(loaded.model, tensor[None], loaded.vocab, loaded.decode_defaults())[0]
    assert any(hyps[0].caption in m.value for m in at.markdown), hyps[0].caption
    table = at.dataframe[0].value
    assert list(table["prior"]) == pytest.approx([round(h.prior, 3) for h in hyps], abs=1e-3)
    sidebar.checkbox(key="relations").uncheck().run()
    assert "count prior" in at.dataframe[0].value.columns and "prior" not in at.dataframe[0].value.columns
