"""Soft vs hard: two checkpoints on the same image, step by step, and seeded hard-attention samples."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from sat_core.checkpoint import LoadedCheckpoint
from sat_core.decoding import Hypothesis
from sat_core.errors import SatError

from explorer import maps
from explorer import resources as res
from explorer.components.figures import draw_alpha
from explorer.components.text import draw_caption, draw_help
from explorer.guards import beams, image_for, need_image
from explorer.state import Context, context, keep_choice


def _pick(ctx: Context, label: str, key: str, attention: str) -> str | None:
    names = list(ctx.checkpoints)
    if not names:
        return None
    keep_choice(key, names)
    if key not in st.session_state:
        kinds = [n for n in names if res.checkpoint_summary(ctx.checkpoints[n])["attention"] == attention]
        st.session_state[key] = kinds[0] if kinds else names[0]
    return st.selectbox(label, names, key=key,
                        format_func=lambda n: f"{n} ({res.checkpoint_summary(ctx.checkpoints[n])['attention']})")


def _load(ctx: Context, name: str) -> LoadedCheckpoint:
    path = ctx.checkpoints[name]
    roots = tuple(str(r) for r in ctx.settings.checkpoint_roots)
    return res.load_model(path, roots, ctx.settings.device, res.stamp(Path(path)))


def draw_side(ctx: Context, name: str, loaded: LoadedCheckpoint, hyp: Hypothesis, t: int) -> None:
    """One model's caption with word t marked, and its α at step t (with the location for hard attention)."""
    image = image_for(ctx, loaded)
    hard = loaded.model.hard
    st.markdown(f"#### {name} · {'hard' if hard else 'soft'} attention")
    draw_caption(hyp.words, t if t < len(hyp.words) else None, prefix="**Caption:** ")
    if t >= len(hyp.alphas):
        st.info(f"This caption ended after {len(hyp.alphas)} steps.")
        return
    alphas = hyp.alphas[: t + 1]
    overlay = maps.overlays(image.crop, alphas, hyp.grid, ctx.maps)[-1]
    alpha = hyp.alphas[t].reshape(hyp.grid)
    sampled = hard and int(hyp.locations[t]) >= 0
    location = int(hyp.locations[t]) if sampled else int(np.argmax(hyp.alphas[t])) if hard else None
    word = maps.step_words(hyp.words, len(hyp.alphas))[t]
    draw_alpha(overlay, alpha, key=f"cmp_alpha_{name}", location=location,
               location_label="sampled location" if sampled else "argmax α", title=f"step {t + 1}: “{word}”")
    where = ""
    if location is not None:
        r, c = divmod(location, hyp.grid[1])
        where = f" · {'sampled location' if sampled else 'argmax α'}: row {r}, col {c} (red ×)"
    st.caption(f"β_t = {float(hyp.betas[t]):.3f} · max α_t = {float(alpha.max()):.3f}{where}")


def draw_samples(ctx: Context, name: str, loaded: LoadedCheckpoint) -> None:
    st.subheader("Seeded samples of hard attention")
    if not loaded.model.hard:
        st.info(f"{name} uses soft attention; pick a hard-attention checkpoint to sample locations.")
        return
    c1, c2 = st.columns(2)
    n = int(c1.number_input("Samples", 1, 12, 5, key="cmp_n"))
    seed = int(c2.number_input("Seed", 0, 10_000, 0, key="cmp_seed"))
    image = image_for(ctx, loaded)
    hyps = res.samples(res.stamp(loaded.path), image.key, n, seed, ctx.decode.max_len, loaded, image.tensor)
    rows = [{"sample": k + 1, "caption": h.caption, "log p": round(h.logprob, 3),
             "locations": " ".join(str(int(x)) for x in h.locations)} for k, h in enumerate(hyps)]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    st.caption(f"{len({h.caption for h in hyps})} distinct captions from {n} samples of s_t ~ Multinoulli(α_t) "
               f"(seed {seed}); the same seed gives the same samples.")


def main() -> None:
    st.title("Soft vs hard")
    ctx = context()
    need_image(ctx)
    c1, c2 = st.columns(2)
    with c1:
        soft_name = _pick(ctx, "Left checkpoint", "cmp_soft", "soft")
    with c2:
        hard_name = _pick(ctx, "Right checkpoint", "cmp_hard", "hard")
    if soft_name is None or hard_name is None:
        st.error(ctx.ckpt_error or "No checkpoints to compare.")
        st.stop()
    try:
        models = [(soft_name, _load(ctx, soft_name)), (hard_name, _load(ctx, hard_name))]
    except SatError as err:
        st.error(str(err))
        st.stop()
    cfg = dataclasses.replace(ctx.decode, beam_size=1)
    hyps = [beams(ctx, loaded, cfg=cfg)[0] for _, loaded in models]
    longest = max(len(h.alphas) for h in hyps)
    t = st.slider("Step", 1, max(2, longest), 1, key="cmp_step") - 1 if longest > 1 else 0
    cols = st.columns(2)
    for col, (name, loaded), hyp in zip(cols, models, hyps):
        with col:
            draw_side(ctx, name, loaded, hyp, t)
    draw_samples(ctx, hard_name, models[1][1])
    draw_help("Soft and hard attention", (
        "Soft attention feeds the decoder a blend of all regions weighted by α_t. Hard attention feeds one "
        "region s_t drawn from α_t; the paper trains it with REINFORCE and decodes with the expectation at "
        "test time. Set *Hard attention at test time* to *sample* in the sidebar to see the sampled location "
        "(red ×) instead of the argmax of α. Greedy decoding (beam 1) is used here so both sides are step aligned."))


main()
