"""sat_core.viz: α grids to pixels, checked on values."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from sat_core import viz

GRID = (14, 14)


def one_hot(row: int, col: int, grid: tuple[int, int] = GRID) -> np.ndarray:
    alpha = np.zeros(grid[0] * grid[1])
    alpha[row * grid[1] + col] = 1.0
    return alpha


@pytest.fixture
def image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(224, 224, 3), dtype=np.uint8)


def test_alpha_to_grid_is_row_major() -> None:
    np.testing.assert_array_equal(viz.alpha_to_grid(np.arange(6), (2, 3)), [[0, 1, 2], [3, 4, 5]])
    with pytest.raises(ValueError, match="does not fit grid"):
        viz.alpha_to_grid(np.arange(6), (3, 3))


def test_nearest_shows_one_exact_block() -> None:
    up = viz.upsample_alpha(viz.alpha_to_grid(one_hot(3, 5), GRID), 112, method="nearest")
    assert up.shape == (112, 112)
    expected = np.zeros((112, 112))
    expected[24:32, 40:48] = 1.0  # cell (3, 5) at 8 px per cell
    np.testing.assert_array_equal(up, expected)


@pytest.mark.parametrize("method", ["bilinear", "pyramid"])
@pytest.mark.parametrize("cell", [(3, 5), (0, 0), (13, 13), (7, 2)])
def test_smooth_peak_lies_in_its_cell(method: str, cell: tuple[int, int]) -> None:
    up = viz.upsample_alpha(viz.alpha_to_grid(one_hot(*cell), GRID), 112, method=method)
    assert up.shape == (112, 112)
    row, col = np.unravel_index(up.argmax(), up.shape)
    assert (row // 8, col // 8) == cell


def test_pyramid_paper_setting_and_odd_sizes() -> None:
    grid_map = viz.alpha_to_grid(one_hot(9, 4), GRID)
    paper = viz.upsample_alpha(grid_map, 224, method="pyramid", sigma=20)  # factor 16, as in the paper
    row, col = np.unravel_index(paper.argmax(), paper.shape)
    assert (row // 16, col // 16) == (9, 4)
    # A heavier blur spreads the same cell further: lower peak than skimage's default sigma.
    assert paper.max() < viz.upsample_alpha(grid_map, 224, method="pyramid").max()
    odd = viz.upsample_alpha(grid_map, (100, 130), method="pyramid")  # non-integer, unequal factors
    assert odd.shape == (100, 130)
    row, col = np.unravel_index(odd.argmax(), odd.shape)
    assert (row * 14 // 100, col * 14 // 130) == (9, 4)


@pytest.mark.parametrize("method", ["nearest", "bilinear", "pyramid"])
def test_uniform_alpha_stays_uniform(method: str) -> None:
    up = viz.upsample_alpha(np.full(GRID, 1 / 196), 112, method=method)
    np.testing.assert_allclose(up, 1 / 196, rtol=1e-9)


def test_unknown_method_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown upsampling"):
        viz.upsample_alpha(np.ones(GRID), 112, method="cubic")  # type: ignore[arg-type]


def test_normalisation_modes() -> None:
    maps = np.zeros((3, 4, 4))
    maps[0, 1, 1], maps[1, 2, 2] = 0.8, 0.2  # map 2 is all zero
    word = viz.normalise_maps(maps, "word")
    np.testing.assert_allclose(word.reshape(3, -1).max(axis=1), [1.0, 1.0, 0.0])
    caption = viz.normalise_maps(maps, "caption")
    np.testing.assert_allclose(caption.reshape(3, -1).max(axis=1), [1.0, 0.25, 0.0])
    glob = viz.normalise_maps(maps, "global", global_max=1.6)  # (α / 1.6)^½: one scale, weak maps visible
    np.testing.assert_allclose(glob.reshape(3, -1).max(axis=1), [0.5**0.5, 0.125**0.5, 0.0])
    assert viz.normalise_maps(maps, "global", global_max=0.4).max() == 1.0  # clipped into [0, 1]
    with pytest.raises(ValueError, match="global_max"):
        viz.normalise_maps(maps, "global")


def test_colormap_anchors_and_range() -> None:
    values = np.array([[0.0, 0.5, 1.0, 2.0, -1.0]])
    viridis = viz.colormap(values, "viridis")
    assert viridis.dtype == np.uint8 and viridis.shape == (1, 5, 3)
    assert viridis[0, 0].tolist() == [68, 1, 84] and viridis[0, 2].tolist() == [253, 231, 37]
    assert viridis[0, 3].tolist() == viridis[0, 2].tolist() and viridis[0, 4].tolist() == viridis[0, 0].tolist()
    assert viz.colormap(values, "gray")[0, 1].tolist() == [128, 128, 128]
    assert viz.colormap(values, "jet")[0, 0].tolist() == [0, 0, 128]
    assert viz.colormap(values, "jet")[0, 2].tolist() == [128, 0, 0]
    assert viz.colormap(values, "inferno")[0, 2].tolist() == [252, 255, 164]
    ramp = viz.colormap(np.linspace(0, 1, 50)[None], "gray")[0, :, 0].astype(int)
    assert np.all(np.diff(ramp) > 0)
    with pytest.raises(ValueError, match="unknown colormap"):
        viz.colormap(values, "rainbow")


def test_overlay_opacity_extremes(image: np.ndarray) -> None:
    heat = np.linspace(0, 1, 224 * 224).reshape(224, 224)
    np.testing.assert_array_equal(viz.overlay(image, heat, opacity=0.0), image)
    opaque = viz.overlay(image, heat, opacity=1.0, cmap="inferno")
    np.testing.assert_array_equal(opaque, viz.colormap(heat, "inferno"))
    half = viz.overlay(image, heat, opacity=0.5).astype(int)
    expected = (image.astype(int) + viz.colormap(heat).astype(int)) / 2
    assert np.abs(half - expected).max() <= 0.5
    with pytest.raises(ValueError, match="must match image"):
        viz.overlay(image, heat[:100])


def test_coverage_map_sums_over_steps() -> None:
    alphas = np.random.default_rng(1).dirichlet(np.ones(196), size=7)
    coverage = viz.coverage_map(alphas)
    assert coverage.shape == (196,)
    np.testing.assert_allclose(coverage, alphas.sum(axis=0))
    assert coverage.sum() == pytest.approx(7.0)


def test_outline_masks_draws_only_the_border(image: np.ndarray) -> None:
    small = np.zeros((112, 112), dtype=bool)
    small[20:60, 30:80] = True  # at half resolution: scaled 2x onto the image
    out = viz.outline_masks(image, [small], colour=(0, 255, 0))
    changed = np.any(out != image, axis=2)
    border = np.zeros((224, 224), dtype=bool)
    border[40:120, 60:160] = True
    border[41:119, 61:159] = False
    assert not changed[~border].any()
    assert (out[border] == [0, 255, 0]).all()
    with pytest.raises(ValueError, match="colours"):
        viz.outline_masks(image, [small, small], colour=[(1, 2, 3)])


WORDS = ["a", "dog", "runs", "on", "grass"]


@pytest.fixture
def alphas() -> np.ndarray:
    return np.stack([one_hot(2 * t + 1, 12 - 2 * t) for t in range(len(WORDS))])  # (T, L)


@pytest.mark.parametrize(("columns", "shape"), [(None, (132, 692)), (4, (268, 460)), (1, (6 * 132 + 5 * 4, 112))])
def test_word_strip_size(image: np.ndarray, alphas: np.ndarray, columns: int | None, shape: tuple) -> None:
    strip = viz.word_strip(image, WORDS, alphas, GRID, columns=columns)
    assert strip.shape == (*shape, 3) and strip.dtype == np.uint8
    assert viz.strip_shape(len(WORDS), 112, columns) == shape


def test_word_strip_panels_hold_image_overlays_and_words(image: np.ndarray, alphas: np.ndarray) -> None:
    strip = viz.word_strip(image, WORDS, alphas, GRID, method="nearest", opacity=1.0, cmap="gray")
    panel = lambda k: strip[:112, k * 116 : k * 116 + 112]  # noqa: E731  (112 px + 4 px gap)
    label = lambda k: strip[112:132, k * 116 : k * 116 + 112]  # noqa: E731
    plain = np.asarray(Image.fromarray(image).resize((112, 112), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(panel(0), plain)
    for t in range(len(WORDS)):
        # Opacity 1 with gray: the panel is the normalised nearest map, white exactly in the cell.
        row, col = 2 * t + 1, 12 - 2 * t
        white = np.all(panel(t + 1) == 255, axis=2)
        assert white[row * 8 : row * 8 + 8, col * 8 : col * 8 + 8].all() and white.sum() == 64
        assert label(t + 1).min() < 128  # the word is written
    assert label(0).min() == 255  # the plain image has no word
    with pytest.raises(ValueError, match="words for"):
        viz.word_strip(image, WORDS[:-1], alphas, GRID)


def test_strip_png_round_trips(image: np.ndarray, alphas: np.ndarray) -> None:
    strip = viz.word_strip(image, WORDS, alphas, GRID)
    decoded = np.asarray(Image.open(io.BytesIO(viz.strip_png(strip))).convert("RGB"))
    np.testing.assert_array_equal(decoded, strip)


def test_strip_gif_has_one_frame_per_word(image: np.ndarray, alphas: np.ndarray) -> None:
    data = viz.strip_gif(image, WORDS, alphas, GRID, duration_ms=300, panel_size=96, cmap="jet")
    gif = Image.open(io.BytesIO(data))
    assert gif.format == "GIF" and gif.n_frames == len(WORDS) + 1
    assert gif.size == (96, 96 + viz.LABEL_HEIGHT)
    assert gif.info["duration"] == 300 and gif.info["loop"] == 0


def test_alphas_json_round_trips(alphas: np.ndarray) -> None:
    soft = np.random.default_rng(2).dirichlet(np.ones(196), size=len(WORDS)).astype(np.float32)
    betas = np.linspace(0.1, 0.9, len(WORDS), dtype=np.float32)
    text = viz.alphas_json(WORDS, soft, betas, GRID)
    data = json.loads(text)
    assert data["grid"] == [14, 14] and [s["word"] for s in data["steps"]] == WORDS
    assert np.asarray(data["steps"][1]["alpha"]).shape == GRID
    words, got, got_betas, grid = viz.load_alphas_json(text)
    assert words == WORDS and grid == GRID
    np.testing.assert_array_equal(got.astype(np.float32), soft)
    np.testing.assert_array_equal(got_betas.astype(np.float32), betas)
    assert viz.load_alphas_json(viz.alphas_json(WORDS, alphas, None, GRID))[2] is None


def test_colour_bar_ticks_read_real_alpha_values() -> None:
    ticks = viz.scale_ticks(0.2, n=3)
    assert ticks == [(0.0, 0.0), (0.5, pytest.approx(0.1)), (1.0, pytest.approx(0.2))]
    sqrt_ticks = viz.scale_ticks(1.0, gamma=0.5, n=3)  # colour position p shows α = p²
    assert sqrt_ticks[1] == (0.5, pytest.approx(0.25))
    bar = viz.colorbar_image(200, "viridis", ticks)
    assert bar.shape == (200, 90, 3)
    top, bottom = bar[24, 10], bar[200 - 11, 10]  # the bar's first and last rows
    np.testing.assert_array_equal(top, viz._lut("viridis")[255])
    np.testing.assert_array_equal(bottom, viz._lut("viridis")[0])
    stops = viz.colormap_stops("gray", 3)
    assert stops == [(0.0, "rgb(0,0,0)"), (0.5, "rgb(128,128,128)"), (1.0, "rgb(255,255,255)")]


def test_titles_and_bars_frame_an_export() -> None:
    image = np.zeros((50, 300, 3), np.uint8)
    titled = viz.with_title(image, ["caption: a red star", "checkpoint: soft"])
    assert titled.shape[1] == 300 and titled.shape[0] > 50 + 2 * 18
    np.testing.assert_array_equal(titled[-50:], image)
    framed = viz.with_colorbar(titled, viz.colorbar_image(40, "viridis", viz.scale_ticks(1.0)))
    assert framed.shape == (titled.shape[0], 390, 3)


def test_alphas_json_keeps_its_metadata() -> None:
    alphas = np.full((2, 4), 0.25)
    text = viz.alphas_json(["a", "b"], alphas, None, (2, 2), meta={"caption": "a b", "crop": [0, 0, 10, 10]})
    assert json.loads(text)["meta"] == {"caption": "a b", "crop": [0, 0, 10, 10]}
    words, back, _, grid = viz.load_alphas_json(text)
    assert words == ["a", "b"] and grid == (2, 2) and np.allclose(back, alphas)
