"""The shared sidebar: checkpoint, image, decoding controls, α-map display, share link."""

from __future__ import annotations

import time
from pathlib import Path

import streamlit as st

from sat_core import viz
from sat_core.config import DecodeConfig, PreprocessConfig
from sat_core.errors import SatError
from sat_core.precision import describe, resolve

from explorer import resources as res
from explorer import runlog
from explorer import state
from explorer.components.text import draw_supervised_badge
from explorer.maps import METHODS, NORMS, MapSettings
from explorer.settings import DataSource, ServerSettings, source_for

UPLOAD_TYPES = ["png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff"]


def checkpoint_names(paths: list[str], roots: tuple[Path, ...]) -> dict[str, str]:
    """Short, unique display names: the folder relative to its root ('soft', 'runs/a/best')."""
    names: dict[str, str] = {}
    for path in paths:
        p = Path(path)
        root = next((r for r in roots if p.is_relative_to(r)), None)
        name = str(p.relative_to(root)) if root is not None and p != root else p.name
        if name in names or name == ".":
            name = f"{p.parent.name}/{p.name}"
        names[name] = path
    return names


def _loads(path: str, roots: tuple[str, ...], settings: ServerSettings) -> bool:
    try:
        res.load_model(path, roots, settings.device, res.stamp(Path(path)))
    except SatError:
        return False
    return True


def _checkpoint_ui(settings: ServerSettings) -> tuple[dict[str, str], str | None, object, str | None]:
    roots = tuple(str(r) for r in settings.checkpoint_roots)
    names = checkpoint_names(res.find_checkpoints(roots), settings.checkpoint_roots)
    names.update(st.session_state.get("opened_checkpoints", {}))
    if not names:
        where = ", ".join(roots)
        return names, None, None, (f"No checkpoints found in {where}. Train one (python -m sat_core.train) or "
                                   "start the app with `-- --checkpoints DIR`.")
    options = list(names)
    state.keep_choice("ckpt", options)
    if "ckpt" not in st.session_state:  # the paper's soft model first (no supervised α), and one that loads
        summary = {n: res.checkpoint_summary(names[n]) for n in options}
        soft = sorted((n for n in options if summary[n]["attention"] == "soft"), key=lambda n: summary[n]["supervised"])
        st.session_state["ckpt"] = next((n for n in [*soft, *options] if _loads(names[n], roots, settings)),
                                        (soft or options)[0])
    name = st.sidebar.selectbox(
        "Checkpoint", options, key="ckpt",
        format_func=lambda n: f"{n} ({res.checkpoint_summary(names[n])['attention']})",
    )
    try:
        loaded = res.load_model(names[name], roots, settings.device, res.stamp(Path(names[name])))
    except SatError as err:
        return names, name, None, str(err)
    return names, name, loaded, None


def paper_decoding(loaded) -> dict:
    """The widgets' values for the paper's decoding of this checkpoint: plain beam search with the beam and length
    normalisation and length cap its figures were measured with, the expectation α for hard attention."""
    return {"beam": loaded.beam_size, "lnorm": loaded.length_norm, "maxlen": loaded.max_len, "hard_mode": "expect"}


def _decoding_ui(name: str | None, loaded) -> DecodeConfig:
    st.sidebar.subheader("Decoding")
    if loaded is not None:  # the decoding the checkpoint's figures were measured with
        paper = paper_decoding(loaded)
        state.follow_checkpoint(name, {key: paper[key] for key in ("beam", "lnorm", "maxlen")})
        st.sidebar.button("The paper's decoding", key="paper_decoding", width="stretch",
                          disabled=all(st.session_state.get(k) == v for k, v in paper.items()),
                          on_click=lambda: st.session_state.update(paper),
                          help=f"Plain beam search as the checkpoint was evaluated: beam {paper['beam']}, length "
                               f"normalisation {paper['lnorm']:g}, at most {paper['maxlen']} words, expectation α for "
                               "hard attention.")
    for key, low, high in (("beam", 1, 10), ("maxlen", 3, 40), ("lnorm", 0.0, 1.0)):
        state.clamp(key, low, high)
    beam = st.sidebar.slider("Beam size", 1, 10, key="beam",
                             help="1 = greedy decoding. Set to the beam the checkpoint was evaluated with whenever "
                                  "a checkpoint is chosen.")
    max_len = st.sidebar.slider("Max length", 3, 40, key="maxlen")
    length_norm = st.sidebar.slider(
        "Length normalisation", 0.0, 1.0, step=0.1, key="lnorm", disabled=beam == 1,
        help="Beam search ranks finished captions by log p / length^x: 0 sums the words' log-probabilities "
             "(short captions win), 1 averages them. Greedy decoding (beam 1) does not use it. Set to the "
             "value the checkpoint was evaluated with whenever a checkpoint is chosen.")
    state.keep_choice("hard_mode", ["expect", "sample"])
    hard_mode = st.sidebar.radio(
        "Hard attention at test time", ["expect", "sample"], key="hard_mode", horizontal=True,
        help="Hard-attention checkpoints only: use the expectation α (as the paper does at test time) "
             "or sample one location s_t ~ Multinoulli(α_t) per step.")
    seed = 0
    if hard_mode == "sample":
        seed = int(st.sidebar.number_input("Sampling seed", 0, 10_000, key="seed"))
    if loaded is not None:  # the card's figures name their precision; say which one this machine decodes in
        device = next(loaded.model.parameters()).device
        st.sidebar.caption(f"Matrix products in **{resolve(device, 'auto')}** ({describe(device)}).",
                           help="bf16 where the hardware multiplies it faster than fp32 (CUDA, AMX, AMD's "
                                "AVX512-BF16), else fp32; bf16 gives the same best caption as fp32 for 98–99 % "
                                "of the shipped models' test scenes (README, Benchmarks).")
    return DecodeConfig(beam_size=beam, max_len=max_len, length_norm=float(length_norm), hard_mode=hard_mode,
                        seed=seed)


def _image_ui(data: DataSource, loaded) -> tuple:
    """(gallery, gallery error, prepared image, image error, source for res.prepare_image)."""
    st.sidebar.subheader("Image")
    gallery, gallery_error = None, None
    try:
        gallery = res.load_gallery(data)
    except SatError as err:
        gallery_error = str(err)
    state.keep_choice("source", ["Gallery scene", "Upload"])
    source = st.sidebar.radio("Image source", ["Gallery scene", "Upload"], key="source", horizontal=True)
    preprocess = loaded.preprocess if loaded is not None else PreprocessConfig()
    started = time.perf_counter()
    try:
        if source == "Upload":
            upload = st.sidebar.file_uploader("Upload an image", type=UPLOAD_TYPES, key="upload",
                                              help="PNG, JPEG, WebP, BMP, GIF (first frame), TIFF")
            if upload is None:
                return gallery, gallery_error, None, None, None
            data = upload.getvalue()
            source = (res.upload_key(data), upload.name, data, None)
            return gallery, gallery_error, res.prepare_image(source[0], preprocess, *source[1:]), None, source
        if gallery is None:
            return gallery, gallery_error, None, gallery_error, None
        _note_missing_scene(gallery)
        scene = st.sidebar.selectbox(f"Image ({len(gallery.ids)})", gallery.ids, key="scene", format_func=gallery.name,
                                     help=f"From {gallery.note}")
        _gallery_ui(gallery, loaded)
        note = st.session_state.get(MISSING_SCENE)
        if note and note[1] == scene:
            st.sidebar.info(f"Scene {note[0]} (from the link) is not in this gallery, {gallery.note}: showing "
                            f"{gallery.name(scene)} instead. The link was made with another dataset or split.")
        else:
            st.session_state.pop(MISSING_SCENE, None)
        record = gallery.by_id[scene]
        source = (f"scene:{scene}:{record.path}", record.path.name, str(record.path), record)
        return gallery, gallery_error, res.prepare_image(source[0], preprocess, *source[1:]), None, source
    except SatError as err:
        refused = source[0] if isinstance(source, tuple) else None  # the upload's key
        if refused is not None and st.session_state.get("_refused") != refused:
            st.session_state["_refused"] = refused  # logged once per file, not once per rerun (explorer.runlog)
            runlog.record("refused upload", "sidebar", seconds=time.perf_counter() - started, reason=str(err)[:200])
        return gallery, gallery_error, None, str(err), None


GALLERY_PAGE = 6  # thumbnails a page


def _pick_scene(image_id: int) -> None:
    st.session_state["scene"] = image_id


def _thumb(gallery: res.Gallery, column, image_id: int, caption: str, prefix: str = "thumb") -> None:
    column.image(str(gallery.by_id[image_id].path), caption=caption, width="stretch")
    column.button("Show", key=f"{prefix}_{image_id}", on_click=_pick_scene, args=(image_id,), width="stretch",
                  type="primary" if st.session_state.get("scene") == image_id else "secondary")


def _gallery_ui(gallery: res.Gallery, loaded) -> None:
    """The gallery as pictures: a few scenes chosen from the checkpoint's stored records for what they show, then
    every scene, a page at a time."""
    with st.sidebar.expander("Gallery", expanded=False):
        stored = res.stored_records(loaded, gallery) if loaded is not None else None
        picks = res.curated(stored["records"]) if stored else []
        if picks:
            st.caption("Chosen from this model's test records:")
            for row in range(0, len(picks), 2):
                cols = st.columns(2)
                for col, (image_id, why) in zip(cols, picks[row : row + 2]):
                    _thumb(gallery, col, image_id, why, prefix="curated")
        pages = max(1, -(-len(gallery.ids) // GALLERY_PAGE))
        state.clamp("gallery_page", 1, pages)
        page = int(st.number_input(f"Page (of {pages})", 1, pages, key="gallery_page")) if pages > 1 else 1
        shown = gallery.ids[(page - 1) * GALLERY_PAGE : page * GALLERY_PAGE]
        for row in range(0, len(shown), 3):
            cols = st.columns(3)
            for col, image_id in zip(cols, shown[row : row + 3]):
                _thumb(gallery, col, image_id, gallery.name(image_id))


MISSING_SCENE = "_missing_scene"  # (the scene a link asked for, the gallery image shown instead)


def _note_missing_scene(gallery: res.Gallery) -> None:
    """A scene id (from a link) that this gallery lacks: drop it, and remember it for the notice beside the image."""
    asked = st.session_state.get("scene")
    if asked is not None and asked not in gallery.by_id and gallery.ids:
        st.session_state[MISSING_SCENE] = (asked, gallery.ids[0])
    state.keep_choice("scene", gallery.ids)


def _maps_ui() -> MapSettings:
    with st.sidebar.expander("α map display"):
        for key, options in (("method", list(METHODS)), ("norm", list(NORMS)), ("cmap", list(viz.COLORMAPS))):
            state.keep_choice(key, options)
        state.clamp("sigma", 0.0, 30.0)
        state.clamp("opacity", 0.0, 1.0)
        method = st.radio("Upsampling", list(METHODS), format_func=METHODS.get, key="method")
        sigma = st.slider("Smoothing σ (px, pyramid only; 0 = default)", 0.0, 30.0, step=0.5, key="sigma",
                          disabled=method != "pyramid")
        norm = st.radio("Normalisation", list(NORMS), format_func=NORMS.get, key="norm")
        opacity = st.slider("Opacity", 0.0, 1.0, step=0.05, key="opacity")
        cmap = st.selectbox("Colour map", list(viz.COLORMAPS), key="cmap")
        coverage = st.checkbox("Show the coverage map Σ_t α_t", key="coverage")
        st.caption("The model has exactly one α per grid cell: *raw grid cells* show what it computed. "
                   "Smoothing is cosmetic — it makes maps look like the paper's figures, not more precise. "
                   "Hover a map for the exact α of each cell.")
    return MapSettings(method, float(sigma), norm, float(opacity), cmap, bool(coverage))


def _share_ui(query: str) -> None:
    with st.sidebar.expander("Share this view"):
        base = ""
        try:
            base = (st.context.url or "").split("?")[0]
        except Exception:  # no browser context (tests, bare mode)
            pass
        st.code(f"{base}?{query}" if query else (base or "(default view)"), language=None)
        st.caption("The link restores the checkpoint, scene, step, forced words and display settings. "
                   "Uploaded images are not part of links.")


def draw_sidebar(settings: ServerSettings) -> state.Context:
    """Draw the sidebar and return what it selected."""
    state.restore_from_url()
    state.apply_pending()
    names, name, loaded, ckpt_error = _checkpoint_ui(settings)
    if loaded is not None and loaded.optim is not None and loaded.optim.attention_lambda > 0:
        draw_supervised_badge(loaded.optim.attention_lambda)  # at the top of every page
    decode = _decoding_ui(name, loaded)
    data = source_for(settings.source, loaded.model_config.encoder if loaded is not None else None)
    gallery, gallery_error, image, image_error, source = _image_ui(data, loaded)
    maps = _maps_ui()
    ctx = state.Context(settings, names, name, loaded, ckpt_error, gallery, gallery_error, image, image_error,
                        source, decode, maps, data=data)
    ctx.query = state.write_url()
    _share_ui(ctx.query)
    return ctx
