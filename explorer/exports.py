"""Figures and α files that leave the app: at slide resolution, and saying what they show."""

from __future__ import annotations

from sat_core import viz
from sat_core.decoding import Hypothesis, ScoredCaption

from explorer import maps
from explorer.maps import MapSettings
from explorer.resources import PreparedImage


GIF_SIDE = 720  # px: a GIF frame's side, large enough to fill half a slide


def decoding_text(decode: dict) -> str:
    """The decoding settings in one line: enough to decode the same caption again."""
    parts = [f"beam {decode['beam_size']}", f"length normalisation {decode['length_norm']:g}",
             f"max length {decode['max_len']}", f"{decode['precision']} search"]
    if decode.get("hard_mode") == "sample":
        parts.append(f"sampled hard attention, seed {decode['seed']}")
    return ", ".join(parts)


def export_meta(ctx, image: PreparedImage, best: Hypothesis, numbers: ScoredCaption) -> dict:
    """What a figure or α file must say about itself once it leaves the app: the caption, the checkpoint, the image
    and crop, and every decoding setting (``sat_core.config.DecodeConfig``), enough to decode the caption again."""
    c = image.crop_info
    decode = ctx.decode.to_dict()
    return {"caption": best.caption, "truncated": not best.finished, "checkpoint": ctx.ckpt_name,
            "checkpoint_path": str(ctx.loaded.path) if ctx.loaded is not None else None,
            "image": image.name, "crop": {"box": list(c.box), "original_size": list(c.original_size),
                                          "model_input": c.image_size},
            "beam_size": ctx.decode.beam_size, "decoding": decode,
            "logprob": round(float(numbers.logprob), 6), "numbers_precision": "fp32",
            "alpha_maps": {"method": ctx.maps.method, "normalisation": ctx.maps.norm}}


def slide_png(image: PreparedImage, words: list[str], numbers: ScoredCaption, settings: MapSettings,
              meta: dict) -> bytes:
    """The strip at slide resolution (≥ 1600 px wide) under a title naming caption, checkpoint, decoding, image,
    crop; the font (DejaVu Sans, bundled) has α, β and ×."""
    panel = maps.slide_panel_size(len(words) + 1)
    strip = maps.strip_with_scale(image.crop, words, numbers.alphas, numbers.grid, settings, panel_size=panel)
    crop = meta["crop"]
    lines = [f"Caption: {meta['caption']}" + (" … (cut at the length cap)" if meta["truncated"] else "")
             + f"   (log p = {meta['logprob']:.2f})",
             f"Checkpoint: {meta['checkpoint']} · decoding: {decoding_text(meta['decoding'])}",
             f"α maps: {maps.METHODS[settings.method]}, {maps.NORMS[settings.norm].lower()} · image: {meta['image']} · "
             f"crop {tuple(crop['box'])} of {crop['original_size'][0]}×{crop['original_size'][1]} px, seen at "
             f"{crop['model_input']} px"]
    return viz.strip_png(viz.with_title(strip, lines))
