"""Attention maps α as pictures: numpy arrays and encoded bytes, no plotting library.

An α row is (L,) over the (gh, gw) grid in row-major order (see ARCHITECTURE.md). The steps
to a picture are: ``alpha_to_grid`` -> ``upsample_alpha`` -> ``normalise_maps`` ->
``colormap`` / ``overlay``. ``word_strip`` and ``strip_gif`` do all of it for a caption,
one panel per word as in the paper's figures. Only numpy, Pillow and scikit-image are used,
so the app and the CLI draw the same pixels.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Literal

import numpy as np

Method = Literal["nearest", "bilinear", "pyramid"]
NormMode = Literal["word", "caption", "global"]

GLOBAL_GAMMA = 0.5  # colour position = (α / global max)^γ in "global" normalisation
LABEL_HEIGHT = 20  # px of white band under each panel for its word
PANEL_GAP = 4  # px of white between panels in a strip

# Anchor colours sampled evenly from matplotlib's maps (0, 1/8, ..., 1) and interpolated
# linearly in RGB: close to, not identical with, matplotlib's 256-entry tables.
_EVEN_ANCHORS = {
    "viridis": ["#440154", "#482878", "#3e4989", "#31688e", "#26828e",
                "#1f9e89", "#35b779", "#6ece58", "#fde725"],
    "inferno": ["#000004", "#1b0c41", "#4a0c6b", "#781c6d", "#a52c60",
                "#cf4446", "#ed6925", "#fb9b06", "#fcffa4"],
    "gray": ["#000000", "#ffffff"],
}
# jet is piecewise linear per channel; these are matplotlib's own breakpoints (exact).
_JET = {
    "r": ((0.0, 0.35, 0.66, 0.89, 1.0), (0.0, 0.0, 1.0, 1.0, 0.5)),
    "g": ((0.0, 0.125, 0.375, 0.64, 0.91, 1.0), (0.0, 0.0, 1.0, 1.0, 0.0, 0.0)),
    "b": ((0.0, 0.11, 0.34, 0.65, 1.0), (0.5, 1.0, 1.0, 0.0, 0.0)),
}
COLORMAPS = (*_EVEN_ANCHORS, "jet")


def _hw(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def alpha_to_grid(alpha: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Reshape one α row (L,) to its (gh, gw) grid, row-major."""
    alpha = np.asarray(alpha, dtype=np.float64)
    gh, gw = grid
    if alpha.shape != (gh * gw,):
        raise ValueError(f"alpha of shape {alpha.shape} does not fit grid {grid} (expected ({gh * gw},))")
    return alpha.reshape(gh, gw)  # (L,) -> (gh, gw)


def _nearest(grid_map: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """Each output pixel takes the cell it falls in: exact blocks for integer factors."""
    (gh, gw), (h, w) = grid_map.shape[:2], out_hw
    rows = np.arange(h) * gh // h
    cols = np.arange(w) * gw // w
    return grid_map[rows][:, cols]  # (gh, gw) -> (H, W)


def upsample_alpha(
    alpha_grid: np.ndarray,
    size: int | tuple[int, int],
    *,
    method: Method = "pyramid",
    sigma: float | None = None,
) -> np.ndarray:
    """Upsample an α grid (gh, gw) to (H, W) float64 for display.

    "nearest" shows the raw cells; "bilinear" interpolates between cell centres; "pyramid" is
    the paper's figures: ``skimage.transform.pyramid_expand`` (bilinear then Gaussian blur,
    ``sigma`` in output pixels, skimage's default 2·factor/6 when None; the paper's look is
    factor 16 with sigma 20 for 14×14 -> 224). A non-integer or unequal factor is followed by
    a resize to the exact size. Attention mass is not preserved (values stay on α's scale,
    the blur lowers peaks); normalise with ``normalise_maps`` before colouring.
    """
    from skimage.transform import pyramid_expand, resize

    alpha_grid = np.asarray(alpha_grid, dtype=np.float64)
    (gh, gw), (h, w) = alpha_grid.shape, _hw(size)
    if method == "nearest":
        return _nearest(alpha_grid, (h, w))
    if method == "bilinear":
        return resize(alpha_grid, (h, w), order=1, mode="edge", anti_aliasing=False, preserve_range=True)
    if method == "pyramid":
        factor = max(h / gh, w / gw)
        up = pyramid_expand(alpha_grid, upscale=factor, sigma=sigma, preserve_range=True)  # (gh·f, gw·f)
        if up.shape != (h, w):
            up = resize(up, (h, w), order=1, mode="edge", anti_aliasing=False, preserve_range=True)  # (H, W)
        return up
    raise ValueError(f"unknown upsampling method {method!r}; use 'nearest', 'bilinear' or 'pyramid'")


def normalise_maps(maps: np.ndarray, mode: NormMode = "word", global_max: float | None = None) -> np.ndarray:
    """Scale (T, H, W) maps into [0, 1] for colouring.

    "word": each map by its own max (shows where each word looks, hides how sharply);
    "caption": all maps by the caption's max (compares words); "global": (α / ``global_max``)^GLOBAL_GAMMA,
    one fixed scale for every word, image and model — the square root keeps the typical α of a few
    percent visible instead of near-black. All-zero maps stay zero.
    """
    maps = np.asarray(maps, dtype=np.float64)
    if mode == "word":
        scale = maps.reshape(len(maps), -1).max(axis=1).reshape(-1, *[1] * (maps.ndim - 1))  # (T, 1, 1)
    elif mode == "caption":
        scale = np.asarray(maps.max() if maps.size else 0.0)
    elif mode == "global":
        if global_max is None:
            raise ValueError("normalise_maps(mode='global') needs global_max (e.g. 1.0)")
        scale = np.asarray(float(global_max))
    else:
        raise ValueError(f"unknown normalisation {mode!r}; use 'word', 'caption' or 'global'")
    safe = np.where(scale > 0, scale, 1.0)
    out = np.clip(np.where(scale > 0, maps / safe, 0.0), 0.0, 1.0)
    return out**GLOBAL_GAMMA if mode == "global" else out


@lru_cache(maxsize=None)
def _lut(name: str) -> np.ndarray:
    """(256, 3) uint8 table for a colormap name."""
    x = np.linspace(0.0, 1.0, 256)
    if name == "jet":
        rgb = np.stack([np.interp(x, *_JET[c]) for c in "rgb"], axis=1) * 255.0
    elif name in _EVEN_ANCHORS:
        anchors = np.array([[int(h[i : i + 2], 16) for i in (1, 3, 5)] for h in _EVEN_ANCHORS[name]], float)
        where = np.linspace(0.0, 1.0, len(anchors))
        rgb = np.stack([np.interp(x, where, anchors[:, c]) for c in range(3)], axis=1)
    else:
        raise ValueError(f"unknown colormap {name!r}; use one of {COLORMAPS}")
    return np.rint(rgb).astype(np.uint8)


def colormap(values: np.ndarray, name: str = "viridis") -> np.ndarray:
    """Map values in [0, 1] (H, W) to RGB uint8 (H, W, 3); out-of-range values are clipped."""
    values = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0)
    index = np.rint(np.clip(values, 0.0, 1.0) * 255).astype(np.intp)
    return _lut(name)[index]  # (H, W) -> (H, W, 3)


def _as_rgb(image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise ValueError(f"image must be uint8, got {image.dtype}")
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)  # (H, W) -> (H, W, 3)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"image must be (H, W, 3) RGB, got shape {image.shape}")
    return image


def overlay(image: np.ndarray, heat: np.ndarray, *, opacity: float = 0.6, cmap: str = "viridis") -> np.ndarray:
    """Blend a coloured heat map (H, W) in [0, 1] over an RGB uint8 image (H, W, 3)."""
    image = _as_rgb(image)
    if heat.shape != image.shape[:2]:
        raise ValueError(f"heat map {heat.shape} must match image {image.shape[:2]}; upsample it first")
    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f"opacity must be in [0, 1], got {opacity}")
    blend = (1.0 - opacity) * image + opacity * colormap(heat, cmap)
    return np.rint(blend).astype(np.uint8)


def coverage_map(alphas: np.ndarray) -> np.ndarray:
    """Σ_t α_t (L,): the attention each region got over the caption (the doubly stochastic
    penalty pushes every entry towards 1)."""
    return np.asarray(alphas, dtype=np.float64).sum(axis=0)  # (T, L) -> (L,)


def outline_masks(
    image: np.ndarray,
    masks: Sequence[np.ndarray],
    colour: tuple[int, int, int] | Sequence[tuple[int, int, int]] = (255, 0, 0),
) -> np.ndarray:
    """Draw the outline of each boolean mask on a copy of the image.

    ``colour`` is one RGB triple or one per mask. Masks of another size than the image are
    scaled to it (nearest), so masks at dataset resolution fit a resized panel.
    """
    from skimage.segmentation import find_boundaries

    out = _as_rgb(image).copy()
    colours = [colour] * len(masks) if np.ndim(colour) == 1 else list(colour)
    if len(colours) != len(masks):
        raise ValueError(f"got {len(colours)} colours for {len(masks)} masks")
    for mask, rgb in zip(masks, colours):
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != out.shape[:2]:
            mask = _nearest(mask, out.shape[:2])  # (h, w) -> (H, W)
        out[find_boundaries(mask, mode="inner")] = rgb
    return out


def _fit(image: np.ndarray, panel_size: int) -> np.ndarray:
    """Resize an RGB uint8 image to a square panel (the α grid covers the model's square input)."""
    from PIL import Image

    pil = Image.fromarray(_as_rgb(image))
    if pil.size != (panel_size, panel_size):
        pil = pil.resize((panel_size, panel_size), Image.Resampling.BILINEAR)
    return np.asarray(pil)  # (panel, panel, 3)


def attention_panels(
    image: np.ndarray,
    alphas: np.ndarray,
    grid: tuple[int, int],
    *,
    method: Method = "pyramid",
    sigma: float | None = None,
    norm_mode: NormMode = "word",
    global_max: float | None = None,
    opacity: float = 0.6,
    cmap: str = "viridis",
    panel_size: int = 112,
) -> list[np.ndarray]:
    """The plain image then one overlay per α row, each (panel_size, panel_size, 3) uint8."""
    base = _fit(image, panel_size)
    alphas = np.asarray(alphas, dtype=np.float64).reshape(-1, grid[0] * grid[1])  # (T, L)
    heats = np.zeros((len(alphas), panel_size, panel_size))  # (T, P, P)
    for t, alpha in enumerate(alphas):
        heats[t] = upsample_alpha(alpha_to_grid(alpha, grid), panel_size, method=method, sigma=sigma)
    heats = normalise_maps(heats, norm_mode, global_max)
    return [base] + [overlay(base, heat, opacity=opacity, cmap=cmap) for heat in heats]


# A TrueType font with α, β, Σ and × for the text drawn into figures (Pillow's default font has none of them): the
# explorer sets its bundled DejaVu Sans; else Debian's copy, else Pillow's default.
FONT_PATH: str | None = None
_SYSTEM_FONTS = ("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",)


@lru_cache(maxsize=16)
def _truetype(path: str, size: int) -> Any:
    from PIL import ImageFont

    return ImageFont.truetype(path, size)


def text_font(size: int) -> Any:
    """The font figures are labelled in (``FONT_PATH``, else a system DejaVu Sans, else Pillow's default)."""
    from pathlib import Path

    from PIL import ImageFont

    for path in (FONT_PATH, *_SYSTEM_FONTS):
        if path and Path(path).is_file():
            return _truetype(str(path), size)
    return ImageFont.load_default(size=size)


def label_panel(panel: np.ndarray, text: str) -> np.ndarray:
    """Add a white band of LABEL_HEIGHT px under a panel with ``text`` centred in it."""
    from PIL import Image, ImageDraw

    h, w = panel.shape[:2]
    canvas = Image.new("RGB", (w, h + LABEL_HEIGHT), "white")
    canvas.paste(Image.fromarray(panel), (0, 0))
    draw = ImageDraw.Draw(canvas)
    font = text_font(13)
    while text and draw.textlength(text, font=font) > w - 4:  # shorten words wider than the panel
        text = text[:-4] + "..." if len(text) > 4 else text[:-1]
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    draw.text(((w - (right - left)) / 2 - left, h + (LABEL_HEIGHT - (bottom - top)) / 2 - top), text,
              fill="black", font=font)
    return np.asarray(canvas)  # (H + LABEL_HEIGHT, W, 3)


def strip_shape(n_words: int, panel_size: int = 112, columns: int | None = None) -> tuple[int, int]:
    """(height, width) of ``word_strip`` for n words (+1 panel for the plain image)."""
    n = n_words + 1
    cols = min(columns or n, n)
    rows = math.ceil(n / cols)
    return rows * (panel_size + LABEL_HEIGHT) + (rows - 1) * PANEL_GAP, cols * panel_size + (cols - 1) * PANEL_GAP


def _check_words(words: Sequence[str], alphas: np.ndarray) -> None:
    if len(words) != len(alphas):
        raise ValueError(
            f"{len(words)} words for {len(alphas)} α rows: pass one word per step "
            "(e.g. words + ['<end>'] when α includes the end step, or alphas[:len(words)])"
        )


def word_strip(
    image: np.ndarray,
    words: Sequence[str],
    alphas: np.ndarray,
    grid: tuple[int, int],
    *,
    panel_size: int = 112,
    columns: int | None = None,
    **style: Any,
) -> np.ndarray:
    """The paper's figure as one RGB uint8 array: the plain image, then per word the image with
    that word's α laid over it and the word written under it; ``columns`` wraps into rows.
    ``style``: ``attention_panels``' method, sigma, norm_mode, global_max, opacity and cmap.

    ``image`` should be the square crop the model saw, so the grid lines up with it.
    Size: ``strip_shape(len(words), panel_size, columns)``.
    """
    _check_words(words, alphas)
    panels = attention_panels(image, alphas, grid, panel_size=panel_size, **style)
    labelled = [label_panel(p, t) for p, t in zip(panels, ["", *words])]
    height, width = strip_shape(len(words), panel_size, columns)
    cols = min(columns or len(labelled), len(labelled))
    strip = np.full((height, width, 3), 255, dtype=np.uint8)
    cell_h, cell_w = panel_size + LABEL_HEIGHT + PANEL_GAP, panel_size + PANEL_GAP
    for k, panel in enumerate(labelled):
        top, left = (k // cols) * cell_h, (k % cols) * cell_w
        strip[top : top + panel.shape[0], left : left + panel_size] = panel
    return strip


def strip_png(strip: np.ndarray) -> bytes:
    """Encode an RGB uint8 array as PNG bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(_as_rgb(strip)).save(buffer, format="PNG")
    return buffer.getvalue()


def strip_gif(
    image: np.ndarray,
    words: Sequence[str],
    alphas: np.ndarray,
    grid: tuple[int, int],
    *,
    duration_ms: int = 700,
    **panel_kw,
) -> bytes:
    """Animated GIF (looping): the plain image, then one frame per word with the word as caption.

    ``panel_kw`` are ``word_strip``'s styling keywords (method, sigma, norm_mode, global_max,
    opacity, cmap, panel_size). Pillow merges consecutive identical frames, so a repeated word
    with an identical map shows as one longer frame.
    """
    from PIL import Image

    _check_words(words, alphas)
    panels = attention_panels(image, alphas, grid, **panel_kw)
    frames = [Image.fromarray(label_panel(p, t)) for p, t in zip(panels, ["", *words])]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:],
                   duration=duration_ms, loop=0)
    return buffer.getvalue()


def alphas_json(
    words: Sequence[str], alphas: np.ndarray, betas: np.ndarray | None, grid: tuple[int, int],
    meta: dict | None = None,
) -> str:
    """JSON with the grid shape and, per step, the word, its α as a (gh, gw) nested list and β
    (null when the model has no gate); ``meta`` (caption, checkpoint, image, crop …) is kept under
    "meta". ``load_alphas_json`` reads it back."""
    _check_words(words, alphas)
    betas_list = [None] * len(words) if betas is None else [float(b) for b in np.asarray(betas).reshape(-1)]
    if len(betas_list) != len(words):
        raise ValueError(f"{len(betas_list)} β values for {len(words)} words")
    steps = [
        {"word": str(w), "alpha": alpha_to_grid(a, grid).tolist(), "beta": b}
        for w, a, b in zip(words, np.asarray(alphas), betas_list)
    ]
    return json.dumps({"grid": [int(grid[0]), int(grid[1])], **({"meta": meta} if meta else {}), "steps": steps})


def load_alphas_json(text: str) -> tuple[list[str], np.ndarray, np.ndarray | None, tuple[int, int]]:
    """Inverse of ``alphas_json``: (words, alphas (T, L), betas (T,) or None, grid)."""
    data = json.loads(text)
    grid = (int(data["grid"][0]), int(data["grid"][1]))
    steps = data["steps"]
    words = [s["word"] for s in steps]
    alphas = np.array([s["alpha"] for s in steps], dtype=np.float64).reshape(len(steps), grid[0] * grid[1])
    betas = None if any(s["beta"] is None for s in steps) else np.array([s["beta"] for s in steps])
    return words, alphas, betas, grid


# ---- colour bars, titles and metadata for figures that leave the app -----------------------------

def colormap_stops(name: str, n: int = 11) -> list[tuple[float, str]]:
    """(position, 'rgb(r,g,b)') stops of a colour map, for plotting libraries' colour scales."""
    lut = _lut(name)
    return [(float(x), "rgb({},{},{})".format(*lut[int(round(x * 255))])) for x in np.linspace(0.0, 1.0, n)]


def scale_ticks(vmax: float, gamma: float = 1.0, n: int = 5) -> list[tuple[float, float]]:
    """(colour position in [0, 1], α value) pairs for a colour bar whose top is ``vmax``.

    With ``gamma`` < 1 the α values are spread so the ticks sit evenly along the bar."""
    positions = np.linspace(0.0, 1.0, n)
    return [(float(p), float(vmax * p ** (1.0 / gamma))) for p in positions]


def colorbar_image(height: int, cmap: str, ticks: Sequence[tuple[float, float]], *, title: str = "α",
                   width: int = 90) -> np.ndarray:
    """A vertical colour bar (height, width, 3) uint8, full colour at the top, ticks labelled with α."""
    from PIL import Image, ImageDraw

    bar_w, top, bottom = 18, 24, 10
    canvas = Image.new("RGB", (width, height), "white")
    span = max(1, height - top - bottom)
    colours = _lut(cmap)[np.rint(np.linspace(255, 0, span)).astype(int)]  # (span, 3), top = 1
    canvas.paste(Image.fromarray(np.repeat(colours[:, None, :], bar_w, axis=1)), (4, top))
    draw = ImageDraw.Draw(canvas)
    font = text_font(13)
    draw.text((4, 4), title, fill="black", font=font)
    for position, value in ticks:
        y = top + (1.0 - position) * (span - 1)
        draw.line([(4 + bar_w, y), (8 + bar_w, y)], fill="black")
        draw.text((11 + bar_w, y - 7), f"{value:.3g}", fill="black", font=font)
    return np.asarray(canvas)


def with_colorbar(image: np.ndarray, bar: np.ndarray) -> np.ndarray:
    """``bar`` (cropped or padded to the image's height) to the right of ``image``."""
    h = image.shape[0]
    bar = bar[:h] if bar.shape[0] >= h else np.pad(bar, ((0, h - bar.shape[0]), (0, 0), (0, 0)), constant_values=255)
    return np.concatenate([_as_rgb(image), bar], axis=1)


def with_title(image: np.ndarray, lines: Sequence[str], *, size: int = 18) -> np.ndarray:
    """A white band above ``image`` holding ``lines`` of text (caption, checkpoint, image, crop)."""
    from PIL import Image, ImageDraw

    font = text_font(size)
    pad, line_h = 10, int(size * 1.4)
    h, w = image.shape[:2]
    canvas = Image.new("RGB", (w, h + 2 * pad + line_h * len(lines)), "white")
    draw = ImageDraw.Draw(canvas)
    for k, line in enumerate(lines):
        text = line
        while text and draw.textlength(text, font=font) > w - 2 * pad:
            text = text[:-4] + "..."
        draw.text((pad, pad + k * line_h), text, fill="black", font=font)
    canvas.paste(Image.fromarray(_as_rgb(image)), (0, 2 * pad + line_h * len(lines)))
    return np.asarray(canvas)
