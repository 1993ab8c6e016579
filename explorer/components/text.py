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


def draw_domain_warning(reasons: Sequence[str], source: str, confidence: float | None = None) -> None:
    """The out-of-domain notice shown next to a caption; ``source`` names the data compared with."""
    why = "; ".join(reasons)
    conf = f" The model's mean word probability here is {confidence:.2f}." if confidence is not None else ""
    st.warning(
        f"**This image looks unlike the images this model was trained on — {source} — so treat its "
        f"caption with care.** {why[0].upper() + why[1:]}.{conf}",
        icon="⚠️",
    )


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
