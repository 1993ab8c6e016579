"""Where the server looks for checkpoints and scenes."""

from __future__ import annotations

import os
from pathlib import Path

from explorer.settings import DEFAULT_CHECKPOINTS, DEFAULT_WORLD, DataSource, parse_settings
from explorer.sidebar import checkpoint_names


def test_defaults_then_environment_then_command_line(tmp_path):
    a, b, c = (tmp_path / n for n in "abc")
    settings = parse_settings([], {})
    assert settings.checkpoint_roots == (DEFAULT_CHECKPOINTS.resolve(),)
    assert settings.source == DataSource(DEFAULT_WORLD / "dataset.json", DEFAULT_WORLD, "test", given=False)
    assert settings.device == "cpu"
    env = {"SAT_CHECKPOINT_DIRS": f"{a}{os.pathsep}{b}", "SAT_WORLD_DIR": str(c)}
    settings = parse_settings(["--checkpoints", str(c), str(a), "--world", str(b)], env)
    assert settings.checkpoint_roots == (DEFAULT_CHECKPOINTS.resolve(), a, b, c)  # no duplicates
    assert settings.source == DataSource(b / "dataset.json", b, "test", given=True)  # the command line wins
    assert parse_settings([], env).source.data == c / "dataset.json"


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
