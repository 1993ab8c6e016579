"""The transformation suite: pixels and object records move together, mirrored scenes state mirrored
relations, crops drop what they cut away, and the written sets load as datasets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sat_core.worlds.scenes import transforms
from sat_core.data import masks
from sat_core.worlds import writer
from sat_core.worlds.scenes import layout as scenes
from sat_core.data.karpathy import load_karpathy
from sat_core.worlds.scenes.catalog import RELATIONS
from sat_core.worlds.scenes.transforms import MIN_KEPT, SUITE, brightness, crop, grayscale, hflip, jpeg, zoom_out

S = 224
MIRROR = {"left_of": "right_of", "right_of": "left_of"}


def _object(oid: int, mask: np.ndarray, **extra) -> dict:
    """A scenes object record of an unoccluded mask (full_bbox = bbox, foot = its bottom edge)."""
    ys, xs = np.nonzero(mask)
    bbox = [int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)]
    return {"id": oid, "category": "ball", "colour": "red", "variant": "26bd", "layer": "ground", "bbox": bbox,
            "full_bbox": list(bbox), "foot": bbox[1] + bbox[3], "centroid": [float(xs.mean()), float(ys.mean())],
            "area": int(mask.sum()), "mask": masks.rle_encode(mask), **extra}


def _red_square(x0: int, y0: int, side: int) -> tuple[np.ndarray, list[dict]]:
    """A grey image with one red square, and its object record."""
    rng = np.random.default_rng(0)
    image = np.clip(rng.normal(120, 8, (S, S, 3)), 0, 255).astype(np.uint8)
    mask = np.zeros((S, S), bool)
    mask[y0 : y0 + side, x0 : x0 + side] = True
    image[mask] = (220, 20, 20)
    return image, [_object(0, mask)]


def _red(image: np.ndarray) -> np.ndarray:
    r, g, b = (image[..., c].astype(int) for c in range(3))
    return (r > 150) & (g < 90) & (b < 90)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    return (a & b).sum() / (a | b).sum()


def _check_record(o: dict) -> np.ndarray:
    """The record's bbox, centroid and area are those of its mask; returns the mask."""
    mask = masks.rle_decode(o["mask"])
    ys, xs = np.nonzero(mask)
    assert mask.shape == (S, S) and o["area"] == mask.sum()
    assert o["bbox"] == [xs.min(), ys.min(), xs.max() - xs.min() + 1, ys.max() - ys.min() + 1]
    assert o["centroid"] == pytest.approx([xs.mean(), ys.mean()], abs=0.01)
    return mask


@pytest.mark.parametrize("shift", SUITE, ids=[s.name for s in SUITE])
def test_each_transform_keeps_shape_dtype_and_masks_on_the_pixels(shift):
    image, objects = _red_square(30, 120, 40)
    out, moved = shift.apply(image, objects)
    assert out.shape == (S, S, 3) and out.dtype == np.uint8
    assert [o["id"] for o in moved] == [0] and set(moved[0]) == set(objects[0])
    mask = _check_record(moved[0])
    if shift.moves_objects:
        assert _iou(mask, _red(out)) > 0.9, "the mask covers the red pixels"
        x, y, w, h = moved[0]["full_bbox"]  # an unoccluded square: its whole box is its visible box
        assert np.abs(np.subtract(moved[0]["full_bbox"], moved[0]["bbox"])).max() <= 1
        assert moved[0]["foot"] == y + h
    else:
        assert moved == objects
    assert objects[0]["bbox"] == [30, 120, 40, 40], "the input records are left as they were"


def test_geometry_of_each_transform():
    image, objects = _red_square(30, 120, 40)
    flipped, [f] = hflip(image, objects)
    assert (flipped == image[:, ::-1]).all() and f["bbox"] == [S - 70, 120, 40, 40]
    assert f["centroid"][0] == pytest.approx(S - 1 - objects[0]["centroid"][0])
    zoomed, [z] = zoom_out(image, objects)
    k, off = round(S * 0.7) / S, (S - round(S * 0.7)) // 2
    assert z["full_bbox"] == [round(off + 30 * k), round(off + 120 * k), round(off + 70 * k) - round(off + 30 * k),
                              round(off + 160 * k) - round(off + 120 * k)]
    assert (zoomed[:off] == zoomed[off]).all(), "the canvas above the image repeats its top row"
    assert z["area"] == pytest.approx(40 * 40 * k * k, rel=0.1)
    cropped, [c] = crop(image, objects)
    k, off = S / round(S * 0.8), (S - round(S * 0.8)) // 2
    assert c["area"] == pytest.approx(40 * 40 * k * k, rel=0.1)
    assert c["bbox"][0] == pytest.approx((30 - off) * k, abs=1)


def test_photometric_transforms():
    image, objects = _red_square(30, 120, 40)
    dark, _ = brightness(image, objects)
    assert np.abs(dark.astype(int) - image * 0.6).max() <= 0.5
    grey, _ = grayscale(image, objects)
    assert (grey[..., 0] == grey[..., 1]).all() and (grey[..., 1] == grey[..., 2]).all()
    luminance = image.astype(float) @ [0.299, 0.587, 0.114]
    assert np.abs(grey[..., 0] - luminance).max() <= 1
    compressed, _ = jpeg(image, objects)
    difference = np.abs(compressed.astype(int) - image).mean()
    assert 0.5 < difference < 15, "lossy, but the same picture"


def test_crop_drops_objects_pushed_out_and_keeps_the_rest():
    off = (S - round(S * 0.8)) // 2  # 22 px cut from each side
    rng = np.random.default_rng(1)
    image = rng.integers(0, 255, (S, S, 3), dtype=np.uint8)
    masks = []
    for x0, y0, side in ((0, 0, 16), (off - 12, 100, 20), (off - 8, 150, 20), (100, 100, 30)):
        m = np.zeros((S, S), bool)
        m[y0 : y0 + side, x0 : x0 + side] = True
        masks.append(m)
    # inside the crop: none, 8 of 20 columns (40 %), 12 of 20 (60 %), all
    objects = [_object(i, m) for i, m in enumerate(masks)]
    assert 8 / 20 < MIN_KEPT < 12 / 20
    _, kept = crop(image, objects)
    assert [o["id"] for o in kept] == [2, 3]
    partial = _check_record(kept[0])
    assert partial[:, 0].any() and kept[0]["full_bbox"][:3] == [0, kept[0]["bbox"][1], kept[0]["bbox"][2]], \
        "cut by the border: its whole box ends there too"
    assert crop(image, objects[:1])[1] == []


@pytest.mark.parametrize("seed", range(6))
def test_mirrored_scene_states_mirrored_relations(seed):
    layout = scenes.generate_layout(np.random.default_rng(seed))
    objects = scenes.layout_objects(layout)
    pixels = scenes.render_layout(layout)
    flipped_pixels, flipped = hflip(pixels, objects)
    for a, b in ((a, b) for a in range(len(objects)) for b in range(len(objects)) if a != b):
        for relation in RELATIONS:
            for strict in (False, True):
                mirrored = MIRROR.get(relation, relation)
                assert scenes.relation_holds(mirrored, flipped[a], flipped[b], strict=strict) == \
                    scenes.relation_holds(relation, objects[a], objects[b], strict=strict), (relation, strict)
    for o, f in zip(objects, flipped):
        assert (masks.rle_decode(f["mask"]) == masks.rle_decode(o["mask"])[:, ::-1]).all()
        assert f["foot"] == o["foot"] and f["layer"] == o["layer"]


def test_write_suite_writes_every_set_as_a_dataset(tmp_path):
    path = writer.generate(tmp_path / "scenes", 0, 0, 8, seed=4, workers=1, kind="scenes")
    paths = transforms.write_suite(path, path.parent, tmp_path / "suite")
    assert sorted(p.parent.name for p in (tmp_path / "suite").glob("*/dataset.json")) == sorted(transforms.NAMES)
    source = json.loads(path.read_text())["images"]
    source_data = load_karpathy(path, path.parent)
    for name, p in paths.items():
        data = load_karpathy(p, p.parent)
        doc = json.loads(p.read_text())
        assert len(data.split("test")) + len(doc["dropped"]) == 8 and doc["transform"] == name
        for entry in doc["images"]:
            ids = {o["id"] for o in entry["objects"]}
            for s in entry["sentences"]:  # references name only the objects the set still holds
                assert {i for _, linked in s["links"] for i in linked} <= ids
            assert all(masks.rle_decode(o["mask"]).shape == (S, S) for o in entry["objects"])
    flipped = json.loads(paths["hflip"].read_text())["images"]
    for src, f in zip(source, flipped):
        refs = transforms.references(f["objects"], f["place"], seed=4, imgid=f["imgid"],
                                     caption_order="largest_first")
        assert [s["tokens"] for s in f["sentences"]] == [r["tokens"] for r in refs]
        assert f["filename"] == src["filename"] and f["imgid"] == src["imgid"]
        from PIL import Image

        original = np.asarray(Image.open(source_data.images[src["imgid"]].path))
        assert (np.asarray(Image.open(paths["hflip"].parent / "test" / f["filename"])) == original[:, ::-1]).all()
    grey = json.loads(paths["grayscale"].read_text())["images"]
    assert [g["sentences"] for g in grey] == [s["sentences"] for s in source], "photometric: the same references"


def test_the_cli_writes_a_jpeg_set_of_another_quality_over_the_validation_split(tmp_path, capsys):
    from PIL import Image

    from sat_core.transforms import main

    path = writer.generate(tmp_path / "scenes", 0, 3, 0, seed=4, workers=1, kind="scenes")
    errors = {}
    for quality in (10, 50):
        out = tmp_path / f"q{quality}"
        assert main(["--data", str(path), "--out", str(out), "--split", "val", "--only", "jpeg",
                     "--jpeg-quality", str(quality)]) == 0
        assert [p.parent.name for p in out.glob("*/dataset.json")] == ["jpeg"]
        doc = json.loads((out / "jpeg" / "dataset.json").read_text())
        assert len(doc["images"]) == 3 and {e["split"] for e in doc["images"]} == {"val"}
        entry = doc["images"][0]
        original = np.asarray(Image.open(path.parent / entry["filepath"] / entry["filename"]).convert("RGB"))
        again, _ = jpeg(original, [], quality=quality)
        written = np.asarray(Image.open(out / "jpeg" / "val" / entry["filename"]))
        assert (written == again).all()
        errors[quality] = np.abs(written.astype(int) - original).mean()
    assert errors[10] > errors[50]  # the lower quality loses more
    assert main(["--data", str(path), "--out", str(tmp_path / "bad"), "--only", "jpeg", "--jpeg-quality", "0"]) == 2
    assert "JPEG quality 0 is outside 1–95" in capsys.readouterr().err
