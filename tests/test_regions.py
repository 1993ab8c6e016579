"""sat_core.regions: rectangles of grid cells, masks cut to the encoder's crop and laid on the α grid."""

from __future__ import annotations

import numpy as np
import pytest

from sat_core.errors import SatError
from sat_core.images import CropInfo
from sat_core.regions import box_mask, grid_region, mask_on_alpha_grid, mask_on_grid


def test_regions_and_masks_on_the_grid():
    region = grid_region((4, 5), range(1, 3), [0, 4])
    assert region.sum() == 4 and region[1, 0] and region[2, 4] and not region[0, 0]
    with pytest.raises(SatError, match="outside the 4×5 grid"):
        grid_region((4, 5), [4], [0])
    # a 200×100 image: the encoder saw the centred 100×100 square starting at x = 50
    crop = CropInfo(50, 0, 150, 100, 112 / 100, (200, 100), 112)
    mask = box_mask((200, 100), (50, 0, 100, 50))  # the crop's top-left quarter
    assert mask.shape == (100, 200) and mask.sum() == 50 * 50
    cells = mask_on_grid(mask, crop, (4, 4))
    assert cells[:2, :2].all() and cells.sum() == 4



def test_mask_is_cut_to_the_crop_and_resampled_to_the_grid():
    mask = np.zeros((100, 140), bool)
    mask[:, 20:70] = True  # the left half of the centred 100×100 crop (columns 20..119)
    crop = CropInfo(20, 0, 120, 100, 1.12, (140, 100), 112)
    on_grid = mask_on_alpha_grid(mask, crop, (14, 14))
    assert on_grid.shape == (112, 112) and on_grid[:, :56].all() and not on_grid[:, 56:].any()
