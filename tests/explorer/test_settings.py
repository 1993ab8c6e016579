"""Where the server looks for checkpoints and scenes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from explorer.settings import DEFAULT_CHECKPOINTS, DEFAULT_WORLDS, DataSource, parse_settings, source_for
from explorer.sidebar import checkpoint_names


def test_defaults_then_environment_then_command_line(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    settings = parse_settings([], {})
    assert settings.checkpoint_roots == (DEFAULT_CHECKPOINTS.resolve(),)
    scenes = DEFAULT_WORLDS["scenes"]  # the explorer opens on the scenes world
    assert settings.source == DataSource(scenes / "dataset.json", scenes, "test", given=False, kind="scenes")
    assert settings.device == "cpu"
    env = {"SAT_CHECKPOINT_DIRS": f"{a}{os.pathsep}{b}", "SAT_WORLD_DIR": str(c)}
    settings = parse_settings(["--checkpoints", str(c), str(a), "--world", str(b)], env)
    assert settings.checkpoint_roots == (DEFAULT_CHECKPOINTS.resolve(), a, b, c)  # no duplicates
    assert settings.source == DataSource(b / "dataset.json", b, "test", given=True)  # the command line wins
    assert parse_settings([], env).source.data == c / "dataset.json"


def test_the_default_gallery_follows_the_checkpoints_world_but_a_named_dataset_stays(tmp_path):
    default = parse_settings(["--split", "val"], {}).source
    shapes = source_for(default, "small")  # the shapes models' small CNN
    assert (shapes.kind, shapes.data, shapes.split) == ("shapes", DEFAULT_WORLDS["shapes"] / "dataset.json", "val")
    for encoder in ("efficientnet_lite0", "resnet101", None):  # ImageNet encoders, or no checkpoint loaded
        assert source_for(default, encoder) == default
        assert source_for(shapes, encoder).data == DEFAULT_WORLDS["scenes"] / "dataset.json"
    named = parse_settings(["--data", str(tmp_path / "d.json")], {}).source
    assert source_for(named, "small") == named and source_for(named, "efficientnet_lite0") == named


def test_any_karpathy_dataset_by_data_images_and_split(tmp_path):
    json_path, images = tmp_path / "dataset_flickr8k.json", tmp_path / "Flicker8k_Dataset"
    settings = parse_settings(["--data", str(json_path), "--images", str(images), "--split", "val"], {})
    assert settings.source == DataSource(json_path, images, "val", given=True)
    env = {"SAT_DATA": str(json_path), "SAT_IMAGES": str(images), "SAT_SPLIT": "train", "SAT_WORLD_DIR": "/x"}
    assert parse_settings([], env).source == DataSource(json_path, images, "train", given=True)  # --data beats --world
    assert parse_settings(["--data", str(json_path)], {}).source.images == tmp_path  # the JSON's folder
    assert parse_settings(["--world", str(json_path)], {}).source.data == json_path  # --world at the JSON itself


def test_checkpoint_names_are_short_and_unique(tmp_path):
    roots = (tmp_path / "one", tmp_path / "two")
    paths = [str(roots[0] / "soft"), str(roots[1] / "soft"), str(roots[1] / "runs" / "best")]
    names = checkpoint_names(paths, roots)
    assert list(names) == ["soft", "two/soft", "runs/best"]
    assert names["two/soft"] == paths[1]
    assert Path(names["runs/best"]).name == "best"


def test_with_no_dataset_the_gallery_is_generated_scenes_of_the_checkpoints_world(tmp_path, monkeypatch):
    from explorer import resources as res
    from explorer.settings import default_source

    monkeypatch.setattr(Path, "home", lambda: tmp_path)  # the per-machine cache the gallery is made in
    # the shipped world's test split is 500 scenes after 24400 others; a short one here, numbered the same way
    monkeypatch.setattr(res, "world_test_split", lambda kind: (6, 24400, 0))
    missing = DataSource(tmp_path / "nowhere" / "dataset.json", tmp_path / "nowhere", "test", False, "scenes")
    gallery = res.load_gallery.__wrapped__(missing)
    assert len(gallery.ids) == 6 and "6 generated test scenes of the scenes world" in gallery.note
    assert gallery.ids == list(range(24400, 24406)) and gallery.name(24400) == "024400.png"
    first = gallery.by_id[gallery.ids[0]]
    assert first.path.is_relative_to(tmp_path / ".cache" / "sat-explorer")
    from PIL import Image

    assert Image.open(first.path).size == (224, 224)  # scenes, not the 112 px shapes
    assert default_source("shapes").data.parent.name == "world"


def test_a_checkpoint_that_fails_to_load_gives_one_message_and_the_app_goes_on(explorer_env, tmp_path, monkeypatch):
    """A folder that looks like a checkpoint but cannot be loaded: never the default; chosen, one clear message on
    every page; another checkpoint afterwards works."""
    import os
    import shutil

    from tests.explorer.conftest import new_app

    broken = tmp_path / "roots" / "a-broken-soft"  # sorts first
    shutil.copytree(explorer_env.roots / "tiny-soft", broken)
    (broken / "model.safetensors").write_bytes(b"not weights")
    monkeypatch.setenv("SAT_CHECKPOINT_DIRS", os.pathsep.join([str(tmp_path / "roots"), str(explorer_env.roots)]))
    at = new_app()
    at.query_params = {}
    at.run()
    assert not at.exception, at.exception
    assert at.sidebar.selectbox(key="ckpt").value != "a-broken-soft"  # the default is one that loads
    at.sidebar.selectbox(key="ckpt").set_value("a-broken-soft").run()
    for page in ("caption", "step", "score", "errors", "teach", "present"):
        at.switch_page(f"views/{page}.py").run()
        assert not at.exception, (page, at.exception)
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and "a-broken-soft" in errors[0], (page, errors)
    at.sidebar.selectbox(key="ckpt").set_value("tiny-soft").run()
    at.switch_page("views/caption.py").run()
    assert not at.exception and not at.error and any(m.label == "log p(caption)" for m in at.metric)
