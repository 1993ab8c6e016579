"""Checkpoint card: what the selected model is, what it was trained on, how it scores; open another one."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from sat_core.checkpoint import LoadedCheckpoint
from sat_core.paths import resolve_checkpoint_path
from sat_core.errors import SatError

from explorer import resources as res
from explorer.guards import need_model
from explorer.sidebar import checkpoint_names
from explorer.state import Context, context, set_pending


def open_by_path(ctx: Context) -> None:
    """A typed path is accepted only inside the server's checkpoint folders."""
    st.subheader("Open a checkpoint folder")
    roots = ctx.settings.checkpoint_roots
    st.caption("Allowed folders: " + ", ".join(f"`{r}`" for r in roots))
    c1, c2 = st.columns([4, 1])
    typed = c1.text_input("Checkpoint path", key="card_path", placeholder="checkpoints/shapes_soft")
    if c2.button("Open", key="card_open") and typed.strip():
        try:
            path = resolve_checkpoint_path(typed, roots)
            loaded = res.load_model(str(path), tuple(str(r) for r in roots), ctx.settings.device, res.stamp(path))
            path = loaded.path  # the folder, also when the weights file itself was typed
        except SatError as err:
            st.error(str(err))
            return
        name = next(iter(checkpoint_names([str(path)], roots)))
        st.session_state.setdefault("opened_checkpoints", {})[name] = str(path)
        set_pending(ckpt=name)
        st.rerun()


def draw_config(loaded: LoadedCheckpoint) -> None:
    m, p = loaded.model_config, loaded.preprocess
    params = sum(t.numel() for t in loaded.model.parameters())
    facts = {
        "attention": m.attention, "encoder": m.encoder, "image size": f"{p.image_size}×{p.image_size}",
        "vocabulary": f"{len(loaded.vocab)} words", "embedding m / LSTM n / D": f"{m.embed_dim} / {m.hidden_dim} / {m.feature_dim}",
        "gate β": "on" if m.gate and m.attention == "soft" else "off",  # hard attention has no gate
        "(h₀, c₀) from": "mean annotation",
        "α trained by": supervision(loaded),
        "parameters": f"{params:,}", "folder": str(loaded.path),
    }
    st.dataframe(pd.DataFrame({"": list(facts), "value": list(facts.values())}), hide_index=True, width="stretch")


def supervision(loaded: LoadedCheckpoint) -> str:
    """What taught α: the captions alone (the paper), or the world's masks too (--attention-lambda)."""
    if loaded.optim is None:
        return "not recorded"
    if loaded.optim.attention_lambda:
        return f"captions + object masks, λ_a = {loaded.optim.attention_lambda:g} (not in the paper)"
    return "captions alone (the paper)"


def draw_metrics(metrics: dict | None) -> None:
    st.subheader("Metrics")
    if not metrics:
        st.info("No metrics.json: evaluate it with `python -m sat_core.evaluate`.")
        return
    flat = {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
    for section in ("corpus", "grounded"):
        if isinstance(metrics.get(section), dict):
            flat.update({f"{section}: {k}": v for k, v in metrics[section].items() if isinstance(v, (int, float))})
    if flat:
        st.dataframe(pd.DataFrame({"metric": list(flat), "value": list(flat.values())}), hide_index=True)
    with st.expander("metrics.json"):
        st.json({k: v for k, v in metrics.items() if k != "records"}, expanded=False)


def main() -> None:
    st.title("Checkpoint card")
    ctx = context()
    if ctx.loaded is None:  # still offer to open one by path
        open_by_path(ctx)
    loaded = need_model(ctx)
    st.subheader(f"{ctx.ckpt_name}")
    left, right = st.columns([3, 2])
    with left:
        card = res.read_card(Path(loaded.path))
        if card:
            st.markdown(card)
        else:
            st.info("This checkpoint has no MODEL_CARD.md.")
    with right:
        draw_config(loaded)
        draw_metrics(loaded.metrics)
        training = loaded.config.get("training") or {}
        if training:
            with st.expander("Training settings"):
                st.json(training, expanded=False)
    st.divider()
    open_by_path(ctx)


main()
