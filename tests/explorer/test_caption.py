"""Caption page, uploads (bad, good, photo), checkpoint card and typed paths."""

from __future__ import annotations

import pytest

from sat_core.config import DecodeConfig
from sat_core.decoding import beam_search
from sat_core.data.images import load_image, preprocess

pytest.importorskip("streamlit")  # the app's tests: skipped where streamlit is not installed

from tests.explorer.conftest import new_app, photo_jpeg


def expected_beams(env, attention: str, image_source, beam: int = 3, max_len: int = 20, length_norm: float = 0.0):
    loaded = env.checkpoint(attention)
    tensor, _ = preprocess(load_image(image_source), loaded.preprocess)
    cfg = DecodeConfig(beam_size=beam, max_len=max_len, length_norm=length_norm)
    return beam_search(loaded.model, tensor.unsqueeze(0), loaded.vocab, cfg)[0]


def caption_shown(at) -> str:
    lines = [m.value for m in at.markdown if m.value.startswith("**Caption:** ")]
    assert len(lines) == 1, [m.value for m in at.markdown]
    return lines[0].removeprefix("**Caption:** ").split(" … *(cut at the length cap")[0]


def truncation_note(at) -> bool:
    return any(" … *(cut at the length cap" in m.value for m in at.markdown if m.value.startswith("**Caption:** "))


def test_caption_page_shows_the_models_caption_and_beam(app, explorer_env):
    scene = explorer_env.test_ids()[0]
    hyps = expected_beams(explorer_env, "soft", explorer_env.scene_path(scene))
    assert app.title[0].value == "Caption"
    assert app.sidebar.selectbox(key="scene").value == scene
    assert caption_shown(app) == hyps[0].caption
    assert truncation_note(app) == (not hyps[0].finished)  # cut at the length cap: the page says so
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["log p(caption)"] == f"{hyps[0].logprob:.2f}"
    beam_table = app.dataframe[0].value
    assert list(beam_table["caption"]) == [h.caption for h in hyps]
    assert len(beam_table) == 3
    labels = [b.proto.label for b in app.get("download_button")]
    assert labels == ["Download figure for slides (PNG, ≥ 1600 px)", "Download animation (GIF, 720 px)",
                      "Download α values (JSON)"]
    assert any("encoder saw the square (0, 0) – (112, 112)" in str(i.proto) for i in app.image)


def test_beam_size_and_scene_follow_the_sidebar(app, explorer_env):
    scene = explorer_env.test_ids()[2]
    app.sidebar.selectbox(key="scene").set_value(scene)
    app.sidebar.slider(key="beam").set_value(1).run()
    hyps = expected_beams(explorer_env, "soft", explorer_env.scene_path(scene), beam=1)
    assert caption_shown(app) == hyps[0].caption
    assert len(app.dataframe[0].value) == 1
    assert app.query_params["scene"] == str(scene) and app.query_params["beam"] == "1"


def test_length_normalisation_follows_the_sidebar_and_the_link(app, explorer_env):
    scene = explorer_env.test_ids()[1]
    app.sidebar.selectbox(key="scene").set_value(scene)
    app.sidebar.slider(key="beam").set_value(5)
    app.sidebar.slider(key="lnorm").set_value(1.0).run()
    hyps = expected_beams(explorer_env, "soft", explorer_env.scene_path(scene), beam=5, length_norm=1.0)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    assert caption_shown(app) == hyps[0].caption
    assert list(app.dataframe[0].value["caption"]) == [h.caption for h in hyps]
    assert app.query_params["lnorm"] == "1.0"
    reopened = new_app({"scene": str(scene), "beam": "5", "lnorm": "1.0"})
    reopened.run()
    assert reopened.sidebar.slider(key="lnorm").value == 1.0 and caption_shown(reopened) == caption_shown(app)


def test_decoding_follows_the_checkpoint_unless_a_link_sets_it(explorer_env):
    at = new_app({"ckpt": "tiny-hard-normed"})
    at.run()
    # what its metrics were measured with
    assert at.sidebar.slider(key="beam").value == 4 and at.sidebar.slider(key="lnorm").value == 1.0
    assert at.sidebar.slider(key="maxlen").value == 16
    assert not {"beam", "lnorm", "maxlen"} & set(at.query_params)  # the checkpoint's own: links leave them out
    scene = at.sidebar.selectbox(key="scene").value
    hyps = expected_beams(explorer_env, "hard-normed", explorer_env.scene_path(scene), beam=4, max_len=16,
                          length_norm=1.0)
    assert caption_shown(at) == hyps[0].caption
    at.sidebar.selectbox(key="ckpt").set_value("tiny-soft").run()
    assert at.sidebar.slider(key="lnorm").value == 0.0  # a checkpoint without the figures: the defaults
    assert at.sidebar.slider(key="beam").value == 3 and at.sidebar.slider(key="maxlen").value == 20
    at.sidebar.slider(key="lnorm").set_value(0.5).run()
    assert at.query_params["lnorm"] == "0.5"
    at.sidebar.selectbox(key="ckpt").set_value("tiny-hard-normed").run()
    assert at.sidebar.slider(key="lnorm").value == 1.0
    at.sidebar.slider(key="lnorm").set_value(0.0).run()
    link = dict(at.query_params)
    assert link["lnorm"] == "0.0"
    reopened = new_app(link)
    reopened.run()
    assert reopened.sidebar.slider(key="lnorm").value == 0.0  # the link wins over the checkpoint
    assert caption_shown(reopened) == caption_shown(at)


def test_bad_upload_shows_the_loader_message_then_a_good_one_captions(app, explorer_env):
    app.sidebar.radio(key="source").set_value("Upload").run()
    assert any("Choose a gallery scene or upload" in i.value for i in app.info)
    app.file_uploader[0].set_value(("holiday.png", b"this is just text, not a picture\n", "image/png")).run()
    assert not app.exception
    errors = [e.value for e in app.error]
    assert errors and "'holiday.png' is not an image" in errors[0], errors
    assert not [m for m in app.markdown if m.value.startswith("**Caption:**")]
    good = explorer_env.scene_path(explorer_env.test_ids()[1])
    app.file_uploader[0].set_value(("scene.png", good.read_bytes(), "image/png")).run()
    assert not app.error, [e.value for e in app.error]
    assert caption_shown(app) == expected_beams(explorer_env, "soft", good)[0].caption
    # a synthetic scene is in the training domain: no warning
    assert not [w for w in app.warning if "synthetic shapes" in w.value]
    assert "scene" not in app.query_params  # uploads cannot travel in links


def test_a_heavily_compressed_scene_is_warned_about_for_its_compression_alone(app, explorer_env):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    scene = Image.open(explorer_env.scene_path(explorer_env.test_ids()[1])).convert("RGB")
    scene.save(buffer, format="JPEG", quality=15)
    app.sidebar.radio(key="source").set_value("Upload").run()
    app.file_uploader[0].set_value(("squeezed.jpg", buffer.getvalue(), "image/jpeg")).run()
    warnings = [w.value for w in app.warning]
    assert any(w.startswith("**This picture is heavily JPEG-compressed, so its caption may miss objects.**")
               for w in warnings), warnings
    assert not any("looks unlike the pictures" in w for w in warnings)
    assert any(m.value.startswith("It is heavily JPEG-compressed: its 8×8 blocks show") for m in app.markdown)
    assert caption_shown(app)


def test_photo_upload_warns_that_captions_are_not_meaningful(app):
    app.sidebar.radio(key="source").set_value("Upload").run()
    app.file_uploader[0].set_value(("astronaut.jpg", photo_jpeg(), "image/jpeg")).run()
    warnings = [w.value for w in app.warning]
    assert any(w.startswith("**This picture looks unlike the pictures this model learnt from") for w in warnings)
    # in plain words, what the model can name: the shapes world's kinds of object and colours, from its vocabulary
    assert any("The model can only name what its training captions named: 7 kinds of object (circle, cross, "
               "diamond, hexagon, square, star, triangle)" in w for w in warnings), warnings
    assert not any("loneliest" in w or "threshold" in w for w in warnings)  # the measurements are folded away
    assert any("dataset.json" in m.value for m in app.markdown if m.value.startswith("Compared with"))
    assert caption_shown(app)  # still captioned, with the warning next to it


def test_checkpoint_card_shows_model_card_and_metrics(explorer_env):
    at = new_app()
    at.switch_page("views/card.py")
    at.run()
    assert any("Tiny soft model" in m.value for m in at.markdown)
    tables = [d.value for d in at.dataframe]
    metrics = next(t for t in tables if "metric" in t.columns)
    assert dict(zip(metrics["metric"], metrics["value"])) == {"BLEU-4": 0.123, "CIDEr": 0.456}
    facts = next(t for t in tables if "value" in t.columns and "" in t.columns)
    assert dict(zip(facts[""], facts["value"]))["attention"] == "soft"


@pytest.mark.parametrize("typed", ["/etc", "../../../../etc/passwd"])
def test_path_outside_allowed_roots_is_refused_and_app_keeps_running(explorer_env, typed):
    at = new_app()
    at.switch_page("views/card.py")
    at.run()
    at.text_input(key="card_path").set_value(typed)
    at.button(key="card_open").click().run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert errors and "outside the folders checkpoints may be loaded from" in errors[0], errors
    assert any("Tiny soft model" in m.value for m in at.markdown)  # the selected model is still shown


def test_path_inside_roots_opens_that_checkpoint(explorer_env):
    at = new_app()
    at.switch_page("views/card.py")
    at.run()
    at.text_input(key="card_path").set_value(str(explorer_env.roots / "tiny-hard"))
    at.button(key="card_open").click().run()
    assert not at.error, [e.value for e in at.error]
    assert at.sidebar.selectbox(key="ckpt").value == "tiny-hard"
    assert any("Tiny hard model" in m.value for m in at.markdown)


def test_a_broken_checkpoint_shows_its_error_and_others_still_work(explorer_env, tmp_path, monkeypatch):
    import os
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(explorer_env.roots / "tiny-soft", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])  # truncated download
    monkeypatch.setenv("SAT_CHECKPOINT_DIRS", os.pathsep.join([str(explorer_env.roots), str(tmp_path)]))
    at = new_app({"ckpt": "broken"})
    at.run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert errors and "truncated or corrupt" in errors[0], errors
    at.sidebar.selectbox(key="ckpt").set_value("tiny-soft").run()
    assert not at.error
    assert caption_shown(at)


def test_sidebar_says_which_precision_decodes_and_why(app):
    """The card's figures name their precision; the sidebar says which one this machine decodes in."""
    from sat_core import precision

    expected = precision.resolve("cpu", "auto")
    shown = [c.value for c in app.sidebar.caption if c.value.startswith("Matrix products in")]
    assert shown == [f"Matrix products in **{expected}** ({precision.describe_cpu()})."]
    assert shown[0].endswith(f"auto = {expected}).")


def test_photo_upload_warns_by_the_encoders_view_when_colours_look_familiar(explorer_env, tmp_path, monkeypatch):
    """A checkpoint (ImageNet encoder, tiny random decoder) whose stored colour statistics include the
    photo's own: only the encoder's view (its mean annotation against the training scenes') can say
    the photo is unlike the training data."""
    import io
    import os

    from PIL import Image

    from sat_core.evaluation.card import annotation_statistics
    from sat_core.checkpoint import save_checkpoint
    from sat_core.evaluation.domain import ANNOTATION_MARGIN, AnnotationReference, DomainReference, mean_annotations

    from sat_core.config import ModelConfig, PreprocessConfig
    from sat_core.models import efficientnet
    from sat_core.models.captioner import Captioner

    vocab = explorer_env.checkpoint("soft").vocab
    config = ModelConfig(encoder="efficientnet_lite0", pretrained=True, feature_dim=112, vocab_size=len(vocab),
                         embed_dim=16, hidden_dim=32, attn_dim=16, dropout=0.0)
    model = Captioner(config).eval()
    cfg = PreprocessConfig(image_size=224, mean=efficientnet.MEAN, std=efficientnet.STD, crop=1.0)
    photo = Image.open(io.BytesIO(photo_jpeg())).convert("RGB")
    scenes = [load_image(explorer_env.scene_path(e["imgid"])) for e in explorer_env.dataset["images"]
              if e["split"] == "train"]
    domain = DomainReference.from_images([photo, photo.transpose(Image.Transpose.FLIP_LEFT_RIGHT)],
                                         source="photos.json (train split, 2 images)").to_dict()
    domain["annotations"] = annotation_statistics(model, cfg, scenes)
    ratio = AnnotationReference.from_dict(domain["annotations"]).ratio(
        mean_annotations(model, preprocess(photo, cfg)[0][None])[0])
    assert ratio > ANNOTATION_MARGIN
    save_checkpoint(tmp_path / "seen", model, model_config=config, vocab=vocab, preprocess=cfg,
                    training={"domain": domain}, model_card="# Seen\n")
    monkeypatch.setenv("SAT_CHECKPOINT_DIRS", os.pathsep.join([str(explorer_env.roots), str(tmp_path)]))
    at = new_app({"ckpt": "seen"})
    at.run()
    at.sidebar.radio(key="source").set_value("Upload").run()
    at.file_uploader[0].set_value(("astronaut.jpg", photo_jpeg(), "image/jpeg")).run()
    assert not at.exception
    assert any(w.value.startswith("**This picture looks unlike the pictures") for w in at.warning)
    why = [m.value for m in at.markdown if m.value.startswith("Compared with")]  # the measurements, folded away
    assert any("photos.json (train split, 2 images)" in w and f"{ratio:.2f}× as far" in w
               and "colour statistics" not in w for w in why), why


@pytest.mark.parametrize("ckpt, taught", [("tiny-soft", "not recorded"),
                                          ("tiny-hard-normed", "captions + object masks, λ_a = 0.5 (not in the paper)")])
def test_the_card_says_what_taught_alpha(explorer_env, ckpt, taught):
    at = new_app({"ckpt": ckpt})
    at.switch_page("views/card.py")
    at.run()
    facts = at.dataframe[0].value.set_index("")["value"]
    assert facts["α trained by"] == taught
    assert facts["gate β"] == ("off" if "hard" in ckpt else "on")  # hard attention has no gate, whatever its config


@pytest.mark.parametrize("offset, shown", [(0.5, True), (-0.5, False)])
def test_a_caption_under_the_checkpoints_mark_is_flagged_unsure_with_how_it_was_measured(
        explorer_env, tmp_path, monkeypatch, offset, shown):
    """The tiny soft model again, with a confidence reference whose mark lies just above (or below) the log p of
    the first scene's caption: the page says the model is unsure (or says nothing), and the folded note gives the
    mark and what the checkpoint's evaluation measured of the flag."""
    import os

    from sat_core.checkpoint import save_checkpoint
    from sat_core.evaluation.confidence import ConfidenceReference

    loaded = explorer_env.checkpoint("soft")
    best = expected_beams(explorer_env, "soft", explorer_env.scene_path(explorer_env.test_ids()[0]))[0]
    mark = ConfidenceReference(best.logprob + offset, 0.1, 400)
    save_checkpoint(tmp_path / "marked", loaded.model, model_config=loaded.model_config, vocab=loaded.vocab,
                    preprocess=loaded.preprocess, training={"confidence": mark.to_dict()},
                    metrics={"generalisation": {"test": {"unsure_erring": 0.4, "unsure_right": 0.06},
                                                "shifted": {"unsure_erring": None}, "crop": "hostile"}},
                    model_card="# Marked\n")
    monkeypatch.setenv("SAT_CHECKPOINT_DIRS", os.pathsep.join([str(explorer_env.roots), str(tmp_path)]))
    at = new_app({"ckpt": "marked"})
    at.run()
    assert not at.exception
    assert caption_shown(at) == best.caption
    notes = [i.value for i in at.info if i.value.startswith("**The model is unsure of this caption.**")]
    assert len(notes) == int(shown)
    if shown:
        assert f"log p = {best.logprob:.2f}" in notes[0]
        assert "all but 10% of the captions it gave its validation images" in notes[0]
        how = [m.value for m in at.markdown if m.value.startswith("The mark, log p = ")]
        assert how == [f"The mark, log p = {mark.threshold:.2f}, is the 10% quantile of log p(caption) over the 400 "
                       "captions the checkpoint's own beam search gave its validation split. A caption decoded with "
                       "other settings is compared with the same mark. Whether the caption is true is not measured "
                       "here: the flag only says the model gave its words little probability. Not in the paper: a "
                       "reading of the model's own probabilities, which changes no caption. Where this checkpoint was "
                       "evaluated, the flag fell on this share of the captions that get an object wrong / of the "
                       "others: test 40% / 6%."]


def test_a_malformed_mark_shows_no_flag_and_the_page_works(explorer_env, tmp_path, monkeypatch):
    import os

    from sat_core.checkpoint import save_checkpoint

    loaded = explorer_env.checkpoint("soft")
    save_checkpoint(tmp_path / "badmark", loaded.model, model_config=loaded.model_config, vocab=loaded.vocab,
                    preprocess=loaded.preprocess, training={"confidence": {"threshold": "high"}},
                    model_card="# Bad mark\n")
    monkeypatch.setenv("SAT_CHECKPOINT_DIRS", os.pathsep.join([str(explorer_env.roots), str(tmp_path)]))
    at = new_app({"ckpt": "badmark"})
    at.run()
    assert not at.exception and caption_shown(at)
    assert not any("unsure" in i.value for i in at.info)
