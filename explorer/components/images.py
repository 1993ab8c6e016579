"""Images with annotations drawn on them."""

from __future__ import annotations

import numpy as np
import streamlit as st

from sat_core import viz


def draw_crop_view(image: np.ndarray, seen: np.ndarray, caption: str) -> None:
    """The image with everything outside ``seen`` (bool (H, W)) dimmed and the seen square outlined."""
    dimmed = np.where(seen[..., None], image, (image * 0.35 + 255 * 0.65).astype(np.uint8))  # (H, W, 3)
    st.image(viz.outline_masks(dimmed, [seen], (220, 0, 0)), caption=caption, width="stretch")
