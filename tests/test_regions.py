"""sat_core.regions: rectangles of grid cells, masks cut to the encoder's crop and laid on the α grid."""

from __future__ import annotations

import numpy as np
import pytest

from sat_core.errors import SatError
from sat_core.data.images import CropInfo
from sat_core.regions import (box_mask, cells_at_points, cells_in_box, cells_in_polygon, format_cells, grid_region,
                              mask_on_alpha_grid, mask_on_grid, parse_cells)


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


def test_a_box_drawn_on_the_crop_picks_the_cells_whose_centres_it_covers():
    # a 4×4 grid over 100 px: cell centres at 12.5, 37.5, 62.5, 87.5
    region = cells_in_box((4, 4), 100, [60, 30], [0, 40])  # x 30–60, y 0–40, drawn right to left
    assert region.tolist() == grid_region((4, 4), [0, 1], [1]).tolist()
    assert not cells_in_box((4, 4), 100, [0, 10], [0, 10]).any()  # no centre inside


def test_a_lasso_picks_the_cells_inside_the_polygon():
    triangle = cells_in_polygon((4, 4), 100, [0, 100, 0], [0, 0, 100])  # upper-left half
    expected = np.array([[r + c < 3 for c in range(4)] for r in range(4)])
    assert triangle.tolist() == expected.tolist()
    square = cells_in_polygon((4, 4), 100, [25, 75, 75, 25], [25, 25, 75, 75])
    assert square.tolist() == grid_region((4, 4), [1, 2], [1, 2]).tolist()


def test_points_pick_the_cells_under_them():
    region = cells_at_points((4, 4), 100, [10, 99, 150], [90, 0, 10])
    assert np.argwhere(region).tolist() == [[0, 3], [3, 0]]


def test_cells_round_trip_through_link_text():
    region = grid_region((14, 14), range(2, 5), range(3, 6))
    region[13, 13] = True
    text = format_cells(region)
    assert text == "31-33,45-47,59-61,195"
    assert parse_cells(text, (14, 14)).tolist() == region.tolist()
    assert format_cells(np.zeros((2, 2), dtype=bool)) == "" and not parse_cells("", (2, 2)).any()
    with pytest.raises(SatError, match="4×4 grid"):
        parse_cells("3-99", (4, 4))
    with pytest.raises(SatError, match="4×4 grid"):
        parse_cells("a,b", (4, 4))
