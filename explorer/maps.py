"""How α maps are drawn: the user's display settings and the sat_core.viz calls that apply them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sat_core import viz

# The figures' text (colour bar titles, slide headers) in DejaVu Sans, which has α, β, Σ and × (LICENSE-DejaVu.txt).
FONT = Path(__file__).resolve().parent / "assets" / "fonts" / "DejaVuSans.ttf"
viz.FONT_PATH = str(FONT)

METHODS = {"nearest": "Raw grid cells", "bilinear": "Bilinear", "pyramid": "Pyramid + Gaussian (paper)"}
NORMS = {"word": "Per word", "caption": "Per caption", "global": "Global (α = 1 is full colour)"}


@dataclass(frozen=True)
class MapSettings:
    method: str = "nearest"
    sigma: float = 0.0  # pyramid only; 0 = scikit-image's default for the factor
    norm: str = "word"
    opacity: float = 0.6
    cmap: str = "viridis"
    coverage: bool = False

    def viz_kwargs(self) -> dict:
        return {"method": self.method, "sigma": self.sigma or None, "norm_mode": self.norm,
                "global_max": 1.0 if self.norm == "global" else None,
                "opacity": self.opacity, "cmap": self.cmap}


@dataclass(frozen=True)
class ColourScale:
    """What the colours of a drawn map stand for: full colour is α = ``vmax``, position = (α / vmax)^γ."""

    cmap: str
    vmax: float
    gamma: float = 1.0
    title: str = "α"

    def ticks(self, n: int = 5) -> list[tuple[float, float]]:
        return viz.scale_ticks(self.vmax, self.gamma, n)


def colour_scale(side: int, alphas: np.ndarray, grid: tuple[int, int], settings: MapSettings,
                 t: int | None = None, *, title: str = "α") -> ColourScale:
    """The scale of map ``t`` (or of all maps) as drawn at ``side`` px: its own max (per word), the
    caption's max, or the fixed global scale. Maxima are taken after upsampling, as the colours are."""
    if settings.norm == "global":
        return ColourScale(settings.cmap, 1.0, viz.GLOBAL_GAMMA, title)
    rows = np.asarray(alphas).reshape(-1, grid[0] * grid[1])  # (T, L)
    if settings.norm == "word" and t is not None:
        rows = rows[t : t + 1]
    peak = max((float(viz.upsample_alpha(viz.alpha_to_grid(a, grid), side, method=settings.method,
                                         sigma=settings.sigma or None).max()) for a in rows), default=0.0)
    return ColourScale(settings.cmap, peak or 1.0, 1.0, title)


def scale_note(settings: MapSettings) -> str:
    """Which colour scale a strip is drawn on, in words."""
    if settings.norm == "word":
        return ("Colour scale: each panel its own (per word), so the bar reads in shares of a panel's peak and each "
                "label gives that peak α; choose *Per caption* under *α map display* for one scale across panels.")
    if settings.norm == "caption":
        return "Colour scale: one for every panel (per caption): full colour is the caption's highest α."
    return "Colour scale: the fixed global one (α = 1 is full colour, square-root spacing), the same for every image."


def shared_scale(scales: Sequence[ColourScale]) -> ColourScale:
    """One scale for maps drawn side by side: the highest of their peaks (the global scale stays as it is)."""
    first = scales[0]
    if first.gamma != 1.0:  # global: fixed already
        return first
    return ColourScale(first.cmap, max(s.vmax for s in scales), 1.0, first.title)


def overlay_on_scale(crop: np.ndarray, alpha: np.ndarray, grid: tuple[int, int], settings: MapSettings,
                     scale: ColourScale) -> np.ndarray:
    """One α map (L,) over the crop, coloured on ``scale`` (full colour = scale.vmax)."""
    if scale.gamma == 1.0:  # linear in α up to vmax (viz's global mode is square-root spaced)
        heat = viz.upsample_alpha(viz.alpha_to_grid(np.asarray(alpha), grid), crop.shape[0], method=settings.method,
                                  sigma=settings.sigma or None)  # (S, S)
        heat = np.clip(heat / (scale.vmax or 1.0), 0.0, 1.0)
        return viz.overlay(crop, heat, opacity=settings.opacity, cmap=settings.cmap)
    kwargs = {**settings.viz_kwargs(), "norm_mode": "global", "global_max": scale.vmax}
    return viz.attention_panels(crop, np.asarray(alpha).reshape(1, -1), grid, panel_size=crop.shape[0], **kwargs)[1]


def colorbar(height: int, scale: ColourScale) -> np.ndarray:
    return viz.colorbar_image(height, scale.cmap, scale.ticks(), title=scale.title)


def overlays(crop: np.ndarray, alphas: np.ndarray, grid: tuple[int, int], settings: MapSettings) -> list[np.ndarray]:
    """One overlay (S, S, 3) per α row (T, L), normalised together as the settings say."""
    if len(alphas) == 0:
        return []
    panels = viz.attention_panels(crop, np.asarray(alphas), grid, panel_size=crop.shape[0], **settings.viz_kwargs())
    return panels[1:]  # panels[0] is the plain image


def coverage_overlay(crop: np.ndarray, alphas: np.ndarray, grid: tuple[int, int],
                     settings: MapSettings) -> tuple[np.ndarray, np.ndarray]:
    """(overlay of Σ_t α_t scaled by its own max, the coverage grid (gh, gw))."""
    cover = viz.coverage_map(np.asarray(alphas).reshape(len(alphas), -1)).reshape(grid)  # (gh, gw)
    kwargs = {**settings.viz_kwargs(), "norm_mode": "word", "global_max": None}
    return viz.attention_panels(crop, cover.reshape(1, -1), grid, panel_size=crop.shape[0], **kwargs)[1], cover


def coverage_scale(side: int, cover: np.ndarray, grid: tuple[int, int], settings: MapSettings) -> ColourScale:
    """The coverage map is always drawn against its own max (``coverage_overlay``)."""
    own = MapSettings(settings.method, settings.sigma, "word", settings.opacity, settings.cmap)
    return colour_scale(side, np.asarray(cover).reshape(1, -1), grid, own, t=0, title="Σα")


def strip(crop: np.ndarray, words: Sequence[str], alphas: np.ndarray, grid: tuple[int, int],
          settings: MapSettings, columns: int | None = 8) -> np.ndarray:
    """The paper's per-word figure, one panel per α row."""
    return viz.word_strip(crop, list(words), np.asarray(alphas), grid, panel_size=112, columns=columns,
                          **settings.viz_kwargs())


def strip_with_scale(crop: np.ndarray, words: Sequence[str], alphas: np.ndarray, grid: tuple[int, int],
                     settings: MapSettings, *, panel_size: int = 160, columns: int | None = 6) -> np.ndarray:
    """The per-word strip with a colour bar in real α values. Per-word normalisation gives every panel
    its own scale: the bar then reads in shares of a word's peak, and each label carries that peak."""
    side = crop.shape[0]
    labels = list(words)
    if settings.norm == "word":
        peaks = [colour_scale(side, alphas, grid, settings, t=t).vmax for t in range(len(labels))]
        labels = [f"{w} · {p:.2f}" for w, p in zip(labels, peaks)]
        scale = ColourScale(settings.cmap, 1.0, 1.0, "of peak")
    else:
        scale = colour_scale(side, alphas, grid, settings)
    image = viz.word_strip(crop, labels, np.asarray(alphas), grid, panel_size=panel_size, columns=columns,
                           **settings.viz_kwargs())
    return viz.with_colorbar(image, colorbar(max(image.shape[0], 160), scale))


def slide_panel_size(n_panels: int, columns: int = 6, width: int = 1600) -> int:
    """Panel side that makes a strip of ``n_panels`` (with its colour bar) at least ``width`` px wide."""
    cols = min(n_panels, columns)
    return max(256, -(-(width - 90 - (cols - 1) * viz.PANEL_GAP) // cols))


def step_words(words: Sequence[str], n_alphas: int) -> list[str]:
    """One label per α row: the words, then '<end>' for the step that ended the caption."""
    labels = list(words)[:n_alphas]
    return labels + ["<end>"] * (n_alphas - len(labels))
