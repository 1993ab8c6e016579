"""Caption: the model's caption of the chosen image, the beam's alternatives, the α strip, exports."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import streamlit as st

from sat_core import viz
from sat_core.decoding import Hypothesis, ScoredCaption
from sat_core.errors import SatError
from sat_core.regions import box_mask

from explorer import exports, maps
from explorer import resources as res
from explorer.components import text
from explorer.components.figures import draw_alpha
from explorer.components.images import draw_crop_view
from explorer.components.text import draw_domain_warning, draw_help, draw_references
from explorer.guards import (
    beams, decoding_line, model_knowledge, need_image, need_model, read_back, unsure_note,
)
from explorer.maps import MapSettings
from explorer.resources import PreparedImage
from explorer.state import context, keep_choice, write_url


def crop_note(image: PreparedImage) -> str:
    c = image.crop_info
    return text.crop_note(c.box, c.original_size, c.image_size)


def draw_crop(image: PreparedImage) -> None:
    """The original image with the encoder's crop outlined in red, the rest dimmed."""
    height, width = image.original.shape[:2]
    scale = width / image.crop_info.original_size[0]  # the shown image may be a downscaled copy
    box = box_mask((width, height), tuple(int(round(v * scale)) for v in image.crop_info.box))
    draw_crop_view(image.original, box, crop_note(image) + " Dimmed parts were not seen.")


def draw_exports(image: PreparedImage, words: list[str], numbers: ScoredCaption, settings: MapSettings, meta: dict,
                 stem: str, hard: bool) -> None:
    kwargs = {**settings.viz_kwargs(), "panel_size": exports.GIF_SIDE}  # frames at slide size
    crop, grid = image.crop, numbers.grid
    c1, c2, c3 = st.columns(3)
    c1.download_button("Download figure for slides (PNG, ≥ 1600 px)",
                       lambda: exports.slide_png(image, words, numbers, settings, meta),
                       f"{stem}_attention.png", "image/png", key="dl_png")
    c2.download_button(f"Download animation (GIF, {exports.GIF_SIDE} px)", lambda: viz.strip_gif(crop, words, numbers.alphas, grid, **kwargs),
                       f"{stem}_attention.gif", "image/gif", key="dl_gif")
    c3.download_button("Download α values (JSON)",
                       viz.alphas_json(words, numbers.alphas, None if hard else numbers.betas, grid, meta=meta),
                       f"{stem}_alphas.json", "application/json", key="dl_json")


def draw_closer(image: PreparedImage, words: list[str], best: ScoredCaption, settings: MapSettings) -> None:
    """One word's α map, large, beside the image the encoder saw."""
    keep_choice("closer_word", list(range(len(words))))
    t = st.selectbox("Look closer at one word", range(len(words)), format_func=lambda i: f"{i + 1}: {words[i]}",
                     key="closer_word")
    left, right = st.columns(2)
    left.image(image.crop, caption="What the encoder saw", width="stretch")
    with right:
        overlay = maps.overlays(image.crop, best.alphas, best.grid, settings)[t]
        draw_alpha(overlay, best.alphas[t].reshape(best.grid), key="closer_alpha", height=460,
                   scale=maps.colour_scale(image.crop.shape[0], best.alphas, best.grid, settings, t=t),
                   title=f"α for “{words[t]}” (step {t + 1})")


def draw_beam_table(hyps: list[Hypothesis], numbers: list[ScoredCaption], length_norm: float) -> None:
    """The beam's hypotheses in rank order: finished ones by score, then those cut at the length cap. log p is
    read back in fp32 like every number of the app (``read_back``); the rank is the search's."""
    rows = [{"rank": k + 1, "caption": h.caption, "log p": round(n.logprob, 3),
             "score": round(n.logprob / len(n.tokens) ** length_norm, 3), "words": len(h.words),
             "finished": h.finished} for k, (h, n) in enumerate(zip(hyps, numbers))]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "rank": st.column_config.NumberColumn(width=40, help="The beam's order: finished captions by score"),
        "caption": st.column_config.TextColumn(width="medium"),
        "log p": st.column_config.NumberColumn(width=60, help="Σ_t log p(word_t | image, earlier words), <end> "
                                                              "included"),
        "score": st.column_config.NumberColumn(width=60, help=f"log p / (number of tokens)^{length_norm:g}: what "
                                                              "beam search ranks by (the length normalisation)"),
        "words": st.column_config.NumberColumn(width=50, help="Words, without <end>"),
        "finished": st.column_config.CheckboxColumn(width=60, help="False: cut at the length cap")})


def main() -> None:
    st.title("Caption")
    ctx = context()
    loaded = need_model(ctx)
    image = need_image(ctx)
    hyps = beams(ctx)
    best = hyps[0]
    numbers = read_back(ctx, best)  # the p, log p and α every page shows for this caption
    left, right = st.columns([1, 2])
    with left:
        draw_crop(image)
    with right:
        cut = "" if best.finished else (f" … *(cut at the length cap of {ctx.decode.max_len} words: raise "
                                        "Max length in the sidebar to let it finish)*")
        st.markdown(f"**Caption:** {best.caption}{cut}")
        st.caption(decoding_line(ctx))
        confidence = math.exp(numbers.logprob / max(1, len(numbers.tokens)))
        m1, m2, m3 = st.columns(3)
        m1.metric("log p(caption)", f"{numbers.logprob:.2f}")
        m2.metric("score", f"{numbers.logprob / len(numbers.tokens) ** ctx.decode.length_norm:.2f}",
                  help=f"log p / length^{ctx.decode.length_norm:g}")
        m3.metric("mean word probability", f"{confidence:.3f}")
        if image.uploaded:
            try:
                check = res.domain_check(image.key, ctx.ckpt_key, ctx.source, loaded, image.original,
                                         image.tensor)
            except SatError:  # no statistics and no gallery to compare with: say nothing rather than guess
                check = None
            if check is not None and check.far:
                draw_domain_warning(model_knowledge(loaded), check.reasons, check.source, confidence,
                                    compressed_only=check.compressed_only)
        if (note := unsure_note(loaded, numbers.logprob)) is not None:
            text.draw_unsure_note(*note)
        st.markdown(f"**The beam's {len(hyps)} hypotheses** (beam size {ctx.decode.beam_size})")
        draw_beam_table(hyps, [read_back(ctx, h) for h in hyps], ctx.decode.length_norm)
        draw_references(image.references)
    words = maps.step_words(best.words, len(numbers.alphas))
    st.subheader("Where the model looked for each word")
    strip = maps.strip_with_scale(image.crop, words, numbers.alphas, numbers.grid, ctx.maps)
    st.image(strip, caption=f"α maps ({maps.METHODS[ctx.maps.method]}). {maps.scale_note(ctx.maps)} Hover the "
                            "picture for its fullscreen button.")
    draw_closer(image, words, numbers, ctx.maps)
    if ctx.maps.coverage:
        overlay, cover = maps.coverage_overlay(image.crop, numbers.alphas, numbers.grid, ctx.maps)
        st.markdown(f"**Coverage Σ_t α_t** (ranges {cover.min():.2f} – {cover.max():.2f}; the doubly stochastic "
                    "penalty pushes every cell towards 1)")
        draw_alpha(overlay, cover, key="coverage_fig", value_name="Σα", height=320,
                   scale=maps.coverage_scale(image.crop.shape[0], cover, numbers.grid, ctx.maps))
    stem = Path(image.name).stem or image.key.replace(":", "_")
    draw_exports(image, words, numbers, ctx.maps, exports.export_meta(ctx, image, best, numbers), stem,
                 loaded.model.hard)
    write_url()  # the enlarged word is part of the link
    draw_help("How to read this", (
        "The caption is the best hypothesis of a beam search (beam size 1 = greedy). The score is the "
        "sum of the words' log-probabilities (divided by length^n when length normalisation is on). "
        "Each panel of the strip shows α_t, the attention of the step that produced the word under it, over "
        f"the {best.grid[0]}×{best.grid[1]} grid of annotation vectors. " + crop_note(image)))


main()
