"""What a page needs before it can draw: a model, an image; and the decodes pages share."""

from __future__ import annotations

import dataclasses

import numpy as np
import streamlit as st

from sat_core.checkpoint import LoadedCheckpoint
from sat_core.config import DecodeConfig
from sat_core.decoding import Hypothesis, Intervention, ScoredCaption
from sat_core.data.masks import rle_decode
from sat_core.evaluation.confidence import kept_reference

from explorer import resources as res
from explorer.components import text
from explorer.resources import PreparedImage
from explorer.state import Context


def need_model(ctx: Context) -> LoadedCheckpoint:
    """The selected model, or the reason there is none (and the page stops)."""
    if ctx.loaded is None:
        st.error(ctx.ckpt_error or "Choose a checkpoint in the sidebar.")
        st.stop()
    return ctx.loaded


def need_image(ctx: Context) -> PreparedImage:
    """The selected image, or the loader's message in its place (and the page stops)."""
    if ctx.image_error:
        st.error(ctx.image_error, icon="🚫")
        st.stop()
    if ctx.image is None:
        st.info("Choose a gallery scene or upload an image in the sidebar.")
        st.stop()
    return ctx.image


def image_for(ctx: Context, loaded: LoadedCheckpoint) -> PreparedImage:
    """The current image preprocessed as ``loaded`` expects (models may differ in input size)."""
    if loaded is ctx.loaded or ctx.image_source is None:
        return ctx.image
    key, name, source, record = ctx.image_source
    return res.prepare_image(key, loaded.preprocess, name, source, record)


def beams(ctx: Context, loaded: LoadedCheckpoint | None = None, *, cfg: DecodeConfig | None = None,
          intervention: Intervention | None = None, region_key: str = "") -> list[Hypothesis]:
    """The beam's hypotheses (best first) for the current image; cached per settings."""
    loaded = loaded or ctx.loaded
    image = image_for(ctx, loaded)
    return res.decode(res.stamp(loaded.path), image.key, cfg or ctx.decode, region_key, loaded,
                      image.tensor, intervention)


def read_back(ctx: Context, hyp: Hypothesis, loaded: LoadedCheckpoint | None = None) -> ScoredCaption:
    """The numbers every page shows for a decoded caption: its words read back by teacher forcing in fp32
    (``res.NUMBERS_PRECISION``), the computation Step through, Score and How it works also make. Beam search may run
    in bf16 and picks the words; p, log p, α and β of those words come from here, so they agree to every shown digit
    on every page. A caption cut at the length cap has no <end> step."""
    loaded = loaded or ctx.loaded
    image = image_for(ctx, loaded)
    scored = res.score(res.stamp(loaded.path), image.key, tuple(hyp.tokens), loaded, image.tensor)
    if hyp.finished:
        return scored
    n = len(scored.tokens) - 1  # drop the <end> that teacher forcing appends
    return dataclasses.replace(scored, tokens=scored.tokens[:n], logprobs=scored.logprobs[:n],
                               alphas=scored.alphas[:n], betas=scored.betas[:n])


def decoding_line(ctx: Context, loaded: LoadedCheckpoint | None = None) -> str:
    """How the pages' captions of ``loaded`` (the sidebar's model by default) are decoded, in words."""
    from explorer.components.text import decoding_note

    loaded = loaded or ctx.loaded
    d = ctx.decode
    return decoding_note(d.beam_size, d.length_norm, d.max_len, evaluated=loaded.evaluated,
                         hard_mode=d.hard_mode if loaded.model.hard else "expect", seed=d.seed)


_IRREGULAR_PLURALS = {"people": "person", "men": "man", "women": "woman", "children": "child", "mice": "mouse"}


def model_knowledge(loaded: LoadedCheckpoint) -> str:
    """What the model can name, in plain words, from its own vocabulary: the kinds of object, colours and places of
    its world, or, for a model of other data, the content words its training captions used most."""
    from sat_core.evaluation.grounding import word_kind

    words = [w for w in loaded.vocab.itos if not w.startswith("<")]
    kinds: dict[str, list[str]] = {}
    for word in words:
        kinds.setdefault(word_kind(word), []).append(word)
    things = set(kinds.get("category", []) + kinds.get("shape", []))
    singular = sorted(w for w in things if not (w in _IRREGULAR_PLURALS and _IRREGULAR_PLURALS[w] in things)
                      and not (w.endswith("s") and (w[:-1] in things or w[:-2] in things)))
    if singular:
        parts = [f"{len(singular)} kinds of object ({', '.join(singular[:8])}{', …' if len(singular) > 8 else ''})"]
        if kinds.get("colour"):
            parts.append(f"{len(kinds['colour'])} colours")
        if kinds.get("place"):
            parts.append(f"{len(kinds['place'])} words for places ({', '.join(kinds['place'][:4])}, …)")
        return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]
    stats = (loaded.config.get("training") or {}).get("word_stats") or {}
    counts = stats.get("counts", {})
    lift = stats.get("lift", {})
    common = sorted((w for w in counts if lift.get(w, 0) >= 2.0), key=lambda w: -counts[w])[:8]
    return (f"the {len(words)} words of its training captions" + (f", most often {', '.join(common)}" if common else ""))


def object_masks(image: PreparedImage) -> list[np.ndarray]:
    """Ground-truth masks of a gallery scene's objects (original-image pixels); none for uploads."""
    if image.record is None or not image.record.objects:
        return []
    return [rle_decode(o["mask"]) for o in image.record.objects]


def object_label(obj: dict) -> str:
    if "category" in obj:  # scenes world: colour may be None
        return f"{obj['id']}: " + " ".join(w for w in (obj.get("colour"), obj["category"]) if w)
    return f"{obj['id']}: {obj['size']} {obj['colour']} {obj['shape']}"


def unsure_note(loaded: LoadedCheckpoint, logprob: float) -> tuple[str, str] | None:
    """The unsure notice's texts when the caption's log p is under the checkpoint's mark (``confidence``); None when
    it is not, or the checkpoint keeps no mark (or a malformed one: no notice rather than a guess)."""
    reference = kept_reference(loaded.config)
    if reference is None or not reference.unsure(logprob):
        return None
    measured = (loaded.metrics or {}).get("generalisation")
    return text.unsure_note(logprob, reference.threshold, reference.share, reference.captions, reference.split,
                            measured if isinstance(measured, dict) else None)
