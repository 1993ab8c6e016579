"""Soft vs hard: two checkpoints teacher-forced on the SAME caption, word by word, with seeded
hard-attention locations drawn on the map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from sat_core.checkpoint import LoadedCheckpoint
from sat_core.decoding import SampledPaths, ScoredCaption
from sat_core.errors import SatError
from sat_core.data.words import caption_words

from explorer import maps
from explorer import resources as res
from explorer.components.figures import alpha_figure
from explorer.components.marks import add_location_marks
from explorer.components.text import draw_caption, draw_help, supervised_note
from explorer.guards import beams, decoding_line, image_for, need_image
from explorer.state import Context, clamp, context, keep_choice

SOURCES = {"soft": "the left model's caption", "hard": "the right model's caption", "reference": "a reference",
           "typed": "typed"}


def follow_sidebar(ctx: Context) -> None:
    """The sidebar's checkpoint takes the side of its kind (left: soft, right: hard) whenever it changes, so this page
    reads the checkpoint every other page reads; the other side stays as chosen."""
    if ctx.ckpt_name is None or st.session_state.get("_cmp_for") == ctx.ckpt_name:
        return
    first = "_cmp_for" not in st.session_state
    st.session_state["_cmp_for"] = ctx.ckpt_name
    if first and ("cmp_soft" in st.query_params or "cmp_hard" in st.query_params):
        return  # a link names both sides: it wins on the session's first visit
    hard = res.checkpoint_summary(ctx.checkpoints[ctx.ckpt_name])["attention"] == "hard"
    st.session_state["cmp_hard" if hard else "cmp_soft"] = ctx.ckpt_name


def _pick(ctx: Context, label: str, key: str, attention: str) -> str | None:
    names = list(ctx.checkpoints)
    if not names:
        return None
    keep_choice(key, names)
    if key not in st.session_state:  # a checkpoint of the side's kind that loads
        kinds = [n for n in names if res.checkpoint_summary(ctx.checkpoints[n])["attention"] == attention]
        st.session_state[key] = next((n for n in kinds if _loads(ctx, n)), kinds[0] if kinds else names[0])
    return st.selectbox(label, names, key=key,
                        format_func=lambda n: f"{n} ({res.checkpoint_summary(ctx.checkpoints[n])['attention']})")


def _loads(ctx: Context, name: str) -> bool:
    try:
        _load(ctx, name)
    except SatError:
        return False
    return True


def _load(ctx: Context, name: str) -> LoadedCheckpoint:
    path = ctx.checkpoints[name]
    roots = tuple(str(r) for r in ctx.settings.checkpoint_roots)
    return res.load_model(path, roots, ctx.settings.device, res.stamp(Path(path)))


def caption_ui(ctx: Context, models: list[tuple[str, LoadedCheckpoint]]) -> str:
    """The caption both models read: either model's decode, a reference of the scene, or typed text."""
    references = ctx.image.references
    options = [s for s in SOURCES if s != "reference" or references]
    keep_choice("cmp_source", options)
    c1, c2 = st.columns([2, 3])
    source = c1.radio("Caption both models read", options, key="cmp_source", horizontal=True,
                      format_func=SOURCES.get)
    with c2:
        if source in ("soft", "hard"):
            name, loaded = models[0 if source == "soft" else 1]
            hyp = beams(ctx, loaded)[0]
            st.markdown(f"{name}'s caption (as on *Caption*): **{hyp.caption}**")
            st.caption(decoding_line(ctx, loaded))
            return hyp.caption
        if source == "reference":
            keep_choice("cmp_ref", list(range(len(references))))
            index = st.selectbox("Reference", range(len(references)), key="cmp_ref",
                                 format_func=lambda i: f"{i + 1}: {references[i]}")
            return references[index]
        st.session_state.setdefault("cmp_text", references[0] if references else "")
        return st.text_input("Caption", key="cmp_text", help="Case and punctuation are ignored.")


SCALES = {"shared": "one for both maps", "own": "each map its own"}


def side_scale(ctx: Context, loaded: LoadedCheckpoint, scored: ScoredCaption, t: int) -> maps.ColourScale:
    image = image_for(ctx, loaded)
    return maps.colour_scale(image.crop.shape[0], scored.alphas, scored.grid, ctx.maps, t=t)


def draw_side(ctx: Context, name: str, loaded: LoadedCheckpoint, scored: ScoredCaption, t: int,
              paths: SampledPaths | None, scale: maps.ColourScale) -> None:
    """One model reading word t: its α_t on ``scale``, log p of the word, β (soft) or sampled locations (hard)."""
    image = image_for(ctx, loaded)
    hard = loaded.model.hard
    words = [*scored.words, "<end>"]
    st.markdown(f"#### {name} · {'hard' if hard else 'soft'} attention")
    if loaded.optim is not None and loaded.optim.attention_lambda > 0:
        st.caption(supervised_note(loaded.optim.attention_lambda))
    overlay = maps.overlay_on_scale(image.crop, scored.alphas[t], scored.grid, ctx.maps, scale)
    alpha = scored.alphas[t].reshape(scored.grid)  # (gh, gw)
    fig = alpha_figure(overlay, alpha, title=f"step {t + 1}: “{words[t]}”", scale=scale)
    if paths is not None:
        add_location_marks(fig, paths.locations[:, t], scored.grid, overlay.shape[0])
    st.plotly_chart(fig, key=f"cmp_alpha_{name}", width="stretch")
    r, c = np.unravel_index(int(alpha.argmax()), alpha.shape)
    facts = [f"log p(“{words[t]}”) = {scored.logprobs[t]:.3f}", f"max α_t = {float(alpha.max()):.3f} at row {r}, col {c}"]
    facts.append("no β gate (hard attention)" if hard else f"β_t = {float(scored.betas[t]):.3f}")
    st.caption(" · ".join(facts))
    if paths is not None:
        n = len(paths.locations)
        at_peak = int((paths.locations[:, t] == alpha.argmax()).sum())
        st.caption(f"Red ×: where {n} sampled paths s̃ ~ Multinoulli(α) looked at this word (seed {paths.seed}; "
                   f"a number counts samples on one cell); {at_peak} of {n} on the cell of max α. The map shows "
                   "the expectation α (test time).")


def word_table(words: list[str], names: list[str], scored: list[ScoredCaption]) -> pd.DataFrame:
    """Per word: each model's log p and max α, and the difference of log p."""
    table = {"step": range(1, len(words) + 1), "word": words}
    for name, s in zip(names, scored):
        table[f"log p · {name}"] = np.round(s.logprobs, 3)
        table[f"max α · {name}"] = np.round(s.alphas.max(axis=1), 3)
    table[f"Δ log p ({names[1]} − {names[0]})"] = np.round(scored[1].logprobs - scored[0].logprobs, 3)
    return pd.DataFrame(table)


def samples_ui(ctx: Context) -> tuple[int, int]:
    """How many sampled paths, and the ONE seed: the sidebar's when it samples already, else the page's."""
    c1, c2 = st.columns(2)
    n = int(c1.number_input("Sampled paths", 1, 12, key="cmp_n"))
    if ctx.decode.hard_mode == "sample":
        c2.caption(f"Seed: the sidebar's sampling seed ({ctx.decode.seed}), which also drew the hard model's caption.")
        return n, ctx.decode.seed
    seed = int(c2.number_input("Seed", 0, 10_000, key="cmp_seed", help="The same seed gives the same locations."))
    return n, seed


def scale_ui(scales: list[maps.ColourScale]) -> list[maps.ColourScale]:
    """The two sides' colour scales: one shared scale, or each its own, as the user picks."""
    keep_choice("cmp_scale", list(SCALES))
    how = st.radio("Colour scale", list(SCALES), format_func=SCALES.get, key="cmp_scale", horizontal=True)
    if how == "shared":
        scales = [maps.shared_scale(scales)] * 2
        st.caption(f"**Both maps on one colour scale**: full colour is α = {scales[0].vmax:.3g} "
                   + ("(the fixed global scale)." if scales[0].gamma != 1.0 else
                      "(the higher of the two peaks), so the sharper map also looks brighter."))
    else:
        st.caption(f"**Each map on its own colour scale** (full colour: α = {scales[0].vmax:.3g} left, "
                   f"{scales[1].vmax:.3g} right): compare where they look, not how sharply.")
    return scales


def main() -> None:
    st.title("Soft vs hard")
    ctx = context()
    need_image(ctx)
    follow_sidebar(ctx)
    c1, c2 = st.columns(2)
    with c1:
        left = _pick(ctx, "Left checkpoint", "cmp_soft", "soft")
    with c2:
        right = _pick(ctx, "Right checkpoint", "cmp_hard", "hard")
    if left is None or right is None:
        st.error(ctx.ckpt_error or "No checkpoints to compare.")
        st.stop()
    try:
        models = [(left, _load(ctx, left)), (right, _load(ctx, right))]
    except SatError as err:
        st.error(str(err))
        st.stop()
    text = " ".join(caption_words(caption_ui(ctx, models)))
    if not text:
        st.info("The caption is empty: pick another or type one.")
        st.stop()
    try:
        scored = [res.score(res.stamp(m.path), image_for(ctx, m).key, text, m, image_for(ctx, m).tensor)
                  for _, m in models]
    except SatError as err:
        st.error(str(err))
        st.stop()
    words = [*scored[0].words, "<end>"]
    clamp("cmp_step", 1, len(words))
    t = st.slider("Word", 1, max(2, len(words)), key="cmp_step", disabled=len(words) < 2,
                  help="Both models read the same caption, so each step is the same word on both sides.") - 1
    t = min(t, len(words) - 1)
    draw_caption(words, t, prefix=f"**Step {t + 1} of {len(words)}:** ")
    if scored[0].unknown:
        st.warning(f"Not in the vocabulary, read as <unk>: {', '.join(dict.fromkeys(scored[0].unknown))}")
    n, seed = samples_ui(ctx) if any(m.model.hard for _, m in models) else (0, 0)
    scales = scale_ui([side_scale(ctx, m, sc, t) for (_, m), sc in zip(models, scored)])
    cols = st.columns(2)
    for col, (name, loaded), s, scale in zip(cols, models, scored, scales):
        paths = (res.caption_samples(res.stamp(loaded.path), image_for(ctx, loaded).key, text, n, seed, loaded,
                                     image_for(ctx, loaded).tensor) if loaded.model.hard else None)
        with col:
            draw_side(ctx, name, loaded, s, t, paths, scale)
    st.subheader("Word by word")
    st.dataframe(word_table(words, [left, right], scored), hide_index=True, width="stretch")
    draw_help("Soft and hard attention", (
        "Both models are *teacher-forced* on one caption: each reads the same previous words, so step t is "
        "the same word on both sides and α_t, log p and β compare directly. Soft attention feeds the decoder "
        "a blend of all regions weighted by α_t, scaled by the gate β_t. Hard attention feeds one region "
        "s_t drawn from α_t (trained with REINFORCE, PAPER.md) and has no gate; at test time the paper uses "
        "the expectation, which is the map shown. The red × are the regions picked by seeded samples "
        "reading the same caption. The sidebar's decoding settings only choose the models' own captions."))


main()
