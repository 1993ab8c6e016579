"""Look elsewhere: decode again with attention kept out of (or forced into) a region of the grid,
and compare the two captions word by word."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from sat_core.decoding import Hypothesis, Intervention, ScoredCaption
from sat_core.errors import SatError
from sat_core.regions import format_cells, grid_region, mask_on_grid, parse_cells
from sat_core.data.words import WordEdit, first_change, word_diff

from explorer import maps
from explorer import resources as res
from explorer.components.figures import draw_alpha
from explorer.components.regions import region_figure, selection_cells
from explorer.components.text import draw_help
from explorer.guards import beams, decoding_line, need_image, need_model, object_label, object_masks
from explorer.resources import PreparedImage
from explorer.state import Context, clamp, context, keep_choice

MODES = {"exclude": "Keep attention out of the region", "include": "Force attention into the region"}
HOW = {"rect": "Rectangle of grid cells", "drawn": "Drawn on the image", "object": "Ground-truth object"}


def _drawn(grid: tuple[int, int], side: int):
    """on_select callback: the cells of a box or lasso become the region (and the link's ew_cells)."""
    def on_select() -> None:
        event = st.session_state.get("ew_draw") or {}
        cells = selection_cells(event.get("selection"), grid, side)
        if cells.any():
            st.session_state["ew_cells"] = format_cells(cells)
            st.session_state["ew_how"] = "drawn"
    return on_select


def region_ui(image: PreparedImage, grid: tuple[int, int]) -> np.ndarray:
    """The chosen region (gh, gw): drawn on the image, a rectangle of cells, or a scene object."""
    gh, gw = grid
    masks = object_masks(image)
    options = [h for h in HOW if h != "object" or masks]
    keep_choice("ew_how", options)
    # A scene opens on its largest object (the one its caption most likely names): blocking it shows at once what
    # the caption does without looking there. Uploads have no objects: a rectangle of cells.
    st.session_state.setdefault("ew_how", "object" if masks else "rect")
    how = st.radio("Choose the region by", options, format_func=HOW.get, key="ew_how", horizontal=True)
    if how == "object":
        objects = image.record.objects
        keep_choice("ew_object", list(range(len(objects))))
        st.session_state.setdefault("ew_object", max(range(len(masks)), key=lambda i: int(masks[i].sum())))
        index = st.selectbox("Object", range(len(objects)), format_func=lambda i: object_label(objects[i]),
                             key="ew_object")
        return mask_on_grid(masks[index], image.crop_info, grid)
    if how == "drawn":
        try:
            return parse_cells(st.session_state.get("ew_cells") or "", grid)
        except SatError as err:
            st.error(str(err))
            return np.zeros(grid, dtype=bool)
    st.session_state.setdefault("ew_rows", (gh // 4, gh // 2))
    st.session_state.setdefault("ew_cols", (gw // 4, gw // 2))
    clamp("ew_rows", 0, gh - 1)
    clamp("ew_cols", 0, gw - 1)
    c1, c2 = st.columns(2)
    rows = c1.slider("Rows (top to bottom)", 0, gh - 1, key="ew_rows")
    cols = c2.slider("Columns (left to right)", 0, gw - 1, key="ew_cols")
    return grid_region(grid, range(rows[0], rows[1] + 1), range(cols[0], cols[1] + 1))


def draw_picker(image: PreparedImage, grid: tuple[int, int], region: np.ndarray) -> None:
    st.plotly_chart(region_figure(image.crop, grid, region), key="ew_draw", width="stretch",
                    on_select=_drawn(grid, image.crop.shape[0]), selection_mode=("box", "lasso"))
    st.caption("Drag a box (or pick the lasso in the chart's toolbar) over the image to choose the cells; "
               "a cell counts when its centre is inside. White squares: the cells in use.")


def mean_alpha_scale(hyp: Hypothesis, image: PreparedImage, ctx: Context) -> maps.ColourScale:
    mean_alpha = hyp.alphas.mean(axis=0).reshape(1, -1)  # (1, L): where the caption looked on average
    return maps.colour_scale(image.crop.shape[0], mean_alpha, hyp.grid, ctx.maps, t=0, title="mean α")


def draw_result(title: str, hyp: Hypothesis, image: PreparedImage, ctx: Context, region: np.ndarray,
                key: str, scale: maps.ColourScale) -> None:
    """One caption and its mean α, on ``scale`` (shared by the two results, so their maps compare)."""
    st.markdown(f"#### {title}")
    st.markdown(f"**Caption:** {hyp.caption}")
    st.caption(f"log p = {hyp.logprob:.2f}")
    words = maps.step_words(hyp.words, len(hyp.alphas))
    mean_alpha = hyp.alphas.mean(axis=0).reshape(hyp.grid)  # (gh, gw): where the caption looked on average
    overlay = maps.overlay_on_scale(image.crop, mean_alpha.reshape(-1), hyp.grid, ctx.maps, scale)
    draw_alpha(overlay, mean_alpha, key=key, region=region, value_name="mean α", height=320,
               title="mean α over the caption", scale=scale)
    st.image(maps.strip_with_scale(image.crop, words, hyp.alphas, hyp.grid, ctx.maps, columns=5))


def _with_end(hyp: Hypothesis) -> list[str]:
    return [*hyp.words, "<end>"] if hyp.finished else list(hyp.words)


def diff_table(edits: list[WordEdit], before: ScoredCaption, after: ScoredCaption) -> pd.DataFrame:
    """The two captions aligned word by word, with log p of the original caption's words without and
    with the intervention (teacher forcing) and their difference."""
    rows = []
    for e in edits:
        i = e.before_index
        lp0 = float(before.logprobs[i]) if i is not None else np.nan
        lp1 = float(after.logprobs[i]) if i is not None else np.nan
        rows.append({"word without": e.before or "", "word with": e.after or "", "change": e.op,
                     "log p without": round(lp0, 3), "log p with": round(lp1, 3), "Δ log p": round(lp1 - lp0, 3)})
    return pd.DataFrame(rows)


def verdict(edits: list[WordEdit], before: ScoredCaption, after: ScoredCaption) -> str:
    """What the numbers show, and nothing more."""
    delta = after.logprobs - before.logprobs  # (T,) per word of the original caption
    k = int(np.argmax(np.abs(delta)))
    words = [*before.words, "<end>"]
    moved = (f"Scored word by word under the intervention, the original caption's log p moved by "
             f"**{delta.sum():+.2f} nats** in total (largest change at word {k + 1} “{words[k]}”: {delta[k]:+.2f}).")
    change = first_change(edits)
    if change is None:
        return f"**The caption did not change.** {moved}"
    counts = {op: sum(e.op == op for e in edits) for op in ("replaced", "dropped", "added")}
    at = (change.before_index if change.before_index is not None else change.after_index) + 1
    what = {"replaced": f"“{change.before}” became “{change.after}”", "dropped": f"“{change.before}” was dropped",
            "added": f"“{change.after}” was added"}[change.op]
    summary = ", ".join(f"{n} {op}" for op, n in counts.items() if n)
    return f"**The caption changed at word {at}**: {what} ({summary}). {moved}"


def main() -> None:
    st.title("Look elsewhere")
    ctx = context()
    loaded = need_model(ctx)
    image = need_image(ctx)
    original = beams(ctx)[0]
    left, right = st.columns([2, 3])
    with left:
        region = region_ui(image, original.grid)
        keep_choice("ew_mode", list(MODES))
        mode = st.radio("Intervention", list(MODES), format_func=MODES.get, key="ew_mode")
    with right:
        draw_picker(image, original.grid, region)
    if not region.any():
        st.info("No cells chosen yet: drag a box or a lasso over the image.")
        st.stop()
    st.caption(f"{int(region.sum())} of {region.size} cells chosen (white squares). At every step α is set to zero "
               f"{'inside' if mode == 'exclude' else 'outside'} the region and renormalised.")
    cells = f"{mode}:{format_cells(region)}"
    edit = Intervention(region, mode)
    ckpt = res.stamp(loaded.path)
    try:
        changed = beams(ctx, intervention=edit, region_key=cells)[0]
        tokens = _with_end(original)
        before = res.score(ckpt, image.key, original.caption, loaded, image.tensor) if original.words else None
        after = (res.score(ckpt, image.key, original.caption, loaded, image.tensor, cells, edit)
                 if original.words else None)
    except SatError as err:
        st.error(str(err))
        st.stop()
    st.subheader("What changed")  # the finding first, in view; the maps that show it below
    st.markdown(f"Without the intervention: **{original.caption}** · {MODES[mode].lower()}: **{changed.caption}**")
    if before is None:
        st.info("The original caption is empty; there are no words to compare.")
        return
    edits = word_diff(tokens, _with_end(changed))
    st.markdown(verdict(edits, before, after))
    st.caption(f"Both captions: {decoding_line(ctx)[0].lower()}{decoding_line(ctx)[1:]} The second decodes "
               "the same way with the intervention on α.")
    with st.expander("Word by word"):
        st.dataframe(diff_table(edits, before, after), hide_index=True, width="stretch")
        st.caption("Rows align the caption without the intervention (left words) with the one decoded with it "
                   "(right words). log p columns: each word of the original caption, teacher-forced without and "
                   "with the intervention; an added word has none.")
    scale = maps.shared_scale([mean_alpha_scale(h, image, ctx) for h in (original, changed)])
    st.caption(f"Both mean-α maps on one colour scale: full colour is α = {scale.vmax:.3g}.")
    c1, c2 = st.columns(2)
    with c1:
        draw_result("Where the model looked", original, image, ctx, region, "ew_original", scale)
    with c2:
        draw_result(f"{MODES[mode]}", changed, image, ctx, region, "ew_changed", scale)
    draw_help("Where it looked vs what it used", (
        "An attention map shows where the model looked. Editing α (removing a region, or allowing only it) and "
        "decoding again shows how the output moves when that region cannot be (or must be) attended; the "
        "numbers above say what moved, by how much, and nothing about why."))


main()
