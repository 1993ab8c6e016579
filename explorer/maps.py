"""How α maps are drawn: the user's display settings and the sat_core.viz calls that apply them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sat_core import viz

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


def strip(crop: np.ndarray, words: Sequence[str], alphas: np.ndarray, grid: tuple[int, int],
          settings: MapSettings, columns: int | None = 8) -> np.ndarray:
    """The paper's per-word figure, one panel per α row."""
    return viz.word_strip(crop, list(words), np.asarray(alphas), grid, panel_size=112, columns=columns,
                          **settings.viz_kwargs())


def step_words(words: Sequence[str], n_alphas: int) -> list[str]:
    """One label per α row: the words, then '<end>' for the step that ended the caption."""
    labels = list(words)[:n_alphas]
    return labels + ["<end>"] * (n_alphas - len(labels))
