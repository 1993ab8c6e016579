"""Started with no arguments, the explorer opens on the shipped scenes models and the scenes world."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from PIL import Image

from sat_core.checkpoint import load_checkpoint
from sat_core.decoding import beam_search
from sat_core.data.images import load_image, preprocess

pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from explorer import resources as res
from explorer.settings import DEFAULT_CHECKPOINTS, parse_settings
from tests.golden import why_not

APP = str(Path(__file__).resolve().parents[2] / "explorer" / "app.py")
SCENES_SOFT = DEFAULT_CHECKPOINTS / "scenes_soft"


@pytest.mark.skipif(why_not("scenes_soft") is not None, reason=str(why_not("scenes_soft")))
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
    cfg = dataclasses.replace(loaded.decode_defaults(), beam_size=at.sidebar.slider(key="beam").value,
                              max_len=at.sidebar.slider(key="maxlen").value)
    best = beam_search(loaded.model, tensor[None], loaded.vocab, cfg)[0][0]
    assert any(best.caption in m.value for m in at.markdown), best.caption


SCENES_HARD = DEFAULT_CHECKPOINTS / "scenes_hard"


@pytest.mark.skipif(why_not("scenes_hard") is not None, reason=str(why_not("scenes_hard")))
def test_the_hard_model_decodes_as_evaluated(tmp_path, monkeypatch):
    """The sidebar follows the hard model's beam and length normalisation, the caption shown is plain beam search
    with them, and the beam table lists its hypotheses with their scores, nothing else."""
    from streamlit.testing.v1 import AppTest

    for key in ("SAT_WORLD_DIR", "SAT_CHECKPOINT_DIRS", "SAT_DATA", "SAT_IMAGES", "SAT_SPLIT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    at.sidebar.selectbox(key="ckpt").set_value("scenes_hard").run()
    assert not at.exception, at.exception
    loaded = load_checkpoint(SCENES_HARD)
    sidebar = at.sidebar
    assert (sidebar.slider(key="beam").value, sidebar.slider(key="lnorm").value) == (loaded.beam_size,
                                                                                      loaded.length_norm)
    gallery = res.load_gallery.__wrapped__(parse_settings([], {}).source)
    tensor, _ = preprocess(load_image(gallery.by_id[sidebar.selectbox(key="scene").value].path), loaded.preprocess)
    cfg = dataclasses.replace(loaded.decode_defaults(), max_len=sidebar.slider(key="maxlen").value)
    hyps = beam_search(loaded.model, tensor[None], loaded.vocab, cfg)[0]
    assert any(hyps[0].caption in m.value for m in at.markdown), hyps[0].caption
    table = at.dataframe[0].value
    assert list(table.columns) == ["rank", "caption", "log p", "score", "words", "finished"]
    # the table shows each caption's score read back in fp32 (explorer.guards.read_back); beam search picked the
    # captions in the checkpoint's own precision (bf16 here), whose scores differ in the third decimal
    assert list(table["caption"]) == [h.caption for h in hyps]
    assert list(table["score"]) == pytest.approx([round(h.score, 3) for h in hyps], abs=5e-3)
