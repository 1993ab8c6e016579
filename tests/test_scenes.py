"""The scenes world: deterministic files, masks from the sprites' alpha, links that name their objects."""

import json

import numpy as np
import pytest
from PIL import Image

from sat_core import world
from sat_core.errors import SatError
from sat_core.data import masks
from sat_core.worlds import writer
from sat_core.worlds.scenes import layout as scenes
from sat_core.worlds.scenes.sprites import ASSET_DIR, sprite
from sat_core.worlds.scenes.catalog import (
    CATEGORIES, COLOURS, COUNT_WORDS, NOUNS, NUMBER_WORDS, PLACES, RELATION_WORDS, all_codes,
)

SIZES = (24, 6, 6)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Seed 5 written with 2 workers and with 1, and seed 6."""
    out = {}
    for name, seed, workers in [("a", 5, 2), ("b", 5, 1), ("c", 6, 2)]:
        root = tmp_path_factory.mktemp(name)
        out[name] = (root, writer.generate(root, *SIZES, seed=seed, workers=workers, kind="scenes"))
    return out


@pytest.fixture(scope="module")
def data(runs):
    return json.loads(runs["a"][1].read_text())


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_files_and_another_seed_differs(runs):
    a, b, c = (_files(runs[k][0]) for k in "abc")
    assert len(a) == sum(SIZES) + 1
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)
    differing = [k for k in a if k.suffix == ".png" and a[k] != c.get(k)]
    assert len(differing) == sum(SIZES)


def test_dataset_header_and_images(data, runs):
    assert data["dataset"] == "sat_scenes" and data["kind"] == "scenes" and data["image_size"] == 224
    root = runs["a"][0]
    for im in data["images"]:
        assert im["place"] in PLACES
        assert 1 <= len(im["objects"]) <= 4
        with Image.open(root / im["filepath"] / im["filename"]) as img:
            assert img.size == (224, 224) and img.mode == "RGB"


def test_masks_are_the_sprites_alpha_minus_what_covers_them():
    for seed in range(12):
        layout = scenes.generate_layout(np.random.default_rng(seed))
        records = scenes.layout_objects(layout)
        covered = np.zeros((224, 224), bool)
        for thing, record in zip(reversed(layout.things), reversed(records)):
            (ys, xs), (ss, cs) = scenes._clipped(thing.box)
            placed = np.zeros((224, 224), bool)
            placed[ys, xs] = thing.alpha[ss, cs] >= 0.5
            expected = placed & ~covered
            assert np.array_equal(masks.rle_decode(record["mask"]), expected)
            assert record["area"] == int(expected.sum()) >= scenes.MIN_VISIBLE * placed.sum()
            covered |= placed
        # the resized alpha comes from the vendored sprite (same share of opaque pixels, ±5 %)
        for thing in layout.things:
            src = sprite(thing.variant, thing.recolour)[..., 3] >= 128
            assert abs((thing.alpha >= 0.5).mean() - src.mean()) < 0.05


def test_object_pixels_show_the_sprite():
    """Where an object is visible and opaque, the image has the sprite's colours (lighting aside)."""
    layout = scenes.generate_layout(np.random.default_rng(3))
    image = scenes.render_layout(layout).astype(float)
    for thing in layout.things:
        (ys, xs), (ss, cs) = scenes._clipped(thing.box)
        opaque = (thing.alpha[ss, cs] > 0.99) & thing.mask[ys, xs]
        drawn = image[ys, xs][opaque]
        corr = np.corrcoef(drawn.mean(axis=1), thing.rgb[ss, cs][opaque].mean(axis=1))[0, 1]
        assert corr > 0.8


def test_every_linked_word_names_its_objects(data):
    for im in data["images"]:
        objects = {o["id"]: o for o in im["objects"]}
        for sent in im["sentences"]:
            named = set()
            for t, ids in sent["links"]:
                word = sent["tokens"][t]
                group = [objects[i] for i in ids]
                named |= set(ids)
                assert len({(o["category"], o["colour"]) for o in group}) == 1
                if word in COUNT_WORDS:
                    assert COUNT_WORDS[word] == len(ids)
                elif word in NOUNS:
                    category, plural = NOUNS[word]
                    assert category == group[0]["category"]
                    assert plural == (len(ids) > 1) or CATEGORIES[category].plural == category
                else:
                    assert word in COLOURS and word == group[0]["colour"], (word, sent["raw"])
            assert named == set(objects), sent["raw"]  # every object is named


def test_captions_state_relations_places_and_colours(data):
    sents = [s for im in data["images"] for s in im["sentences"]]
    assert len(sents) == 5 * sum(SIZES)
    with_relation = np.mean([any(w in RELATION_WORDS for w in s["tokens"]) for s in sents])
    assert with_relation >= 0.3
    place_words = {w for phrases in PLACES.values() for p in phrases for w in p.split()[-1:]}
    assert np.mean([s["tokens"][-1] in place_words for s in sents]) > 0.6
    assert any(w in COLOURS for s in sents for w in s["tokens"])
    assert max(len(s["tokens"]) for s in sents) <= 22


def test_references_name_groups_left_to_right_so_left_of_is_the_only_horizontal_relation(tmp_path):
    path = writer.generate(tmp_path / "random", 24, 0, 0, seed=5, workers=1, kind="scenes", caption_order="random")
    assert any("right" in s["tokens"] for im in json.loads(path.read_text())["images"] for s in im["sentences"])
    path = writer.generate(tmp_path / "l2r", 24, 0, 0, seed=5, workers=1, kind="scenes", caption_order="left_to_right")
    data = json.loads(path.read_text())
    assert data["caption_order"] == "left_to_right"
    horizontal = 0
    for im in data["images"]:
        objects = {o["id"]: o for o in im["objects"]}
        for sent in im["sentences"]:
            groups = []  # the linked id groups, in the order the caption names them
            for _t, ids in sent["links"]:
                if ids not in groups:
                    groups.append(ids)
            xs = [min(objects[i]["centroid"][0] for i in ids) for ids in groups]  # each at its leftmost
            assert xs == sorted(xs), sent["raw"]
            assert "right" not in sent["tokens"], sent["raw"]
            horizontal += "left" in sent["tokens"]
    assert horizontal > 0, "no horizontal relation at all: the test cannot tell"


def test_largest_first_references_name_the_largest_group_first_and_equal_ones_left_to_right(tmp_path):
    path = writer.generate(tmp_path / "largest", 40, 0, 0, seed=5, workers=1, kind="scenes")
    data = json.loads(path.read_text())
    assert data["caption_order"] == "largest_first"  # the shipped world's order is the default
    mixed = 0  # captions of scenes whose groups differ in size: where this order differs from left to right
    for im in data["images"]:
        objects = {o["id"]: o for o in im["objects"]}
        for sent in im["sentences"]:
            groups = []
            for _t, ids in sent["links"]:
                if ids not in groups:
                    groups.append(ids)
            keys = [(-len(ids), min(objects[i]["centroid"][0] for i in ids)) for ids in groups]
            assert keys == sorted(keys), sent["raw"]
            assert "right" not in sent["tokens"], sent["raw"]
            mixed += len({len(ids) for ids in groups}) > 1
            if len(groups) > 1 and len(groups[0]) > 1:  # the first word that counts says the largest group's size
                count_word = next(w for w in sent["tokens"] if w in NUMBER_WORDS.values())
                assert count_word == NUMBER_WORDS[len(groups[0])], sent["raw"]
    assert mixed > 0, "no scene with groups of different sizes: the test cannot tell"


def test_strict_relations_in_references_hold_between_their_objects():
    a = {"full_bbox": [10, 100, 40, 40], "foot": 140, "layer": "ground"}
    b = {"full_bbox": [120, 100, 40, 40], "foot": 140, "layer": "ground"}
    kite = {"full_bbox": [20, 10, 30, 30], "foot": 40, "layer": "air"}
    near = {"full_bbox": [20, 150, 60, 60], "foot": 210, "layer": "ground"}
    assert scenes.relation_holds("left_of", a, b, strict=True)
    assert scenes.relation_holds("right_of", b, a, strict=True)
    assert not scenes.relation_holds("left_of", b, a)
    assert scenes.relation_holds("above", kite, a, strict=True)
    assert not scenes.relation_holds("above", a, b, strict=True)  # two things on the ground
    assert scenes.relation_holds("in_front_of", near, a, strict=True)
    assert scenes.relation_holds("behind", a, near, strict=True)
    assert not scenes.relation_holds("in_front_of", near, b, strict=True)  # no overlap across
    assert scenes.relation_holds("next_to", a, {**b, "full_bbox": [60, 100, 40, 40]}, strict=True)
    assert not scenes.relation_holds("next_to", a, b, strict=True)


def test_vendored_sprites_cover_the_catalogue_with_licence():
    assert {p.stem for p in ASSET_DIR.glob("*.webp")} == set(all_codes())
    assert "Microsoft" in (ASSET_DIR / "LICENSE").read_text()
    assert "@lobehub/fluent-emoji-3d" in (ASSET_DIR / "README.md").read_text()
    assert sum(p.stat().st_size for p in ASSET_DIR.glob("*.webp")) < 4e6
    assert 20 <= len(CATEGORIES) <= 40


def test_cli_writes_a_scenes_world(tmp_path, capsys):
    world.main(["--kind", "scenes", "--out", str(tmp_path), "--train", "2", "--val", "0",
                "--test", "1", "--workers", "1"])
    data = json.loads((tmp_path / "dataset.json").read_text())
    assert [im["split"] for im in data["images"]] == ["train", "train", "test"]
    assert "wrote 3 images" in capsys.readouterr().out


def test_a_scenes_world_keeps_its_generators_seed(runs):
    from sat_core.data.karpathy import load_karpathy

    root, path = runs["a"]
    assert load_karpathy(path, root).seed == json.loads(path.read_text())["seed"]  # for the model card's world line


def test_training_with_tune_blocks_trains_only_those_blocks_and_saves_them(runs, tmp_path):
    """--tune-blocks 1: the cache holds the frozen part; the last block before the tap learns at
    --encoder-lr-scale × --lr, every other encoder weight stays ImageNet's, and the checkpoint keeps it."""
    import torch

    from sat_core import train
    from sat_core.training import trainer as training
    from sat_core.checkpoint import load_checkpoint
    from sat_core.models.efficientnet import efficientnet_lite0

    root, path = runs["a"]
    args = ["--data", str(path), "--images", str(root), "--out", str(tmp_path / "run"), "--encoder",
            "efficientnet_lite0", "--tune-blocks", "1", "--embed-dim", "16",
            "--hidden-dim", "32", "--attn-dim", "16", "--min-word-count", "1", "--batch-size", "8",
            "--epochs", "1", "--lr", "1e-2", "--encoder-lr-scale", "0.5", "--no-progress", "--device", "cpu",
            "--val-beam", "1", "--val-max-len", "8", "--precision", "fp32"]
    assert train.main(args) == 0
    loaded = load_checkpoint(tmp_path / "run" / "last")
    assert loaded.model_config.tune_blocks == 1
    net, reference = loaded.model.encoder.body.net, efficientnet_lite0()
    changed = {name.split(".")[1] for name, p in net.named_parameters()
               if name.startswith("_blocks.") and not torch.equal(p, reference.get_parameter(name))}
    assert changed == {"10"}, "only the block before the stride-16 tap (block 10) may learn"
    assert torch.equal(net._conv_stem.weight, reference._conv_stem.weight)

    # The optimizer: the tuned block in its own group at --encoder-lr-scale of the decoder's rate.
    cfg, _ = train.parse_config([*args, "--out", str(tmp_path / "again")])
    trainer = training.Trainer(cfg)
    groups = trainer.optimizer.param_groups
    assert [g["lr_scale"] for g in groups] == [1.0, 0.5]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in trainer.model.encoder.body.tail_parameters()}
    trainer._set_lr(0.02)
    assert [g["lr"] for g in groups] == [0.02, 0.01]
    assert trainer.features.shape[1:] == (112, 14, 14)  # the cache: block 9's output, before the tuned block
    with torch.no_grad():  # cached part (fp16) + tuned block = the model's own annotations of the images
        images = training.normalise(trainer.store.images[:2], trainer.preprocess)
        direct = trainer.model.encode(images).feats  # (2, 196, 112)
        assert torch.allclose(trainer._annotations([0, 1]), direct, atol=0.05 * float(direct.abs().max()))


def test_some_objects_are_cut_by_the_border_and_keep_most_of_themselves_inside():
    cut = 0
    for seed in range(60):
        layout = scenes.generate_layout(np.random.default_rng(seed))
        for thing in layout.things:
            x0, _, x1, _ = thing.box
            if x0 < 0 or x1 > 224:
                cut += 1
                inside = thing.full_mask.sum()
                assert inside >= scenes.MIN_INSIDE * (thing.alpha >= 0.5).sum()
                assert thing.mask.any()
    assert cut >= 5


def test_the_shifted_split_shares_no_surface_style_or_horizon_with_training(tmp_path):
    from sat_core.worlds.scenes.render import HELD_OUT

    usual = json.loads(writer.generate(tmp_path / "u", 40, 5, 5, seed=1, kind="scenes").read_text())
    shifted = json.loads(writer.generate(tmp_path / "s", 0, 0, 40, seed=1, kind="scenes", shifted=True).read_text())
    assert shifted["shifted"] is True and usual["shifted"] is False
    usual_styles = {(s, v) for im in usual["images"] for s, v in im["styles"].items()}
    shifted_styles = {(s, v) for im in shifted["images"] for s, v in im["styles"].items()}
    assert usual_styles and shifted_styles and not usual_styles & shifted_styles
    assert {v for _, v in shifted_styles} <= HELD_OUT and not {v for _, v in usual_styles} & HELD_OUT
    # the ground starts higher in every shifted scene than the usual splits ever draw
    for place in ("grass", "floor", "table"):
        low = scenes.HORIZONS["usual"].get(place, scenes.HORIZONS["usual"]["outdoor"])[0]
        high = scenes.HORIZONS["shifted"].get(place, scenes.HORIZONS["shifted"]["outdoor"])[1]
        assert high <= low
    for seed in range(20):
        layout = scenes.generate_layout(np.random.default_rng(seed), shifted=True)
        if layout.place != "sky":
            ranges = scenes.HORIZONS["shifted"]
            low, high = ranges.get(layout.place, ranges["outdoor"])
            assert low <= layout.horizon < high


def test_training_pictures_alone_draw_the_training_only_styles(tmp_path):
    from sat_core.worlds.scenes.render import HELD_OUT, HELD_OUT_VALIDATION, TRAINING_ONLY, styles_for

    assert not TRAINING_ONLY & (HELD_OUT | HELD_OUT_VALIDATION)
    data = json.loads(writer.generate(tmp_path / "w", 60, 30, 30, seed=2, kind="scenes").read_text())
    drawn = {split: {v for im in data["images"] if im["split"] == split for v in im["styles"].values()}
             for split in ("train", "val", "test")}
    assert len(drawn["train"] & TRAINING_ONLY) >= 6
    assert not (drawn["val"] | drawn["test"]) & TRAINING_ONLY
    # validation and test draw among exactly the styles they drew before these were added
    assert styles_for("table", False) == {"ground": ("wood", "painted"),
                                                       "sky": ("clear", "overcast", "evening"), "wall": ("plain",)}
    assert "walnut" in styles_for("table", False, training_only=True)["ground"]
    assert styles_for("table", True, training_only=True)["ground"] == ("cloth",)
    # and some training scenes draw only the usual ones
    usual = set(styles_for("table", False)["ground"])
    assert any(im["styles"]["ground"] in usual for im in data["images"]
               if im["split"] == "train" and im["place"] == "table")


def test_the_validation_shifted_set_draws_styles_neither_training_nor_the_shifted_split_draws(tmp_path):
    from sat_core.worlds.scenes.render import HELD_OUT, HELD_OUT_VALIDATION

    assert not HELD_OUT & HELD_OUT_VALIDATION
    usual = json.loads(writer.generate(tmp_path / "u", 40, 5, 5, seed=1, kind="scenes").read_text())
    shifted = json.loads(writer.generate(tmp_path / "s", 0, 0, 30, seed=1, kind="scenes", shifted=True).read_text())
    chosen = json.loads(writer.generate(tmp_path / "v", 0, 30, 0, seed=1, kind="scenes", shifted=True,
                                        held_out="validation").read_text())
    assert chosen["held_out"] == "validation" and shifted["held_out"] == "test"
    styles = {name: {v for im in d["images"] for v in im["styles"].values()}
              for name, d in (("usual", usual), ("shifted", shifted), ("validation", chosen))}
    assert styles["validation"] <= HELD_OUT_VALIDATION and len(styles["validation"]) >= 6
    assert not styles["validation"] & (styles["usual"] | styles["shifted"])
    assert not styles["usual"] & HELD_OUT_VALIDATION
    # another stream of scenes than the shifted split's (the same seed, split and index)
    a = np.asarray(Image.open(tmp_path / "s" / "test" / shifted["images"][0]["filename"]))
    b = np.asarray(Image.open(tmp_path / "v" / "val" / chosen["images"][0]["filename"]))
    assert not np.array_equal(a, b)
    with pytest.raises(SatError, match="held_out must be 'test' or 'validation'"):
        writer.generate(tmp_path / "x", 0, 1, 0, kind="scenes", shifted=True, held_out="train")


def test_only_training_pictures_are_degraded_and_each_says_how(tmp_path):
    path = writer.generate(tmp_path / "w", 80, 20, 20, seed=2, kind="scenes")
    images = json.loads(path.read_text())["images"]
    degraded = [im for im in images if "degraded" in im]
    assert degraded and all(im["split"] == "train" for im in degraded)
    names = {im["degraded"].split()[0] for im in degraded}
    assert names <= {"jpeg", "grayscale", "blur", "exposure"}
    for im in degraded:
        if im["degraded"] == "grayscale":
            with Image.open(tmp_path / "w" / im["filepath"] / im["filename"]) as img:
                pixels = np.asarray(img).astype(int)
            assert (pixels[..., 0] == pixels[..., 1]).all() and (pixels[..., 1] == pixels[..., 2]).all()
    plain = writer.generate(tmp_path / "p", 80, 0, 0, seed=2, kind="scenes", augment=False)
    assert not any("degraded" in im for im in json.loads(plain.read_text())["images"])


def test_photometric_keeps_the_picture_size_and_changes_it_as_named():
    pixels = scenes.render_layout(scenes.generate_layout(np.random.default_rng(0)))
    seen = set()
    for seed in range(200):
        out, name = scenes.photometric(pixels, np.random.default_rng(seed))
        assert out.shape == pixels.shape and out.dtype == np.uint8
        if name is None:
            assert out is pixels
        else:
            seen.add(name.split()[0])
            assert np.abs(out.astype(int) - pixels).mean() > 0.3
    assert seen == {"jpeg", "grayscale", "blur", "exposure"}
