"""Score a caption: per-word log-probabilities and α of any caption under teacher forcing,
next to the same numbers for the model's own decode."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from sat_core.decoding import ScoredCaption
from sat_core.errors import SatError
from sat_core.vocab import Vocab

from explorer import maps
from explorer import resources as res
from explorer.components.figures import draw_logprobs
from explorer.components.text import draw_help
from explorer.guards import beams, need_image, need_model
from explorer.resources import PreparedImage
from explorer.state import Context, context

TYPE_OWN = "(type your own)"


def caption_input(image: PreparedImage, own: str) -> str:
    references = [" ".join(s) for s in image.record.sentences] if image.record is not None else []
    choice = TYPE_OWN
    if references:
        choice = st.selectbox("Pick a reference caption", [TYPE_OWN, *references], index=1, key="score_ref")
    if choice != TYPE_OWN:
        return choice
    return st.text_input("Your caption", value=own, key="score_text",
                         help="Lower-case words separated by spaces; words the model does not know are flagged.")


def word_table(scored: ScoredCaption, vocab: Vocab) -> pd.DataFrame:
    words = [*scored.words, "<end>"]
    return pd.DataFrame({
        "word": words,
        "log p": np.round(scored.logprobs, 3),
        "p": np.round(np.exp(scored.logprobs), 4),
        "max α": np.round(scored.alphas.max(axis=1), 3),
        "β": np.round(scored.betas, 3),
        "known": [w in vocab.stoi and w != "<unk>" for w in words],
    })


def draw_scored(title: str, scored: ScoredCaption, image: PreparedImage, ctx: Context, key: str,
                vocab: Vocab) -> None:
    st.markdown(f"#### {title}")
    st.markdown(f"**log p = {scored.logprob:.2f}** over {len(scored.tokens)} tokens "
                f"(mean {scored.logprob / len(scored.tokens):.2f} per token)")
    words = [*scored.words, "<end>"]
    draw_logprobs(words, scored.logprobs, [w == "<unk>" for w in words], key=f"{key}_lp")
    st.dataframe(word_table(scored, vocab), hide_index=True, width="stretch")
    st.image(maps.strip(image.crop, words, scored.alphas, scored.grid, ctx.maps, columns=6))


def main() -> None:
    st.title("Score a caption")
    ctx = context()
    loaded = need_model(ctx)
    image = need_image(ctx)
    own = beams(ctx)[0]
    text = caption_input(image, own.caption)
    if not text.strip():
        st.info("Type a caption to score it.")
        st.stop()
    ckpt = res.stamp(loaded.path)
    try:
        yours = res.score(ckpt, image.key, text.lower(), loaded, image.tensor)
    except SatError as err:
        st.error(str(err))
        st.stop()
    # The model's own caption can be empty (it ended at once): then there is nothing to score beside yours.
    model = res.score(ckpt, image.key, own.caption, loaded, image.tensor) if own.words else None
    if yours.unknown:
        st.warning(f"Not in the model's vocabulary (scored as <unk>): {', '.join(sorted(set(yours.unknown)))}")
    if model is not None:
        diff = yours.logprob - model.logprob
        st.markdown(f"Your caption is **{abs(diff):.2f} nats {'less' if diff < 0 else 'more'} likely** than the "
                    f"model's own decode under this model (log p {yours.logprob:.2f} vs {model.logprob:.2f}).")
    left, right = st.columns(2)
    with left:
        draw_scored("Your caption", yours, image, ctx, "yours", loaded.vocab)
    with right:
        if model is None:
            st.info(f"The model's own caption is empty (it ended at once, log p = {own.logprob:.2f}).")
        else:
            draw_scored(f"The model's decode: {own.caption}", model, image, ctx, "own", loaded.vocab)
    draw_help("Teacher forcing", (
        "Each word is fed to the decoder as the previous word of the next step, whatever the model would have "
        "said, so every word gets log p(y_t | a, y_<t) and its own α_t. The last row is the probability of "
        "ending the caption there. Low bars show where the model disagrees with a caption."))


main()
