"""Score a caption: per-word log-probabilities and α of any caption under teacher forcing,
next to the same numbers for the model's own decode."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from sat_core.decoding import ScoredCaption
from sat_core.errors import SatError
from sat_core.data.vocab import Vocab
from sat_core.data.words import caption_words

from explorer import maps
from explorer import resources as res
from explorer.components.figures import logprob_figure
from explorer.components.text import draw_help
from explorer.guards import beams, decoding_line, need_image, need_model, read_back
from explorer.resources import PreparedImage
from explorer.state import Context, context, keep_choice

MODEL = "model"  # the score_ref option of the model's own caption; references are "ref1", "ref2", …


def caption_sources(image: PreparedImage, own: str) -> dict[str, str]:
    """Captions the text box can be filled with: the dataset's references, then the model's decode."""
    sources = {f"ref{k}": r for k, r in enumerate(image.references, 1)}
    return {**sources, MODEL: own}


def caption_input(sources: dict[str, str]) -> str:
    """The text box (always shown) and a picker that fills it; returns the text to score."""
    keep_choice("score_ref", list(sources))
    st.session_state.setdefault("score_ref", next(iter(sources)))
    st.session_state.setdefault("score_text", sources[st.session_state["score_ref"]])

    def fill() -> None:
        st.session_state["score_text"] = sources[st.session_state["score_ref"]]

    c1, c2 = st.columns([2, 3])
    c1.selectbox("Fill the box with", list(sources), key="score_ref", on_change=fill,
                 format_func=lambda k: f"the model's caption: {sources[k]}" if k == MODEL
                 else f"reference {k[3:]}: {sources[k]}")
    text = c2.text_input("Caption to score", key="score_text",
                         help="Any words; case and punctuation are ignored, words the model does not know are flagged.")
    if text.strip() and caption_words(text) != caption_words(sources[st.session_state["score_ref"]]):
        c1.caption("The box holds your own text (edited after filling).")
    return text


def word_table(scored: ScoredCaption, vocab: Vocab, hard: bool = False) -> pd.DataFrame:
    """Per word: log p, p, max α, β (soft attention only: hard attention has no gate), known to the model."""
    words = [*scored.words, "<end>"]
    table = {
        "word": words,
        "log p": np.round(scored.logprobs, 3),
        "p": np.round(np.exp(scored.logprobs), 3),
        "max α": np.round(scored.alphas.max(axis=1), 3),
        "β": np.round(scored.betas, 3),
        "known": [w in vocab.stoi and w != "<unk>" for w in words],
    }
    if hard:
        del table["β"]
    return pd.DataFrame(table)


def shared_range(*scored: ScoredCaption) -> list[float]:
    """One y range for every log-p chart, so bars of the two captions compare by height."""
    values = np.concatenate([s.logprobs for s in scored])
    low = float(values[np.isfinite(values)].min()) if np.isfinite(values).any() else -1.0
    return [min(low, -0.1) * 1.05, 0.0]


def draw_scored(title: str, scored: ScoredCaption, image: PreparedImage, ctx: Context, key: str,
                vocab: Vocab, y_range: list[float]) -> None:
    st.markdown(f"#### {title}")
    st.markdown(f"**log p = {scored.logprob:.2f}** over {len(scored.tokens)} tokens "
                f"(mean {scored.logprob / len(scored.tokens):.2f} per token)")
    words = [*scored.words, "<end>"]
    fig = logprob_figure(words, scored.logprobs, [w == "<unk>" for w in words])
    fig.update_yaxes(range=y_range)
    st.plotly_chart(fig, key=f"{key}_lp", width="stretch")
    st.dataframe(word_table(scored, vocab, ctx.loaded.model.hard), hide_index=True, width="stretch")
    st.image(maps.strip_with_scale(image.crop, words, scored.alphas, scored.grid, ctx.maps, columns=6))


def main() -> None:
    st.title("Score a caption")
    ctx = context()
    loaded = need_model(ctx)
    image = need_image(ctx)
    own = beams(ctx)[0]
    text = caption_input(caption_sources(image, own.caption))
    words = caption_words(text)
    if not words:
        st.info("Type a caption to score it.")
        st.stop()
    ckpt = res.stamp(loaded.path)
    try:
        yours = res.score(ckpt, image.key, " ".join(words), loaded, image.tensor)
    except SatError as err:
        st.error(str(err))
        st.stop()
    # The Caption page's caption, with the Caption page's numbers; one cut at the length cap is scored with an <end>.
    model = read_back(ctx, own) if own.finished else res.score(ckpt, image.key, own.caption, loaded, image.tensor)
    if " ".join(words) != " ".join(text.split()):
        st.caption(f"Scored as: *{' '.join(words)}* (lower case, punctuation removed).")
    if yours.unknown:
        unknown = list(dict.fromkeys(yours.unknown))
        st.warning(f"Not in the model's vocabulary, scored as <unk>: {', '.join(unknown)}")
    diff = yours.logprob - model.logprob
    st.markdown(f"Your caption is **{abs(diff):.2f} nats {'less' if diff < 0 else 'more'} likely** than the "
                f"model's own decode under this model (log p {yours.logprob:.2f} vs {model.logprob:.2f}).")
    y_range = shared_range(yours, model)
    left, right = st.columns(2)
    with left:
        draw_scored("Your caption", yours, image, ctx, "yours", loaded.vocab, y_range)
    with right:
        draw_scored(f"The model's decode: {own.caption}", model, image, ctx, "own", loaded.vocab, y_range)
        st.caption(decoding_line(ctx))
    draw_help("Teacher forcing", (
        "Each word is fed to the decoder as the previous word of the next step, whatever the model would have "
        "said, so every word gets log p(y_t | a, y_<t) and its own α_t. The last row is the probability of "
        "ending the caption there. Low bars show where the model disagrees with a caption. Both charts share "
        "one y axis."))


main()
