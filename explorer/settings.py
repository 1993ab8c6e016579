"""Where the server looks for checkpoints and for its dataset: repo defaults, command line, environment.

    streamlit run explorer/app.py -- --checkpoints DIR [DIR …] --data DATASET.json --images DIR [--split test]
    streamlit run explorer/app.py -- --world DIR          # a world folder: DIR/dataset.json + DIR's images
    SAT_CHECKPOINT_DIRS=DIR1:DIR2 SAT_DATA=… SAT_IMAGES=… SAT_SPLIT=… streamlit run explorer/app.py

``--data`` takes any Karpathy-format split file (dataset_flickr8k.json, dataset_coco.json, the worlds'
dataset.json); ``--images`` is the folder its ``filepath``/``filename`` entries are relative to (the
JSON's folder when left out). With no dataset named, the app uses the repo's ``data/world`` when it
world of the selected checkpoint (``data/scenes`` for scenes models and any ImageNet encoder,
``data/world`` for the shapes models) when it exists and otherwise generates a small gallery of that
world; a dataset that was named but cannot be read is reported, never replaced by another.

Only folders named here and the shipped checkpoints (the repo's ``checkpoints/``, or their copy inside
the installed package) may be loaded from; a path typed into the app outside them is refused
(sat_core.paths.resolve_checkpoint_path).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sat_core.paths import checkpoint_dirs, shipped_checkpoints

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CHECKPOINTS = shipped_checkpoints()  # the repository's checkpoints/, or their copy in the installed package
DEFAULT_WORLDS = {"scenes": REPO_ROOT / "data" / "scenes", "shapes": REPO_ROOT / "data" / "world"}
DEFAULT_KIND = "scenes"  # the explorer opens on the scenes world


@dataclass(frozen=True)
class DataSource:
    """The dataset the gallery, the references and error analysis read (one source for every page)."""

    data: Path  # Karpathy-format JSON
    images: Path  # folder the entries' filepath/filename are relative to
    split: str = "test"
    given: bool = False  # named by the user: problems are reported, never replaced by generated scenes
    kind: str = DEFAULT_KIND  # the embedded world of a default source ("scenes" or "shapes")

    @property
    def label(self) -> str:
        return f"the {self.split} split of {self.data}"


@dataclass(frozen=True)
class ServerSettings:
    checkpoint_roots: tuple[Path, ...]
    source: DataSource
    device: str = "cpu"


def _path(text: str) -> Path:
    return Path(text).expanduser().resolve()


def data_source(args: argparse.Namespace, environ: Mapping[str, str]) -> DataSource:
    """--data/--images/--split (or SAT_DATA/SAT_IMAGES/SAT_SPLIT), --world DIR, else the repo's world."""
    split = args.split or environ.get("SAT_SPLIT") or "test"
    data = args.data or environ.get("SAT_DATA")
    world = args.world or environ.get("SAT_WORLD_DIR")
    if data:
        json_path = _path(data)
        images = args.images or environ.get("SAT_IMAGES")
        return DataSource(json_path, _path(images) if images else json_path.parent, split, True)
    if world:
        folder = _path(world)
        if folder.suffix == ".json":  # --world pointed at the JSON itself
            return DataSource(folder, folder.parent, split, True)
        return DataSource(folder / "dataset.json", folder, split, True)
    return default_source(DEFAULT_KIND, split)


def default_source(kind: str, split: str = "test") -> DataSource:
    folder = DEFAULT_WORLDS[kind]
    return DataSource(folder / "dataset.json", folder, split, False, kind)


def world_of(encoder: str) -> str:
    """The embedded world a checkpoint belongs to: the small CNN is the shapes world's; a real ImageNet
    encoder (EfficientNet-Lite0, ResNet, VGG) sees the scenes world, the one that looks like photos."""
    return "shapes" if encoder == "small" else "scenes"


def source_for(source: DataSource, encoder: str | None) -> DataSource:
    """The dataset the pages read for a checkpoint: the user's when one was named, else the
    checkpoint's own embedded world (no checkpoint loaded: the default world)."""
    if source.given:
        return source
    kind = world_of(encoder) if encoder else DEFAULT_KIND
    return source if kind == source.kind else default_source(kind, source.split)


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> ServerSettings:
    """Combine the defaults, ``argv`` (the app's own arguments, after ``--``) and the environment."""
    parser = argparse.ArgumentParser(prog="streamlit run explorer/app.py --", add_help=False)
    parser.add_argument("--checkpoints", nargs="*", default=[])
    parser.add_argument("--data", default=None)
    parser.add_argument("--images", default=None)
    parser.add_argument("--split", default=None)
    parser.add_argument("--world", default=None)
    parser.add_argument("--device", default=None)
    args, _ = parser.parse_known_args(list(argv))
    roots: list[Path] = []
    for folder in [DEFAULT_CHECKPOINTS, *checkpoint_dirs(environ), *map(Path, args.checkpoints)]:
        resolved = folder.expanduser().resolve()
        if resolved not in roots:
            roots.append(resolved)
    device = args.device or environ.get("SAT_DEVICE") or "cpu"
    return ServerSettings(tuple(roots), data_source(args, environ), device)


def server_settings() -> ServerSettings:
    """Settings of this server; command-line arguments count only under ``streamlit run … app.py``."""
    argv = sys.argv[1:] if Path(sys.argv[0]).name == "app.py" else []
    return parse_settings(argv, os.environ)
