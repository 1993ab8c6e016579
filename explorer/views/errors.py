"""Error analysis: the gallery's captions by score and error label; open any of them step by step."""

from __future__ import annotations

import dataclasses
import pandas as pd
import streamlit as st

from sat_core.errors import SatError
from sat_core.analysis import slice_metrics, word_type_correctness
from sat_core.grounding import ERROR_LABELS

from explorer import stepping
from explorer import resources as res
from explorer.components.text import draw_help
from explorer.guards import need_model
from explorer.state import context, set_pending


def records_table(records: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{
        "image_id": r["image_id"],
        "caption": r["caption"],
        "CIDEr": r["scores"].get("CIDEr"),
        "BLEU-4": r["scores"].get("BLEU-4"),
        "errors": ", ".join(r.get("errors") or []) or "—",
        "attention correctness": r.get("attention_correctness"),
        "objects": r.get("n_objects"),
        "reference": (r.get("references") or [""])[0],
    } for r in records])


def filter_ui(table: pd.DataFrame) -> pd.DataFrame:
    c1, c2, c3 = st.columns([2, 2, 1])
    labels = c1.multiselect("Error labels (any of)", list(ERROR_LABELS), key="err_labels")
    top = float(max(1.0, table["CIDEr"].max() if len(table) else 1.0))
    low, high = c2.slider("CIDEr range", 0.0, top, (0.0, top), key="err_cider")
    order = c3.selectbox("Sort by", ["CIDEr ↑ (worst first)", "CIDEr ↓", "image_id"], key="err_sort")
    keep = table["CIDEr"].between(low, high)
    if labels:
        keep &= table["errors"].apply(lambda e: any(label in e.split(", ") for label in labels))
    out = table[keep]
    if order.startswith("CIDEr"):
        return out.sort_values("CIDEr", ascending="↑" in order, kind="stable")
    return out.sort_values("image_id", kind="stable")


def open_in_step(image_id: int) -> None:
    """Show the scene in Step through, caption complete, ground-truth objects outlined."""
    set_pending(source="Gallery scene", scene=int(image_id), masks=True)
    st.session_state["step"] = 99
    st.session_state["forced"] = {}
    stepping.keep_on_next_change()
    st.switch_page("views/step.py")


def draw_summaries(data: dict) -> None:
    corpus, grounded, attention = data.get("corpus", {}), data.get("grounded", {}), data.get("attention", {})
    figures = [("CIDEr", corpus.get("CIDEr")), ("BLEU-4", corpus.get("BLEU-4")), ("ROUGE-L", corpus.get("ROUGE-L")),
               ("grounded precision", grounded.get("precision")), ("grounded recall", grounded.get("recall")),
               ("attention correctness", attention.get("correctness"))]
    for col, (label, value) in zip(st.columns(len(figures)), figures):
        col.metric(label, "—" if value is None else f"{value:.3f}")


def main() -> None:
    st.title("Error analysis")
    ctx = context()
    loaded = need_model(ctx)
    cfg = dataclasses.replace(ctx.decode, hard_mode="expect", seed=0)  # records are deterministic
    try:
        data = res.eval_records(res.stamp(loaded.path), ctx.world_dir, cfg, loaded)
    except SatError as err:
        st.error(str(err))
        st.stop()
    records = data.get("records") or []
    st.caption(f"{len(records)} images · records: {data.get('source', 'eval_records.json')}")
    draw_summaries(data)
    table = filter_ui(records_table(records))
    st.markdown(f"**{len(table)} images match.** Select a row to open it in *Step through*.")
    event = st.dataframe(table, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
                         key="err_table")
    rows = event.selection.rows if event is not None and hasattr(event, "selection") else []
    if rows:
        open_in_step(int(table.iloc[rows[0]]["image_id"]))
    ids = table["image_id"].tolist()
    gallery_ids = set(ctx.gallery.ids) if ctx.gallery is not None else set()
    c1, c2 = st.columns([3, 1])
    chosen = c1.selectbox("Open image", [i for i in ids if i in gallery_ids], key="err_open",
                          format_func=lambda i: f"Scene {i}")
    if c2.button("Open in step-through", key="err_open_button", disabled=chosen is None):
        open_in_step(chosen)
    st.subheader("Metrics per slice")
    st.dataframe(pd.DataFrame(slice_metrics(records)), hide_index=True, width="stretch")
    st.subheader("Attention correctness per word type")
    words = word_type_correctness(records)
    if words:
        st.dataframe(pd.DataFrame(words), hide_index=True, width="stretch")
    else:
        st.info("No generated word could be grounded to an object, so there is no attention correctness to show.")
    draw_help("What these numbers mean", (
        "CIDEr and BLEU-4 are per-image scores against the scene's five references (mean per slice; corpus "
        "BLEU pools counts, so the top row can differ). Error labels come from grounding the caption against "
        "the scene's objects. *Attention correctness* is the share of α, at the step that produced a word, that "
        "falls on the one object the word was matched to; compare it with the uniform baseline, that object's "
        "share of the image. An image's figure averages its shape, colour and size words (the kinds marked "
        "*in_attention_correctness*); words matched to several objects (plurals) are left out. The same "
        "records as `python -m sat_core.evaluate --records`."))


main()
