"""The synthetic dataset: deterministic files, and masks, links and captions that agree."""

import json

import numpy as np
import pytest
from PIL import Image

from sat_core import world
from sat_core.data import masks
from sat_core.worlds import references
from sat_core.worlds import writer
from sat_core.worlds.shapes import captions as shape_captions
from sat_core.worlds.shapes import scene as shapes
from sat_core.errors import SatError
from sat_core.worlds.shapes.grounding import parse_caption

SPLIT_SIZES = (30, 10, 10)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same seed written with 2 workers and with 1, and a different seed."""
    out = {}
    for name, seed, workers, sizes in [("a", 7, 2, SPLIT_SIZES), ("b", 7, 1, SPLIT_SIZES),
                                       ("c", 8, 2, (6, 2, 2))]:
        root = tmp_path_factory.mktemp(name)
        out[name] = (root, writer.generate(root, *sizes, seed=seed, workers=workers))
    return out


@pytest.fixture(scope="module")
def data(runs):
    return json.loads(runs["a"][1].read_text())


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_gives_identical_files_for_any_worker_count(runs):
    a, b = _files(runs["a"][0]), _files(runs["b"][0])
    assert len(a) == sum(SPLIT_SIZES) + 1
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a)


def test_different_seed_gives_different_images(runs):
    a, c = _files(runs["a"][0]), _files(runs["c"][0])
    shared = [k for k in c if k.suffix == ".png" and k in a]
    assert shared and all(a[k] != c[k] for k in shared)


def test_karpathy_format_and_image_files(runs, data):
    root = runs["a"][0]
    assert data["dataset"] == "sat_world" and data["seed"] == 7 and data["image_size"] == 112
    images = data["images"]
    assert [sum(im["split"] == s for im in images) for s in writer.SPLITS] == list(SPLIT_SIZES)
    assert [im["imgid"] for im in images] == list(range(len(images)))
    sentids = [s["sentid"] for im in images for s in im["sentences"]]
    assert len(set(sentids)) == len(sentids) == 5 * len(images)
    for im in images:
        assert im["filepath"] == im["split"] and im["sentids"] == [s["sentid"] for s in im["sentences"]]
        assert all(s["imgid"] == im["imgid"] and s["raw"] == " ".join(s["tokens"]) for s in im["sentences"])
        with Image.open(root / im["filepath"] / im["filename"]) as img:
            assert img.mode == "RGB" and img.size == (112, 112)
        assert 1 <= len(im["objects"]) <= 4


def test_captions_are_short_lowercase_and_name_every_object(data):
    for im in data["images"]:
        ids = {o["id"] for o in im["objects"]}
        for s in im["sentences"]:
            assert 1 <= len(s["tokens"]) <= references.MAX_CAPTION_TOKENS
            assert all(t.isalpha() and t.islower() for t in s["tokens"])
            named = {i for _, oids in s["links"] for i in oids}
            assert named == ids, s["raw"]
        assert len({s["raw"] for s in im["sentences"]}) >= 2 or len(im["objects"]) == 1


def test_linked_words_match_their_objects(data):
    checked = {"shape": 0, "colour": 0, "size": 0, "count": 0}
    for im in data["images"]:
        objs = {o["id"]: o for o in im["objects"]}
        for s in im["sentences"]:
            for ti, oids in s["links"]:
                word, linked = s["tokens"][ti], [objs[i] for i in oids]
                if word in shapes.SHAPE_WORDS:
                    shape, plural = shapes.SHAPE_WORDS[word]
                    assert all(o["shape"] == shape for o in linked) and plural == (len(oids) > 1)
                    kind = "shape"
                elif word in shapes.COLOURS:
                    assert all(o["colour"] == word for o in linked)
                    kind = "colour"
                elif word in shapes.SIZE_WORDS:
                    assert all(o["size"] == shapes.SIZE_WORDS[word] for o in linked)
                    kind = "size"
                else:
                    assert shapes.COUNT_WORDS[word] == len(oids), s["raw"]
                    kind = "count"
                checked[kind] += 1
            # a linked group is exactly the scene's identical objects: counts are complete
            for _, oids in s["links"]:
                key = {(objs[i]["shape"], objs[i]["colour"], objs[i]["size"]) for i in oids}
                assert len(key) == 1
                twins = [o for o in objs.values() if (o["shape"], o["colour"], o["size"]) in key]
                assert len(twins) == len(oids)
    assert min(checked.values()) > 0


def test_reference_relations_are_true_with_margin(data):
    n = 0
    for im in data["images"]:
        objs = {o["id"]: o for o in im["objects"]}
        for s in im["sentences"]:
            links = dict((t, ids) for t, ids in s["links"])
            parsed = parse_caption(s["tokens"])
            for r in parsed.relations:
                a = links[parsed.mentions[r.a].tokens[-1]]
                b = links[parsed.mentions[r.b].tokens[-1]]
                for i in a:
                    for j in b:  # recomputed here, not with shapes.relation_holds
                        (xa, ya), (xb, yb) = objs[i]["centroid"], objs[j]["centroid"]
                        along, across = {"left_of": (xb - xa, yb - ya), "right_of": (xa - xb, yb - ya),
                                         "above": (yb - ya, xb - xa), "below": (ya - yb, xb - xa)}[r.relation]
                        assert along >= 12 and along > abs(across), s["raw"]
                n += 1
    assert n > 10


def test_size_is_stated_when_colour_and_shape_do_not_tell_objects_apart():
    objects = [{"id": 0, "shape": "circle", "colour": "red", "size": "big", "centroid": [20, 20]},
               {"id": 1, "shape": "circle", "colour": "red", "size": "small", "centroid": [90, 90]},
               {"id": 2, "shape": "star", "colour": "blue", "size": "small", "centroid": [20, 90]}]
    for seed in range(10):
        for s in shape_captions.describe(objects, np.random.default_rng(seed)):
            sized = {ids[0] for t, ids in s["links"] if s["tokens"][t] in shapes.SIZE_WORDS}
            assert {0, 1} <= sized, s["raw"]


def test_masks_decode_to_their_area_bbox_and_centroid(data):
    for im in data["images"]:
        union = np.zeros((112, 112), int)
        for o in im["objects"]:
            m = masks.rle_decode(o["mask"])
            assert m.shape == (112, 112) and m.sum() == o["area"] > 0
            ys, xs = np.nonzero(m)
            x, y, w, h = o["bbox"]
            assert (xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1) == (x, y, w, h)
            assert np.allclose(o["centroid"], [xs.mean(), ys.mean()], atol=0.01)
            union += m
        assert union.max() == 1  # visible masks never overlap


def test_rle_round_trip_and_bad_rle():
    rng = np.random.default_rng(0)
    for mask in [np.zeros((4, 6), bool), np.ones((4, 6), bool), rng.random((9, 7)) > 0.5]:
        rle = masks.rle_encode(mask)
        assert rle["size"] == list(mask.shape) and sum(rle["counts"]) == mask.size
        assert np.array_equal(masks.rle_decode(rle), mask)
    assert masks.rle_encode(np.array([[True, True, False]]))["counts"] == [0, 2, 1]
    with pytest.raises(SatError):
        masks.rle_decode({"size": [2, 2], "counts": [1, 2]})


def test_scenes_render_objects_on_their_masks_over_a_dull_background():
    for seed in range(20):
        scene = shapes.generate_scene(np.random.default_rng(seed))
        img = shapes.render(scene).astype(float)
        assert img.shape == (112, 112, 3)
        assert np.array_equal(shapes.render(scene), shapes.render(scene))
        for obj in scene.objects:
            assert obj.mask.sum() >= shapes.MIN_VISIBLE * obj.full_mask.sum()
            assert not (obj.mask & ~obj.full_mask).any()
            r_lo, r_hi = {"small": (8, 10), "big": (14, 17)}[obj.size]
            assert r_lo <= obj.radius <= r_hi
            assert np.abs(img[obj.mask].mean(axis=0) - obj.rgb).max() < 3
            spread = img.max(axis=2) - img.min(axis=2)  # saturation proxy
            assert np.median(spread[obj.mask]) > 95
        objects = np.any([o.full_mask for o in scene.objects], axis=0)
        assert np.percentile(spread[~objects], 99) < 70


def test_shape_and_colour_vocabulary_sizes():
    assert len(shapes.SHAPES) >= 6 and len(shapes.COLOURS) >= 6
    names = list(shapes.COLOURS)
    rgb = np.array([shapes.COLOURS[c] for c in names], float)
    dist = np.linalg.norm(rgb[:, None] - rgb[None], axis=2) + np.eye(len(names)) * 1e9
    assert dist.min() > 80  # well separated colours


def test_cli_writes_and_reports_speed(tmp_path, capsys):
    world.main(["--out", str(tmp_path / "w"), "--train", "3", "--val", "1", "--test", "0",
                "--workers", "1", "--seed", "3"])
    assert "images/s" in capsys.readouterr().out
    data = json.loads((tmp_path / "w" / "dataset.json").read_text())
    assert len(data["images"]) == 4 and data["seed"] == 3


@pytest.mark.parametrize("argv", [["--train", "2"], ["--out", "x", "--train", "-1"],
                                  ["--out", "x", "--workers", "0"], ["--out", "x", "--bogus", "1"]])
def test_cli_rejects_bad_flags(argv):
    with pytest.raises(SystemExit) as err:
        world.main(argv)
    assert err.value.code == 2


def test_unwritable_output_raises_clear_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(SatError, match="--out"):
        writer.generate(blocker / "data", 1, 0, 0, seed=0, workers=1)
    with pytest.raises(SystemExit) as err:
        world.main(["--out", str(blocker / "data"), "--train", "1"])
    assert err.value.code == 2 and "writable" in capsys.readouterr().err
