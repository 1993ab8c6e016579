"""The one decode loop: batched == one by one, greedy == beam 1, sessions, scoring, interventions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from sat_core.config import DecodeConfig
from sat_core.decoding import (DecodeSession, Intervention, beam_search, sample_hard, sample_locations,
                               score_caption)
from sat_core.errors import SatError
from sat_core.data.images import load_image, preprocess
from sat_core.models.captioner import Captioner
from tests.conftest import tiny_config
from tests.explorer.conftest import explorer_env  # noqa: F401  (a fixture)


def _images(n: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 112, 112, generator=g)


def _reference_greedy(model, vocab, image, max_len):
    """An independent argmax loop over decoder.step (no beam bookkeeping)."""
    feats = model.encode(image[None]).feats
    prep, h, c = model.decoder.prepare(feats)
    prev, tokens = torch.tensor([vocab.start_id]), []
    banned = [vocab.pad_id, vocab.start_id, vocab.unk_id]
    for t in range(max_len):
        out = model.decoder.step(prev, h, c, prep)
        h, c = out.h, out.c
        logits = out.logits[0].clone()
        logits[banned + ([vocab.end_id] if t == 0 else [])] = -float("inf")  # no empty caption
        tok = int(logits.argmax())
        tokens.append(tok)
        if tok == vocab.end_id:
            break
        prev = torch.tensor([tok])
    return tokens


def _peaked_model(vocab, attention="soft"):
    """A model that prefers the chain <start> a red circle <end>, with image-dependent noise.

    The embedding is one-hot (m = V) and L_o maps each word to its successor, so beams finish
    and competing hypotheses differ by a few words.
    """
    torch.manual_seed(3)
    V = len(vocab)
    model = Captioner(tiny_config(V, attention=attention, embed_dim=V)).eval()
    chain = {vocab.start_id: "a", vocab.stoi["a"]: "red", vocab.stoi["red"]: "circle"}
    with torch.no_grad():
        model.decoder.embed.weight.copy_(torch.eye(V) * 6)
        model.decoder.L_h.weight.mul_(0.1)
        model.decoder.L_z.weight.mul_(0.1)
        successor = torch.full((V, V), 0.0)
        for prev in range(V):
            successor[vocab.stoi[chain[prev]] if prev in chain else vocab.end_id, prev] = 1.0
        model.decoder.L_o.weight.copy_(successor + 0.1 * torch.randn(V, V))
        model.decoder.L_o.bias.zero_()
    return model


@torch.no_grad()
def test_greedy_equals_beam_one_and_a_plain_argmax_loop(tiny_model, vocab):
    images = _images(3)
    results = beam_search(tiny_model, images, vocab, DecodeConfig(beam_size=1, max_len=8))
    for i in range(3):
        assert results[i][0].tokens == _reference_greedy(tiny_model, vocab, images[i], 8)


@pytest.mark.parametrize("beam", [1, 3, 5])
def test_batched_equals_one_image_at_a_time(tiny_model, vocab, beam):
    images = _images(4)
    cfg = DecodeConfig(beam_size=beam, max_len=10, length_norm=0.7)
    batched = beam_search(tiny_model, images, vocab, cfg)
    for i in range(4):
        alone = beam_search(tiny_model, images[i : i + 1], vocab, cfg)[0]
        assert [h.tokens for h in batched[i]] == [h.tokens for h in alone]
        for a, b in zip(batched[i], alone):
            assert a.score == pytest.approx(b.score, abs=1e-5)
            np.testing.assert_allclose(a.alphas, b.alphas, atol=1e-5)


def test_beams_are_ranked_finished_and_consistent(vocab):
    model = _peaked_model(vocab)
    results = beam_search(model, _images(2), vocab, DecodeConfig(beam_size=4, max_len=12))
    for hyps in results:
        assert len(hyps) == 4
        assert all(h.finished and h.tokens[-1] == vocab.end_id for h in hyps)
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4  # distinct hypotheses
        for h in hyps:
            assert h.alphas.shape == (len(h.tokens), 196)
            np.testing.assert_allclose(h.alphas.sum(1), 1.0, atol=1e-5)
            assert vocab.unk_id not in h.tokens


def test_unreachable_end_still_returns_k_hypotheses_at_the_cap(vocab):
    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab))).eval()
    with torch.no_grad():
        model.decoder.L_o.bias[vocab.end_id] = -1e4  # <end> practically unreachable
    results = beam_search(model, _images(2), vocab, DecodeConfig(beam_size=3, max_len=6))
    for hyps in results:
        assert len(hyps) == 3
        assert all(not h.finished and len(h.tokens) == 6 for h in hyps)
        assert hyps[0].score >= hyps[1].score >= hyps[2].score


def test_scoring_a_decoded_caption_gives_back_its_score(vocab):
    model = _peaked_model(vocab)
    image = _images(1)[0]
    hyp = beam_search(model, image[None], vocab, DecodeConfig(beam_size=3, max_len=12))[0][0]
    assert hyp.finished and hyp.words
    scored = score_caption(model, vocab, image, hyp.words)
    assert scored.tokens == hyp.tokens
    assert scored.logprob == pytest.approx(hyp.logprob, abs=1e-4)
    np.testing.assert_allclose(scored.alphas, hyp.alphas, atol=1e-5)


def test_scoring_flags_unknown_words(tiny_model, vocab):
    scored = score_caption(tiny_model, vocab, _images(1)[0], "a purple circle")
    assert scored.unknown == ["purple"]
    assert scored.words == ["a", "<unk>", "circle"]
    assert len(scored.logprobs) == 4 and np.all(scored.logprobs <= 0)
    with pytest.raises(SatError, match="empty"):
        score_caption(tiny_model, vocab, _images(1)[0], "  ")


def test_scoring_strips_punctuation_before_looking_words_up(tiny_model, vocab):
    scored = score_caption(tiny_model, vocab, _images(1)[0], "A red, circle!")
    assert scored.words == ["a", "red", "circle"] and scored.unknown == []
    same = score_caption(tiny_model, vocab, _images(1)[0], "a red circle")
    np.testing.assert_array_equal(scored.logprobs, same.logprobs)


def test_scoring_under_an_intervention_matches_the_intervened_decode(vocab):
    model = _peaked_model(vocab)
    image = _images(1)[0]
    region = np.zeros(model.encode(image[None]).grid, dtype=bool)
    region[:, : region.shape[1] // 2] = True
    edit = Intervention(region, "include")
    hyp = beam_search(model, image[None], vocab, DecodeConfig(beam_size=1, max_len=12), intervention=edit)[0][0]
    scored = score_caption(model, vocab, image, hyp.words, intervention=edit)
    assert scored.logprob == pytest.approx(hyp.logprob, abs=1e-4)
    np.testing.assert_allclose(scored.alphas, hyp.alphas, atol=1e-5)
    assert np.all(scored.alphas[:, ~region.reshape(-1)] == 0)  # α was kept inside the region
    plain = score_caption(model, vocab, image, hyp.words)
    assert not np.allclose(plain.alphas, scored.alphas)


def test_sampled_locations_along_a_caption_are_seeded_and_follow_alpha(vocab):
    model = _peaked_model(vocab, "hard")
    image = _images(1)[0]
    paths = sample_locations(model, vocab, image, "a red circle", 4, seed=5)
    assert paths.locations.shape == (4, 4) and paths.logprobs.shape == (4, 4)
    again = sample_locations(model, vocab, image, "a red circle", 4, seed=5)
    np.testing.assert_array_equal(paths.locations, again.locations)
    other = sample_locations(model, vocab, image, "a red circle", 4, seed=6)
    assert not np.array_equal(paths.locations, other.locations)
    picked = np.take_along_axis(paths.alphas, paths.locations[..., None], axis=2)  # α of each sampled cell
    assert np.all(picked > 0)
    assert paths.caption_logprobs.shape == (4,)
    with pytest.raises(SatError, match="hard-attention"):
        sample_locations(_peaked_model(vocab), vocab, image, "a red circle", 2)


def test_session_steps_back_and_forced_prefix(vocab):
    model = _peaked_model(vocab)
    image = _images(1)[0]
    greedy = beam_search(model, image[None], vocab, DecodeConfig(beam_size=1, max_len=12))[0][0]
    session = DecodeSession(model, vocab, image, DecodeConfig(max_len=12), top_k=4)
    first = session.step()
    assert first.word == vocab.itos[greedy.tokens[0]]
    assert first.top_words[0] == first.word and len(first.top_probs) == 4
    assert first.alpha.shape == (14, 14) and first.alpha.sum() == pytest.approx(1.0, abs=1e-5)
    assert 0 < first.beta < 1
    # Forcing the word it would have chosen continues exactly like a fresh decode.
    session.force(first.word)
    session.run()
    assert [s.token for s in session.steps] == greedy.tokens
    assert session.logprob == pytest.approx(greedy.logprob, abs=1e-4)
    # Going back to the first word and forcing another one changes what follows.
    while len(session.steps) > 1:
        session.back()
    assert len(session.steps) == 1
    forced = session.force(first.top_words[1])
    assert forced.word == first.top_words[1] and forced.forced and len(session.steps) == 1
    session.run()
    assert session.words[: 1] == [first.top_words[1]] or first.top_words[1] == "<end>"
    assert [s.token for s in session.steps] != greedy.tokens


def test_session_refuses_unknown_forced_word(tiny_model, vocab):
    session = DecodeSession(tiny_model, vocab, _images(1)[0])
    with pytest.raises(SatError, match="not in the model's vocabulary"):
        session.step(force="zebra")


def test_intervention_changes_alpha_exactly_where_asked(vocab):
    model = _peaked_model(vocab)
    image = _images(1)[0]
    cfg = DecodeConfig(beam_size=1, max_len=8)
    region = np.zeros((14, 14), dtype=bool)
    region[2:6, 3:9] = True
    plain = DecodeSession(model, vocab, image, cfg)
    edited = DecodeSession(model, vocab, image, cfg, intervention=Intervention(region, "exclude", steps=[1]))
    p0, e0 = plain.step(), edited.step()
    np.testing.assert_array_equal(p0.alpha, e0.alpha)  # step 0 untouched
    e0 = edited.force(p0.word)
    p1, e1 = plain.step(), edited.step()
    assert np.all(e1.alpha[region] == 0)
    outside = p1.alpha * ~region
    np.testing.assert_allclose(e1.alpha, outside / outside.sum(), rtol=1e-5, atol=1e-7)
    inside = Intervention(region, "include").editor(0, torch.device("cpu"))
    alpha = torch.softmax(torch.randn(2, 196), 1)
    kept = inside(alpha).numpy().reshape(2, 14, 14)
    assert np.all(kept[:, ~region] == 0) and np.allclose(kept.sum((1, 2)), 1)


def test_intervention_in_beam_search_keeps_alpha_out_of_region(vocab):
    model = _peaked_model(vocab)
    region = np.zeros(196, dtype=bool)
    region[:98] = True
    hyps = beam_search(model, _images(2), vocab, DecodeConfig(beam_size=2, max_len=8),
                       intervention=Intervention(region, "exclude"))
    for h in (h for per in hyps for h in per):
        assert np.all(h.alphas[:, region] == 0)


def test_hard_sampling_is_seeded_and_differs_from_expectation(vocab):
    model = _peaked_model(vocab, attention="hard")
    image = _images(1)[0]
    a = sample_hard(model, vocab, image, 4, seed=7)
    b = sample_hard(model, vocab, image, 4, seed=7)
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert all(np.array_equal(x.locations, y.locations) for x, y in zip(a, b))
    assert all(np.all(h.locations >= 0) for h in a)
    assert len({tuple(h.locations[:3]) for h in a}) > 1  # different samples pick different regions
    expect = beam_search(model, image[None], vocab, DecodeConfig(beam_size=1))[0][0]
    assert np.all(expect.locations == -1)


def test_sampling_needs_a_hard_model(vocab):
    torch.manual_seed(0)
    soft = Captioner(tiny_config(len(vocab))).eval()
    with pytest.raises(SatError, match="hard-attention"):
        sample_hard(soft, vocab, _images(1)[0], 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_decode_matches_cpu(vocab):
    model = _peaked_model(vocab)
    images = _images(3)
    cpu = beam_search(model, images, vocab, DecodeConfig(beam_size=3))
    gpu = beam_search(model.cuda(), images, vocab, DecodeConfig(beam_size=3))
    assert [[h.tokens for h in x] for x in cpu] == [[h.tokens for h in x] for x in gpu]


# ---- beam bookkeeping: greedy for every normalisation, finished images leave the batch -------------------

CHAIN = ["a", "red", "blue", "green", "circle", "square", "star"]


def _staggered_model(vocab, strengths=(7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0)):
    """A model whose images end after different numbers of words, decoded from crafted annotations.

    The embedding is one-hot (m = V), L_o sends <start> → a → red → … with falling logits
    ``strengths``, and <end>'s logit is L_z ẑ = s_b, a scalar carried by image b's annotations (no
    gate, identical regions, so α does not matter): image b ends at the first word whose chain
    logit falls below s_b. Small fixed noise gives the beams distinct alternatives.
    """
    torch.manual_seed(5)
    V = len(vocab)
    model = Captioner(tiny_config(V, embed_dim=V, gate=False)).eval()
    ids = [vocab.start_id] + [vocab.stoi[w] for w in CHAIN]
    with torch.no_grad():
        model.decoder.embed.weight.copy_(torch.eye(V))
        model.decoder.L_h.weight.zero_()
        model.decoder.L_z.weight.zero_()
        model.decoder.L_z.weight[vocab.end_id, 0] = 1.0  # out[<end>] = ẑ_0 = s_b
        L_o = 0.3 * torch.randn(V, V)
        others = [i for i in range(4, V) if i not in ids]
        for prev, nxt, c in zip(ids, ids[1:], strengths):
            L_o[nxt, prev] = c
            L_o[others, prev] = c - 1.0  # alternatives that keep <end> out of a beam until s_b beats them
        L_o[vocab.end_id] = 0.0
        L_o[:, vocab.end_id] = 0.0  # out[<end>] = s_b reaches <end>'s logit only
        L_o[vocab.end_id, vocab.end_id] = 1.0
        model.decoder.L_o.weight.copy_(L_o)
        model.decoder.L_o.bias.zero_()
    return model


def _annotations(levels, L=196, D=16):
    feats = torch.zeros(len(levels), L, D)  # (B, L, D)
    feats[:, :, 0] = torch.tensor(levels).view(-1, 1)
    return feats


@pytest.mark.parametrize("length_norm", [0.0, 0.5, 1.0, 2.0])
def test_beam_one_is_greedy_for_every_length_norm(vocab, length_norm):
    """With length_norm > 0 a live beam divided by a longer length could outscore greedy's <end>;
    beam 1 must still stop there (the old bound let the search run on)."""
    model = _staggered_model(vocab)
    feats = _annotations([6.5, 4.5, 2.5])
    cfg = DecodeConfig(beam_size=1, max_len=12, length_norm=length_norm, precision="fp32")
    results = beam_search(model, feats, vocab, cfg)
    chain = [vocab.stoi[w] for w in CHAIN]
    for hyps, words in zip(results, (1, 3, 5)):
        assert hyps[0].tokens == chain[:words] + [vocab.end_id]
        assert hyps[0].finished
    # And on a random model: the plain argmax loop, for a non-zero normalisation.
    torch.manual_seed(0)
    tiny = Captioner(tiny_config(len(vocab))).eval()
    images = _images(3)
    for i, hyps in enumerate(beam_search(tiny, images, vocab, cfg)):
        assert hyps[0].tokens == _reference_greedy(tiny, vocab, images[i], 12)


@pytest.mark.parametrize("beam", [1, 3])
def test_finished_images_leave_the_batch_without_changing_any_result(vocab, beam):
    model = _staggered_model(vocab)
    feats = _annotations([6.5, 0.5, 4.5, 2.5, 5.5])
    cfg = DecodeConfig(beam_size=beam, max_len=12, length_norm=0.7, precision="fp32")
    rows_seen = []
    step = model.decoder.step

    def counting_step(tokens, *args, **kwargs):
        rows_seen.append(tokens.shape[0])
        return step(tokens, *args, **kwargs)

    model.decoder.step = counting_step
    batched = beam_search(model, feats, vocab, cfg)
    del model.decoder.step
    assert len(set(rows_seen[1:])) >= 3, rows_seen  # the images really finish at different steps
    assert rows_seen[0] == 5  # one row per image at t = 0, not K identical ones
    assert rows_seen[1] == 5 * beam
    assert rows_seen[-1] < 5 * beam
    assert all(a >= b for a, b in zip(rows_seen[1:], rows_seen[2:]))  # rows only ever leave
    for i in range(5):
        alone = beam_search(model, feats[i : i + 1], vocab, cfg)[0]
        assert [h.tokens for h in batched[i]] == [h.tokens for h in alone]
        for a, b in zip(batched[i], alone):
            assert a.score == pytest.approx(b.score, abs=1e-5)
            assert a.finished == b.finished
            np.testing.assert_allclose(a.alphas, b.alphas, atol=1e-6)


def test_session_sync_replays_forced_words_with_few_steps(explorer_env):
    loaded = explorer_env.checkpoint("soft")
    tensor, _ = preprocess(load_image(next(explorer_env.world / e["filepath"] / e["filename"] for e in explorer_env.dataset["images"] if e["split"] == "test")), loaded.preprocess)
    cfg = DecodeConfig(beam_size=1, max_len=8)
    session = DecodeSession(loaded.model, loaded.vocab, tensor, cfg)
    word = loaded.vocab.itos[5]
    session.sync(4, {1: word})
    direct = DecodeSession(loaded.model, loaded.vocab, tensor, cfg)
    direct.step()
    direct.step(force=word)
    direct.step()
    direct.step()
    assert [s.token for s in session.steps] == [s.token for s in direct.steps]
    assert [s.forced for s in session.steps] == [False, True, False, False]
    kept = session.steps[0]
    session.sync(2, {})  # dropping the forced word redoes step 1 greedily, keeps step 0
    assert session.steps[0] is kept and not session.steps[1].forced
    greedy = DecodeSession(loaded.model, loaded.vocab, tensor, cfg)
    greedy.step()
    greedy.step()
    assert [s.token for s in session.steps] == [s.token for s in greedy.steps]


def _test_scene(env):
    loaded = env.checkpoint("soft")
    entry = next(e for e in env.dataset["images"] if e["split"] == "test")
    tensor, _ = preprocess(load_image(env.world / entry["filepath"] / entry["filename"]), loaded.preprocess)
    return loaded, tensor


def test_session_following_the_beam_replays_its_caption_until_a_forced_word_leaves_it(explorer_env):
    loaded, tensor = _test_scene(explorer_env)
    cfg = DecodeConfig(beam_size=4, max_len=10, precision="fp32")
    best = beam_search(loaded.model, tensor[None], loaded.vocab, cfg)[0][0]
    session = DecodeSession(loaded.model, loaded.vocab, tensor, dataclasses.replace(cfg, beam_size=1))
    session.sync(3, {}, follow=best.tokens)
    assert [s.token for s in session.steps] == best.tokens[:3]
    assert all(s.followed and not s.forced for s in session.steps)
    kept = session.steps[1]
    session.sync(99, {}, follow=best.tokens)  # on to the end: the steps taken are kept
    assert session.steps[1] is kept and session.done
    assert [s.token for s in session.steps] == best.tokens
    assert session.logprob == pytest.approx(best.logprob, abs=1e-4)
    np.testing.assert_allclose(session.alphas, best.alphas, atol=1e-5)
    for s in session.steps:  # a followed word's rank among the shown words, as its distribution says
        assert s.rank is None or s.top_words[s.rank - 1] == s.word
    # Forcing another word at step 1 leaves the beam's caption: what follows is the most probable word.
    other = next(w for w in session.steps[1].top_words if w not in (session.steps[1].word, "<end>"))
    session.sync(99, {1: other}, follow=best.tokens)
    assert session.steps[0].followed and session.steps[0].token == best.tokens[0]
    assert session.steps[1].forced and session.steps[1].word == other
    assert not any(s.followed or s.forced for s in session.steps[2:])
    direct = DecodeSession(loaded.model, loaded.vocab, tensor, dataclasses.replace(cfg, beam_size=1))
    direct.step(force=best.tokens[0])
    direct.step(force=other)
    direct.run()
    assert [s.token for s in session.steps] == [s.token for s in direct.steps]
    # No caption to follow: greedy, as before.
    session.sync(99, {}, follow=())
    greedy = beam_search(loaded.model, tensor[None], loaded.vocab, dataclasses.replace(cfg, beam_size=1))[0][0]
    assert [s.token for s in session.steps] == greedy.tokens and not any(s.followed for s in session.steps)


def test_best_reference_scores_each_reference_as_score_caption_does(tiny_model, vocab):
    from sat_core.decoding import best_reference

    image = _images(1)[0]
    refs = ["a red circle", "two blue squares left of a star", "a purple circle", "a green star"]
    cfg = DecodeConfig(max_len=6, length_norm=0.7)
    best = best_reference(tiny_model, vocab, image, refs, cfg)
    # "purple" is not in the vocabulary and the second one is over the length cap: beam search can't say them
    reachable = [r for r in refs if "purple" not in r and len(r.split()) <= 6]
    scores = {r: score_caption(tiny_model, vocab, image, r).logprob / (len(r.split()) + 1) ** 0.7 for r in reachable}
    assert best.reachable == 2
    assert best.caption == max(scores, key=scores.get)
    assert best.score == pytest.approx(scores[best.caption], abs=1e-4)
    assert best_reference(tiny_model, vocab, image, ["a purple circle"], cfg) is None


def test_the_beams_own_caption_as_reference_scores_what_the_beam_scored(vocab):
    from sat_core.decoding import best_reference

    model = _peaked_model(vocab)
    image = _images(1)[0]
    for length_norm in (0.0, 1.0):
        cfg = DecodeConfig(beam_size=3, max_len=12, length_norm=length_norm)
        hyp = beam_search(model, image[None], vocab, cfg)[0][0]
        own = best_reference(model, vocab, image, [hyp.caption, "a blue star and a green square"], cfg)
        assert own.reachable == 2
        assert own.score >= hyp.score - 1e-4  # the beam's caption is among them
        if own.caption == hyp.caption:
            assert own.score == pytest.approx(hyp.score, abs=1e-4)


def test_search_errors_need_the_expectation_for_hard_attention(vocab):
    from sat_core.decoding import best_reference

    torch.manual_seed(0)
    model = Captioner(tiny_config(len(vocab), attention="hard")).eval()
    with pytest.raises(SatError, match="hard_mode expect"):
        best_reference(model, vocab, _images(1)[0], ["a red circle"], DecodeConfig(hard_mode="sample"))
    assert best_reference(model, vocab, _images(1)[0], ["a red circle"], DecodeConfig()).reachable == 1


def test_a_reference_as_long_as_the_step_cap_is_unreachable_and_scoring_reuses_annotations(tiny_model, vocab):
    from sat_core.decoding import best_reference, encode_images

    image = _images(1)[0]
    cfg = DecodeConfig(max_len=4)  # four steps: at most three words and <end>
    assert all(len(h.words) <= 3 for h in beam_search(tiny_model, image[None], vocab, cfg)[0] if h.finished)
    assert best_reference(tiny_model, vocab, image, ["a red circle and"], cfg) is None  # four words
    from_image = best_reference(tiny_model, vocab, image, ["a red circle and", "a red circle"], cfg)
    assert from_image.reachable == 1 and from_image.caption == "a red circle"
    encoded = encode_images(tiny_model, image[None], cfg.precision)
    from_annotations = best_reference(tiny_model, vocab, encoded, ["a red circle"], cfg)
    assert from_annotations.score == pytest.approx(from_image.score, abs=1e-5)


# ---- no empty caption -----------------------------------------------------------------------------

def _ending_model(vocab, attention="soft"):
    """A random tiny model whose <end> outscores every word by 30 logits at every step, the first included."""
    torch.manual_seed(5)
    model = Captioner(tiny_config(len(vocab), attention=attention)).eval()
    with torch.no_grad():
        model.decoder.L_o.bias[vocab.end_id] = 30.0
    return model


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("attention", ["soft", "hard"])
@pytest.mark.parametrize("beam,length_norm", [(1, 0.0), (1, 1.0), (3, 0.0), (3, 1.0), (5, 1.0)])
def test_beam_search_never_ends_at_the_first_step(vocab, attention, beam, length_norm, precision):
    """<end> scores best at step 1, yet every hypothesis has one word, then ends: the rule forbids only the
    empty caption, and the word's log p stays the model's (<end> still takes its share of the softmax)."""
    model = _ending_model(vocab, attention)
    prep, h, c = model.decoder.prepare(model.encode(_images(1)).feats)
    first = model.decoder.step(torch.tensor([vocab.start_id]), h, c, prep)
    assert int(first.logits[0].argmax()) == vocab.end_id  # the case the rule is for
    cfg = DecodeConfig(beam_size=beam, length_norm=length_norm, max_len=8, precision=precision)
    for hyps in beam_search(model, _images(4), vocab, cfg):
        assert len(hyps) == beam
        for hyp in hyps:
            assert len(hyp.words) == 1 and hyp.finished and hyp.tokens[-1] == vocab.end_id
            assert hyp.logprob < -25  # the first word was far less likely than <end>: not renormalised away


def test_sampled_hard_locations_never_give_an_empty_caption(vocab):
    model = _ending_model(vocab, "hard")
    for hyp in sample_hard(model, vocab, _images(1)[0], 6, seed=3, cfg=DecodeConfig(precision="fp32")):
        assert len(hyp.words) == 1 and hyp.finished
    cfg = DecodeConfig(beam_size=2, hard_mode="sample", seed=1, precision="fp32")
    assert all(len(h.words) == 1 for hyps in beam_search(model, _images(3), vocab, cfg) for h in hyps)


@pytest.mark.parametrize("attention", ["soft", "hard"])
def test_a_decode_session_never_ends_at_the_first_step(vocab, attention):
    model = _ending_model(vocab, attention)
    image = _images(1)[0]
    cfg = DecodeConfig(beam_size=1, max_len=8, precision="fp32")
    session = DecodeSession(model, vocab, image, cfg, top_k=len(vocab))
    steps = session.run()
    assert len(steps) == 2 and steps[0].token != vocab.end_id and steps[1].token == vocab.end_id
    assert "<end>" not in steps[0].top_words and steps[1].top_words[0] == "<end>"
    assert session.words == beam_search(model, image[None], vocab, cfg)[0][0].words  # the same decision as greedy
    session.back()
    session.back()
    with pytest.raises(SatError, match="at least one word"):
        session.step(force="<end>")
