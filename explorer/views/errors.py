"""Error analysis: the gallery's captions by score and error label; open any of them step by step."""

from __future__ import annotations

import dataclasses
import pandas as pd
import streamlit as st

from sat_core.errors import SatError
from sat_core.evaluation.confidence import ConfidenceReference, kept_reference
from sat_core.evaluation.analysis import count_table, count_table_by_groups, slice_metrics, word_type_correctness

from explorer import stepping
from explorer import resources as res
from explorer.components.text import draw_help
from explorer.guards import need_model
from explorer.resources import Gallery
from explorer.state import Context, context, keep_choice, set_pending, write_url


def records_table(records: list[dict], gallery: Gallery | None,
                  reference: ConfidenceReference | None = None) -> pd.DataFrame:
    """One row per image: thumbnail, file name, caption, log p, scores, labels, references; with the checkpoint's
    confidence ``reference``, whether the model is unsure of the caption."""
    def thumb(r: dict) -> str:
        record = gallery.by_id.get(r["image_id"]) if gallery is not None else None
        return res.thumbnail(str(record.path)) if record is not None else ""

    searched = any("search_error" in r for r in records)  # evaluated with search_errors
    grounded = any(r.get("n_objects") is not None for r in records)  # a dataset with object masks
    table = pd.DataFrame([{
        "image": thumb(r),
        "file": r.get("filename", ""),
        "image_id": r["image_id"],
        "caption": r["caption"],
        "log p": r.get("logprob"),
        **({"unsure": "yes" if r.get("logprob") is not None and reference.unsure(r["logprob"]) else ""}
           if reference is not None else {}),
        "CIDEr": r["scores"].get("CIDEr"),
        "BLEU-4": r["scores"].get("BLEU-4"),
        "errors": ", ".join(r.get("errors") or []) or "—",
        "first wrong word": _first_wrong(r),
        "attention correctness": r.get("attention_correctness"),
        "objects": r.get("n_objects"),
        **({"search error": _search_cell(r)} if searched else {}),
        "references": " | ".join(r.get("references") or []),
    } for r in records])
    # without object masks there is nothing to ground: no columns of dashes
    return table if grounded or table.empty else table.drop(columns=["attention correctness", "objects"])


def _search_cell(record: dict) -> str:
    """yes: a reference outscores the caption under the model (a search error); no: the mistakes are the model's."""
    flag = record.get("search_error")
    if flag is None:
        return "—"
    return f"yes: {record['best_reference']['caption']}" if flag else "no"


SCORES = ("CIDEr", "BLEU-4", "attention correctness", "attention_correctness")  # shown to three decimals


def _first_wrong(record: dict) -> str:
    index = record.get("first_error")
    tokens = record.get("tokens") or []
    return f"{index + 1}: {tokens[index]}" if index is not None and index < len(tokens) else ""


def filter_ui(table: pd.DataFrame) -> pd.DataFrame:
    c1, c2, c3 = st.columns([2, 2, 1])
    present = sorted({label for cell in table["errors"] for label in cell.split(", ") if label != "—"})
    if "err_labels" in st.session_state:  # from a link: keep the labels this table has
        st.session_state["err_labels"] = [label for label in st.session_state["err_labels"] if label in present]
    labels = c1.multiselect("Error labels (any of)", present, key="err_labels")
    top = float(max(1.0, table["CIDEr"].max() if len(table) else 1.0))
    low, high = c2.slider("CIDEr range", 0.0, top, (0.0, top), key="err_cider")
    orders = ["CIDEr ↑ (worst first)", "CIDEr ↓", "log p ↑ (least sure first)", "image_id"]
    keep_choice("err_sort", orders)
    order = c3.selectbox("Sort by", orders, key="err_sort")
    keep = table["CIDEr"].between(low, high)
    if labels:
        keep &= table["errors"].apply(lambda e: any(label in e.split(", ") for label in labels))
    if "unsure" in table and c1.checkbox("Unsure captions only", key="err_unsure", help=UNSURE_HELP):
        keep &= table["unsure"] == "yes"
    out = table[keep]
    if order.startswith("CIDEr"):
        return out.sort_values("CIDEr", ascending="↑" in order, kind="stable")
    if order.startswith("log p"):
        return out.sort_values("log p", ascending=True, kind="stable")
    return out.sort_values("image_id", kind="stable")


UNSURE_HELP = ("Captions less likely under the model than all but a share of the captions it gave its validation "
               "images (the checkpoint's mark; the Caption page flags them). Not in the paper: a reading of the "
               "model's own probabilities, which changes no caption.")


def open_in_step(record: dict) -> None:
    """Show this record's image in Step through, replaying its caption (the beam's), stopped at its first wrong word
    (else the whole caption)."""
    set_pending(source="Gallery scene", scene=int(record["image_id"]), masks=True, follow=True)
    st.session_state[stepping.FROM_ERRORS] = {
        "image_id": int(record["image_id"]), "labels": list(record.get("errors") or []),
        "filter": list(st.session_state.get("err_labels") or []), "first_error": record.get("first_error"),
        "word": _first_wrong(record), "caption": record["caption"],
        "hallucinated": list(record.get("hallucinated") or []), "missed": list(record.get("missed") or [])}
    first = record.get("first_error")
    st.session_state["step"] = first + 1 if first is not None else stepping.PLAY_TO_END
    st.session_state["forced"] = {}
    stepping.keep_on_next_change()
    st.switch_page("views/step.py")


def draw_summaries(data: dict, n_images: int) -> None:
    """The corpus figures: one number over every image (not the mean of the per-image scores of the table)."""
    corpus, grounded, attention = data.get("corpus", {}), data.get("grounded", {}), data.get("attention", {})
    st.markdown(f"**Corpus figures, all {n_images} images** — BLEU and CIDEr pool every caption's n-grams, so they "
                "differ from the means of the per-image scores in the table and in *Metrics per slice*.")
    figures = [("CIDEr", corpus.get("CIDEr")), ("BLEU-4", corpus.get("BLEU-4")), ("ROUGE-L", corpus.get("ROUGE-L")),
               ("grounded precision", grounded.get("precision")), ("grounded recall", grounded.get("recall")),
               ("attention correctness", attention.get("correctness"))]
    if data.get("search"):
        figures.append(("search errors", data["search"].get("search_error_rate")))
    ceiling = attention.get("ceiling")  # evaluations since it was kept
    helps = {"attention correctness": None if ceiling is None else (
        f"Share of α on the named object. The most any α on this grid could put there (all of it on the cell "
        f"the object covers most): {ceiling:.3f}.")}
    for col, (label, value) in zip(st.columns(len(figures)), figures):
        col.metric(label, "—" if value is None else f"{value:.3f}", help=helps.get(label))


def _as_evaluated(loaded, cfg) -> bool:
    """Whether the sidebar decodes as the checkpoint's stored records were made: the settings it takes from the
    checkpoint (beam, length normalisation, length cap) unchanged."""
    made = loaded.decode_defaults()
    followed = ("beam_size", "length_norm", "max_len")
    return all(getattr(cfg, name) == getattr(made, name) for name in followed)


def records_decoding(data: dict, loaded, cfg) -> str:
    """How the records' captions were decoded: the stored evaluation's beam, else the sidebar's decoding."""
    from explorer.components.text import decoding_note

    beam = data.get("beam", cfg.beam_size)
    stored = "stored with the checkpoint" in str(data.get("source", ""))
    length_norm = loaded.length_norm if stored else cfg.length_norm
    max_len = (loaded.metrics or {}).get("max_len", cfg.max_len) if stored else cfg.max_len
    note = decoding_note(beam, length_norm, max_len, evaluated=loaded.evaluated)
    return f"The captions were {note[0].lower()}{note[1:]}"


def load_records(ctx, loaded, cfg) -> dict:
    """Records of every image of the dataset split: stored with the checkpoint (when the sidebar decodes as
    they were made), cached on disk, or computed now with a progress bar (then cached on disk for this
    checkpoint, dataset and decoding)."""
    gallery = ctx.gallery
    if gallery is None:
        st.error(ctx.gallery_error or "No dataset to analyse.")
        st.stop()
    key = res.stamp(loaded.path)
    try:
        stored = res.stored_records(loaded, gallery) if _as_evaluated(loaded, cfg) else None
        data = stored or res.cached_records(key, gallery, cfg)
        if data is None:
            bar = st.progress(0.0, text=f"Evaluating {len(gallery.ids)} images of {gallery.note} "
                                        "(once per checkpoint and decoding)…")
            data = res.compute_records(key, loaded, gallery, cfg,
                                       progress=lambda done, total: bar.progress(done / total, text=(
                                           f"Evaluating: {done} of {total} images decoded")))
            bar.empty()
    except SatError as err:
        st.error(str(err))
        st.stop()
    return data


def draw_records_table(records: list[dict], ctx: Context, reference: ConfidenceReference | None = None) -> None:
    """The filterable table of images; a selected row (or the picker) opens in *Step through*."""
    table = filter_ui(records_table(records, ctx.gallery, reference))
    st.markdown(f"**{len(table)} images match.** Select a row to open its image in *Step through*, stopped at "
                "its first wrong word.")
    event = st.dataframe(table, hide_index=True, width="stretch", on_select="rerun", selection_mode="single-row",
                         key="err_table", column_config={
                             "image": st.column_config.ImageColumn("image", width="small"),
                             "log p": st.column_config.NumberColumn("log p", format="%.2f",
                                                                    help="log p(caption) under the model"),
                             **{name: st.column_config.NumberColumn(name, format="%.3f") for name in SCORES}})
    by_id = {r["image_id"]: r for r in records}
    rows = event.selection.rows if event is not None and hasattr(event, "selection") else []
    if rows:
        open_in_step(by_id[int(table.iloc[rows[0]]["image_id"])])
    c1, c2 = st.columns([3, 1])
    ids = table["image_id"].tolist()
    chosen = c1.selectbox("Open image", ids, key="err_open",
                          format_func=lambda i: f"{by_id[i].get('filename') or i} — {by_id[i]['caption']}")
    if c2.button("Open in step-through", key="err_open_button", disabled=chosen is None):
        open_in_step(by_id[chosen])
    write_url()  # the filters are part of the link


def draw_word_types(records: list[dict]) -> None:
    """Attention correctness and the rest of α per word type."""
    st.subheader("Attention correctness per word type")
    words = word_type_correctness(records)
    if words:
        st.dataframe(pd.DataFrame(words), hide_index=True, width="stretch",
                     column_config={name: st.column_config.NumberColumn(name, format="%.3f") for name in
                                    ("attention_on_object", "uniform_baseline", "alpha_entropy", "mask_entropy",
                                     "on_other_objects", "beside_object")})
        st.caption("*alpha_entropy*: α's mean entropy in nats at these words; *mask_entropy*: the entropy α would "
                   "have spread over the named object exactly as its mask covers the cells. α below it is sharper "
                   "than the object (on part of it, or elsewhere), above it wider. *on_other_objects*: α's share on "
                   "the scene's other objects; *beside_object*: on the background within one cell of the named object; "
                   "what is left of 1 lies on background farther away. Empty for evaluation records saved before "
                   "they were kept: evaluate the checkpoint again.")
    else:
        st.info("No generated word could be grounded to an object, so there is no attention correctness to show.")


def draw_counts(records: list[dict]) -> None:
    """What the captions said of how many objects there are, against the scene."""
    for title, rows, about in (
        ("Counts: what the captions said against the scene", count_table(records),
         "Every scored count: a plural mention (\"two dogs\", or \"dogs\" without a number: said "
         "plural), and every group of identical objects in the scene that a caption named without one "
         "mention covering it all (\"a dog\" of two: said 1, the most of the group any one mention "
         "named). Rows: how many of that kind the scene holds. *right* is the count accuracy of the row."),
        ("Counts by the kind of scene", count_table_by_groups(records),
         "The same counts by how the scene's objects fall into groups of identical ones: *2 + 1* is a "
         "pair and one other object. A model that counts a pair alone well but *2 + 1* badly knows how "
         "many things stand there but not which kind there are two of."),
    ):
        if rows:
            st.subheader(title)
            st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch",
                         column_config={"right": st.column_config.NumberColumn("right", format="%.3f")})
            st.caption(about)


def main() -> None:
    st.title("Error analysis")
    ctx = context()
    loaded = need_model(ctx)
    cfg = dataclasses.replace(ctx.decode, hard_mode="expect", seed=0)  # records are deterministic
    data = load_records(ctx, loaded, cfg)
    records = data.get("records") or []
    st.caption(f"{len(records)} images · records: {data.get('source', 'eval_records.json')}")
    st.caption(records_decoding(data, loaded, cfg))
    draw_summaries(data, len(records))
    reference = kept_reference(loaded.config)  # None: no mark kept (or a malformed one)
    draw_records_table(records, ctx, reference)
    st.subheader("Metrics per slice: means of per-image scores")
    slices = pd.DataFrame(slice_metrics(records, reference)).dropna(axis=1, how="all")  # no grounding: no correctness
    st.dataframe(slices, hide_index=True, width="stretch",
                 column_config={name: st.column_config.NumberColumn(name, format="%.3f") for name in SCORES})
    draw_word_types(records)
    draw_counts(records)
    draw_help("What these numbers mean", (
        "CIDEr and BLEU-4 are per-image scores against the image's references (mean per slice; corpus "
        "BLEU pools counts, so the top row can differ). Error labels from the references hold for every dataset: "
        "*hallucinated_word* (a content word no reference uses), *missed_word* (a content word most references "
        "use), *repetition*, *unk*, *truncated* (cut at the length cap), *too_short* / *too_long*; content words "
        "are told from function words by how much likelier they are in an image's other references once one "
        "has them, learnt from the checkpoint's training captions; a caption that is one of its references has no "
        "word label, and a word that only comes before another missed one (\"an\" before \"orange\") is not "
        "missed. On scenes with known objects, grounding the caption adds *wrong_colour*, *wrong_shape* "
        "(scenes world: *wrong_category*, *wrong_place*), "
        "*missed_object*, *hallucinated_object* … *Attention correctness* is the share of α, at the step that produced a word, that "
        "falls on the one object the word was matched to; compare it with the uniform baseline, that object's "
        "share of the image. An image's figure averages its shape, category, colour and size words (the kinds marked "
        "*in_attention_correctness*); words matched to several objects (plurals) are left out. The same "
        "records as `python -m sat_core.evaluate --records`. *search error*: *yes* when the model itself scores "
        "one of the references (shown) higher than the caption beam search returned, so a better search "
        "would have helped; *no* when it prefers its own caption to every reference, so the caption's "
        "mistakes are the model's (`--search-errors`). *log p*: the caption's log-probability under the model; "
        "*unsure*: under the checkpoint's mark, the log p of the 10 % least likely captions it gave its validation "
        "images (not in the paper: it reads the model's probabilities, it changes no caption), with slices of "
        "its own among the metrics per slice."))


main()
