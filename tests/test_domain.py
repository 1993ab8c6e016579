"""sat_core.evaluation.domain: colour statistics and the encoder's view tell photos from the training world's scenes."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

from sat_core.worlds import writer
from sat_core.config import ModelConfig, PreprocessConfig
from sat_core.evaluation.domain import ANNOTATION_MARGIN, AnnotationReference, DomainReference, mean_annotations
from sat_core.errors import SatError
from sat_core.data.images import load_image, preprocess
from sat_core.models import efficientnet
from sat_core.models.captioner import Captioner
from tests.explorer.conftest import explorer_env  # noqa: F401  (a fixture)

PHOTOS = ("chelsea", "coffee", "stereo_motorcycle", "astronaut", "rocket")


def _scenes(env, split: str) -> list[Image.Image]:
    return [load_image(env.world / e["filepath"] / e["filename"]) for e in env.dataset["images"] if e["split"] == split]


def test_domain_check_separates_photos_from_synthetic_scenes(explorer_env):
    from skimage import data

    reference = DomainReference.from_images(_scenes(explorer_env, "train"))
    for scene in _scenes(explorer_env, "test"):
        assert not reference.check(scene).far  # unseen scenes of the same world
        buffer = io.BytesIO()
        scene.resize((300, 300)).save(buffer, format="JPEG", quality=85)  # re-encoded and scaled: still in domain
        assert not reference.check(Image.open(buffer)).far
    for photo in (data.astronaut(), data.chelsea(), data.coffee(), data.camera()):
        check = reference.check(Image.fromarray(photo))
        assert check.far and check.reasons
    grey = reference.check(Image.fromarray(data.camera()))
    assert any("strongly coloured" in r for r in grey.reasons)


def test_a_grey_image_is_warned_about_while_most_references_have_colour(explorer_env):
    """Training on a few grey pictures does not let a model read colours off a grey one: with a tenth of the
    references grey the grey scene is still warned about; with half of them grey it is not."""
    from sat_core.evaluation.domain import GREY_REFERENCES_MAX

    scenes = _scenes(explorer_env, "train")
    greyed = [im.convert("L").convert("RGB") for im in scenes]
    probe = _scenes(explorer_env, "test")[0].convert("L").convert("RGB")
    few = DomainReference.from_images(greyed[:4] + scenes[4:])  # 4 of 40 grey
    assert few.min_coloured_share == 0.0 and few.grey_references() == 4
    warned = few.check(probe)
    assert any("is grey" in r and "4 of the 40" in r for r in warned.reasons)
    assert not few.check(_scenes(explorer_env, "test")[0]).far  # the same scene in colour: no warning
    half = DomainReference.from_images(greyed[:20] + scenes[20:])
    assert half.grey_references() == 20 >= GREY_REFERENCES_MAX * 40
    assert not any("grey" in r for r in half.check(probe).reasons)


def _photo(name: str) -> Image.Image:
    from skimage import data

    pixels = getattr(data, name)()
    return Image.fromarray(pixels[0] if isinstance(pixels, tuple) else pixels).convert("RGB")


def test_annotation_reference_measures_in_units_of_the_loneliest_reference():
    # a unit square and a point 3√2 from its nearest corner; both dimensions spread alike
    refs = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [4.0, 4.0]])
    reference = AnnotationReference.from_features(refs)
    scale = refs.std(0)[0] + 1e-6
    assert reference.reach == pytest.approx(3 * np.sqrt(2) / scale)
    assert reference.ratio(np.array([0.0, 1.0])) == pytest.approx(0.0)  # a reference itself
    assert reference.ratio(np.array([0.0, -3 * scale])) == pytest.approx(3 / reference.reach)
    again = AnnotationReference.from_dict(json.loads(json.dumps(reference.to_dict())))
    assert again.ratio(np.array([9.0, 9.0])) == pytest.approx(reference.ratio(np.array([9.0, 9.0])), rel=1e-4)
    with pytest.raises(SatError, match="another encoder"):
        reference.ratio(np.zeros(3))
    with pytest.raises(SatError, match="at least two"):
        AnnotationReference.from_features(refs[:1])


def test_the_encoders_view_flags_photos_that_the_colour_statistics_let_through(tmp_path):
    """Against the scenes world, colour statistics cannot tell photos apart; ImageNet features can."""
    # the scenes as rendered in the styles every split draws (no degraded pictures and none of the training-only
    # styles: both widen the reach), 60 as the reference and 12 to check
    path = writer.generate(tmp_path, 0, 0, 72, seed=5, workers=1, kind="scenes", augment=False)
    doc = json.loads(path.read_text())
    drawn = [load_image(tmp_path / e["filepath"] / e["filename"]) for e in doc["images"]]
    scenes = {"train": drawn[:60], "test": drawn[60:]}
    cfg = PreprocessConfig(image_size=224, mean=efficientnet.MEAN, std=efficientnet.STD, crop=1.0)
    model = Captioner(ModelConfig(encoder="efficientnet_lite0", pretrained=True, feature_dim=112,
                                  vocab_size=10)).eval()

    def annotations(images):
        return mean_annotations(model, torch.stack([preprocess(im, cfg)[0] for im in images]))

    train = annotations(scenes["train"])
    assert train.shape == (60, 112)
    reference = DomainReference.from_images(scenes["train"])
    reference.annotations = AnnotationReference.from_features(train)
    for scene, vec in zip(scenes["test"], annotations(scenes["test"])):
        check = reference.check(scene, vec)
        assert check.annotation_ratio < ANNOTATION_MARGIN and not check.far
    photos = [_photo(n) for n in PHOTOS]
    for photo, vec in zip(photos, annotations(photos)):
        check = reference.check(photo, vec)
        assert check.annotation_ratio > ANNOTATION_MARGIN
        assert any("what the model's encoder makes of it" in r for r in check.reasons)
        assert not reference.check(photo).annotation_ratio  # no annotation given: not checked
    assert DomainReference.from_dict(reference.to_dict()).annotations.reach == pytest.approx(
        reference.annotations.reach)


def _jpeg(image: Image.Image, quality: int) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def test_heavy_jpeg_compression_is_warned_about_and_light_compression_is_not(explorer_env):
    """The 8×8 blocks of a picture saved at quality 20 stand out; at quality 90, or never compressed, they do not."""
    from sat_core.evaluation.domain import BLOCKINESS_WARN, blockiness

    reference = DomainReference.from_images(_scenes(explorer_env, "train"))
    for scene in _scenes(explorer_env, "test")[:6]:
        assert blockiness(scene) < 1.5
        assert blockiness(_jpeg(scene, 90)) < BLOCKINESS_WARN
        heavy = _jpeg(scene, 20)
        assert blockiness(heavy) > BLOCKINESS_WARN
        check = reference.check(heavy)
        assert check.far and check.blockiness == pytest.approx(blockiness(heavy))
        assert any("heavily JPEG-compressed" in r for r in check.reasons)
        assert not any("JPEG" in r for r in reference.check(scene).reasons)


def test_blockiness_reads_the_block_grid_of_a_large_image_in_its_central_window():
    from skimage import data

    from sat_core.evaluation.domain import BLOCKINESS_WARN, blockiness

    large = _photo("astronaut").resize((2000, 1504))  # larger than the measured window both ways
    assert blockiness(large) < 1.5
    assert blockiness(_jpeg(large, 10)) > BLOCKINESS_WARN
    shifted = _jpeg(large, 10).crop((3, 5, 2000, 1504))  # cut off the grid: its borders no longer fall on 8k
    assert blockiness(shifted) < BLOCKINESS_WARN
    assert blockiness(Image.fromarray(data.camera()[:12, :12])) == 1.0  # narrower than two blocks: no reading
