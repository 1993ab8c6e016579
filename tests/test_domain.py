"""sat_core.domain: colour statistics tell photos from the training world's scenes."""

from __future__ import annotations

import io

from PIL import Image

from sat_core.domain import DomainReference
from sat_core.images import load_image
from tests.explorer.conftest import explorer_env  # noqa: F401  (a fixture)


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
