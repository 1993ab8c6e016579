"""Captions and short notes as Markdown."""

from __future__ import annotations

import html
from collections.abc import Collection, Sequence

import streamlit as st


def caption_markdown(words: Sequence[str], current: int | None = None, forced: Collection[int] = ()) -> str:
    """Words joined by spaces; the current one highlighted, forced ones underlined and starred."""
    parts = []
    for i, word in enumerate(words):
        text = html.escape(word)
        if i in forced:
            text = f"<u>{text}</u>*"
        if i == current:
            text = f"<mark>**{text}**</mark>"
        parts.append(text)
    return " ".join(parts) if parts else "*(empty)*"


def draw_caption(words: Sequence[str], current: int | None = None, forced: Collection[int] = (), *,
                 prefix: str = "") -> None:
    st.markdown(f"{prefix}{caption_markdown(words, current, forced)}", unsafe_allow_html=True)


def draw_domain_warning(knows: str, reasons: Sequence[str], source: str, confidence: float | None = None, *,
                        compressed_only: bool = False) -> None:
    """The out-of-domain notice beside a caption, in plain words: the picture is unlike the model's training
    pictures, what the model can name (``knows``), and, folded away, the measurements behind the notice. When
    heavy JPEG compression is the only reason (``compressed_only``), the notice says that instead."""
    conf = (f" Its words here are {confidence:.0%} likely on average, but that says how sure it is of its own "
            "words, not whether they are true." if confidence is not None else "")
    if compressed_only:
        headline = (f"**This picture is heavily JPEG-compressed, so its caption may miss objects.** Compression "
                    f"blurs small objects into their 8×8 blocks; a less compressed copy reads better.{conf}")
        title, why = "How the app measured the compression", reasons[0][0].upper() + reasons[0][1:] + "."
    else:
        headline = (f"**This picture looks unlike the pictures this model learnt from, so read its caption as a "
                    f"guess.** The model can only name what its training captions named: {knows}. Anything else in "
                    f"the picture it describes with those words anyway.{conf}")
        title = "Why the app thinks the picture is unfamiliar"
        why = f"Compared with {source}: " + "; ".join(reasons) + "."
    st.warning(headline, icon="⚠️")
    with st.expander(title):
        st.markdown(why)


def unsure_note(logprob: float, threshold: float, share: float, captions: int, split: str,
                measured: dict | None = None) -> tuple[str, str]:
    """(headline, how it was measured) of the notice that the model is unsure of its caption (``confidence``):
    its log p under the reference's mark. ``measured``: {set name: figures} of the checkpoint's evaluation, whose
    ``unsure_erring`` / ``unsure_right`` say how often the flag fell on wrong and on right captions there."""
    images = "validation" if split == "val" else f"“{split}”"
    headline = (f"**The model is unsure of this caption.** Under the model it is less likely (log p = {logprob:.2f}) "
                f"than all but {share:.0%} of the captions it gave its {images} images, so check each object it "
                "names against the picture.")
    how = (f"The mark, log p = {threshold:.2f}, is the {share:.0%} quantile of log p(caption) over the {captions} "
           f"captions the checkpoint's own beam search gave its {images} split. A caption decoded with other settings "
           "is compared with the same mark. Whether the caption is true is not measured here: the flag only says "
           "the model gave its words little probability. Not in the paper: a reading of the model's own "
           "probabilities, which changes no caption.")
    rows = [f"{name} {f['unsure_erring']:.0%} / {f['unsure_right']:.0%}" for name, f in (measured or {}).items()
            if isinstance(f, dict) and all(isinstance(f.get(k), (int, float))
                                           for k in ("unsure_erring", "unsure_right"))]
    if rows:
        how += (" Where this checkpoint was evaluated, the flag fell on this share of the captions that get an object "
                "wrong / of the others: " + "; ".join(rows) + ".")
    return headline, how


def draw_unsure_note(headline: str, how: str) -> None:
    st.info(headline, icon="🤔")
    with st.expander("How the app decides the model is unsure"):
        st.markdown(how)


def draw_help(title: str, body: str) -> None:
    with st.expander(title):
        st.markdown(body)


def crop_note(box: tuple[int, int, int, int], original_size: tuple[int, int], image_size: int) -> str:
    """Which square of the image the encoder saw (CropInfo in words)."""
    (left, top, right, bottom), (w, h) = box, original_size
    return (f"The encoder saw the square ({left}, {top}) – ({right}, {bottom}) of this {w}×{h} image, "
            f"resized to {image_size}×{image_size} px; every α map covers exactly that square.")


def draw_references(references: Sequence[str]) -> None:
    """The dataset's reference captions of the image (none for uploads)."""
    if references:
        with st.expander(f"Reference captions ({len(references)})", expanded=True):
            st.markdown("\n".join(f"{k}. {r}" for k, r in enumerate(references, 1)))


def decoding_note(beam: int, length_norm: float, max_len: int, *, evaluated: tuple[int, float, int] | None = None,
                  hard_mode: str = "expect", seed: int = 0) -> str:
    """How a caption was decoded, in words: the search, its settings, and whether that is the checkpoint's own
    (evaluated) decoding — plain beam search, as the paper decodes. It speaks of the decoding only: whether the model
    is the paper's is the supervised badge's to say."""
    search = "greedy decoding (beam size 1)" if beam == 1 else f"beam search, beam size {beam}"
    norm = "no length normalisation" if length_norm == 0 else f"length normalisation {length_norm:g}"
    text = f"Decoded by {search}, {norm}, at most {max_len} words"
    if hard_mode == "sample":
        text += f", one sampled attention location per step (seed {seed})"
    if evaluated is None or (beam, length_norm, max_len) == evaluated and hard_mode == "expect":
        return text + ": the paper's decoding (plain beam search, as the checkpoint was evaluated)."
    changed = f"beam {evaluated[0]}, length normalisation {evaluated[1]:g}, at most {evaluated[2]} words"
    return text + (f": changed in the sidebar from the decoding the checkpoint was evaluated with ({changed}); "
                   "*The paper's decoding* in the sidebar goes back to it.")


def supervised_note(attention_lambda: float) -> str:
    return (f"**Not in the paper:** this model's attention was also trained on the objects' masks (supervised "
            f"attention, λ_a = {attention_lambda:g}; Liu et al., 2017). Its α maps show where it was taught to look, "
            "not only what it learnt from the captions.")


def draw_supervised_badge(attention_lambda: float) -> None:
    st.badge("Not in the paper: supervised attention", icon=":material/warning:", color="orange")
    st.caption(supervised_note(attention_lambda))

