"""Look elsewhere: decode again with attention kept out of (or forced into) a region of the grid."""

from __future__ import annotations

import numpy as np
import streamlit as st

from sat_core.decoding import Hypothesis, Intervention
from sat_core.errors import SatError
from sat_core.regions import grid_region, mask_on_grid

from explorer import maps
from explorer.components.figures import draw_alpha
from explorer.components.text import draw_help
from explorer.guards import beams, need_image, need_model, object_label, object_masks
from explorer.resources import PreparedImage
from explorer.state import Context, context

MODES = {"exclude": "Keep attention out of the region", "include": "Force attention into the region"}


def region_ui(image: PreparedImage, grid: tuple[int, int]) -> tuple[np.ndarray, str]:
    """The chosen region (gh, gw) and a short key naming it."""
    gh, gw = grid
    masks = object_masks(image)
    how = "Rectangle of grid cells"
    if masks:
        how = st.radio("Choose the region by", ["Rectangle of grid cells", "Ground-truth object"], key="ew_how",
                       horizontal=True)
    if how == "Ground-truth object":
        objects = image.record.objects
        index = st.selectbox("Object", range(len(objects)), format_func=lambda i: object_label(objects[i]),
                             key="ew_object")
        region = mask_on_grid(masks[index], image.crop_info, grid)
        return region, f"object{index}"
    c1, c2 = st.columns(2)
    rows = c1.slider("Rows (top to bottom)", 0, gh - 1, (gh // 4, gh // 2), key="ew_rows")
    cols = c2.slider("Columns (left to right)", 0, gw - 1, (gw // 4, gw // 2), key="ew_cols")
    region = grid_region(grid, range(rows[0], rows[1] + 1), range(cols[0], cols[1] + 1))
    return region, f"r{rows[0]}-{rows[1]}c{cols[0]}-{cols[1]}"


def draw_result(title: str, hyp: Hypothesis, image: PreparedImage, ctx: Context, region: np.ndarray,
                key: str) -> None:
    st.markdown(f"#### {title}")
    st.markdown(f"**Caption:** {hyp.caption or '(empty)'}")
    st.caption(f"log p = {hyp.logprob:.2f}")
    words = maps.step_words(hyp.words, len(hyp.alphas))
    mean_alpha = hyp.alphas.mean(axis=0).reshape(hyp.grid)  # (gh, gw): where the caption looked on average
    overlay = maps.overlays(image.crop, mean_alpha.reshape(1, -1), hyp.grid, ctx.maps)[0]
    draw_alpha(overlay, mean_alpha, key=key, region=region, value_name="mean α", height=320,
               title="mean α over the caption")
    st.image(maps.strip(image.crop, words, hyp.alphas, hyp.grid, ctx.maps, columns=5))


def main() -> None:
    st.title("Look elsewhere")
    ctx = context()
    need_model(ctx)
    image = need_image(ctx)
    original = beams(ctx)[0]
    region, region_key = region_ui(image, original.grid)
    mode = st.radio("Intervention", list(MODES), format_func=MODES.get, key="ew_mode", horizontal=True)
    st.caption(f"{int(region.sum())} of {region.size} cells chosen (white squares). At every step α is set to zero "
               f"{'inside' if mode == 'exclude' else 'outside'} the region and renormalised.")
    try:
        changed = beams(ctx, intervention=Intervention(region, mode), region_key=f"{mode}:{region_key}")[0]
    except SatError as err:
        st.error(str(err))
        st.stop()
    left, right = st.columns(2)
    with left:
        draw_result("Where the model looked", original, image, ctx, region, "ew_original")
    with right:
        draw_result(f"{MODES[mode]}", changed, image, ctx, region, "ew_changed")
    same = changed.words == original.words
    st.markdown("**The caption did not change**: its words did not depend on that region."
                if same else "**The caption changed**: the words it lost depended on what the model saw there.")
    draw_help("Where it looked vs what it used", (
        "An attention map shows where the model looked, not what its words depended on. Removing a region "
        "from α (or allowing only that region) and decoding again tests the dependence directly."))


main()
