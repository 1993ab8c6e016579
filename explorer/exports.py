"""Figures and α files that leave the app: at slide resolution, and saying what they show."""

from __future__ import annotations

from sat_core import viz
from sat_core.decoding import Hypothesis

from explorer import maps
from explorer.maps import MapSettings
from explorer.resources import PreparedImage


def export_meta(ctx, image: PreparedImage, best: Hypothesis) -> dict:
    """What a figure or α file must say about itself once it leaves the app."""
    c = image.crop_info
    return {"caption": best.caption, "truncated": not best.finished, "checkpoint": ctx.ckpt_name,
            "image": image.name, "crop": {"box": list(c.box), "original_size": list(c.original_size),
                                          "model_input": c.image_size},
            "beam_size": ctx.decode.beam_size, "alpha_maps": {"method": ctx.maps.method, "normalisation": ctx.maps.norm}}


def slide_png(image: PreparedImage, words: list[str], best: Hypothesis, settings: MapSettings, meta: dict) -> bytes:
    """The strip at slide resolution (≥ 1600 px wide) under a title naming caption, checkpoint, image, crop."""
    panel = maps.slide_panel_size(len(words) + 1)
    strip = maps.strip_with_scale(image.crop, words, best.alphas, best.grid, settings, panel_size=panel)
    crop = meta["crop"]
    lines = [f"Caption: {best.caption}" + (" … (cut at the length cap)" if meta["truncated"] else ""),
             f"Checkpoint: {meta['checkpoint']} · beam {meta['beam_size']} · α maps: "
             f"{maps.METHODS[settings.method]}, {maps.NORMS[settings.norm].lower()}",
             f"Image: {meta['image']} · crop {tuple(crop['box'])} of {crop['original_size'][0]}×"
             f"{crop['original_size'][1]} px, seen at {crop['model_input']} px"]
    return viz.strip_png(viz.with_title(strip, lines))
