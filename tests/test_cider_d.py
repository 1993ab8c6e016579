"""sat_core.evaluation.cider_d: CIDEr-D on tensors gives pycocoevalcap's figures, image by image."""

from __future__ import annotations

import random

import pytest
import torch

from sat_core.data.vocab import Vocab
from sat_core.errors import SatError
from sat_core.evaluation.cider_d import CiderD

WORDS = "a the red blue dog cat on grass sits runs two big small near tree ball".split()


def _corpus(seed: int = 0, images: int = 30):
    """Random references (1–5 per image, 1–9 words) and one candidate per image, with edge cases: a caption that is
    a reference, one word, a repeated word (clipping), words no reference has."""
    rng = random.Random(seed)
    refs = [[[rng.choice(WORDS) for _ in range(rng.randint(1, 9))] for _ in range(rng.randint(1, 5))]
            for _ in range(images)]
    cands = [[rng.choice(WORDS + ["zebra", "quokka"]) for _ in range(rng.randint(1, 14))] for _ in range(images)]
    cands[0], cands[1], cands[2], cands[3] = list(refs[0][0]), ["dog"], ["dog"] * 6, ["zebra", "quokka", "zebra"]
    return refs, cands


def _pycocoevalcap(refs, cands) -> list[float]:
    from pycocoevalcap.cider.cider import Cider

    gts = {i: [" ".join(r) for r in refs[i]] for i in range(len(refs))}
    res = {i: [" ".join(cands[i])] for i in range(len(refs))}
    return list(Cider().compute_score(gts, res)[1])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_image_s_score_is_pycocoevalcap_s(seed):
    """pycocoevalcap's Cider is CIDEr-D (clipped counts, gaussian length penalty σ = 6, × 10) with document
    frequencies from the references it is given: the same references make the same corpus here."""
    refs, cands = _corpus(seed)
    expected = _pycocoevalcap(refs, cands)
    got = CiderD(refs).score_words(cands, range(len(refs))).tolist()
    assert got == pytest.approx(expected, abs=1e-4)
    assert max(expected) > 1.0 and expected[0] > 0 and expected[3] == 0.0  # the example has teeth


def test_decoder_tokens_score_like_their_words():
    """What training feeds it: vocabulary ids padded with <pad> after <end>, several candidates per image."""
    refs, cands = _corpus(3, images=12)
    vocab = Vocab(["<pad>", "<start>", "<end>", "<unk>", *WORDS, "zebra", "quokka"])
    scorer = CiderD(refs, words=vocab.itos)
    table = scorer.vocab_table(vocab)
    images = [i for i in range(12) for _ in range(2)]  # each image twice
    captions = [cands[i] for i in images]
    T = max(len(c) for c in captions) + 1
    tokens = torch.tensor([vocab.encode(c, add_specials=False) + [vocab.end_id] + [vocab.pad_id] * (T - len(c) - 1)
                           for c in captions])  # (24, T)
    got = scorer.score(table[tokens], torch.tensor(images))
    assert got.tolist() == pytest.approx(scorer.score_words(captions, images).tolist(), abs=1e-6)
    expected = _pycocoevalcap(refs, cands)
    assert got.tolist() == pytest.approx([expected[i] for i in images], abs=1e-4)


def test_document_frequencies_come_from_the_corpus_given():
    """A training-set scorer weighs n-grams by the training references: a word every image's references use is
    worth nothing, one only this image's use is worth the most."""
    refs = [[["a", "dog"], ["a", "dog", "runs"]], [["a", "cat"]], [["a", "tree"]]]
    scorer = CiderD(refs)
    common, rare = scorer.score_words([["a"], ["dog"]], [0, 0]).tolist()
    assert common == 0.0 and rare > 0.0


def test_a_vocabulary_word_without_an_id_is_refused_with_what_to_do():
    scorer = CiderD([[["a", "dog"]]])
    with pytest.raises(SatError, match="words=vocab.itos"):
        scorer.vocab_table(Vocab(["<pad>", "<start>", "<end>", "<unk>", "a", "dog", "cat"]))
    with pytest.raises(SatError, match="no"):
        CiderD([[]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_the_gpu_the_scores_are_the_cpu_s():
    refs, cands = _corpus(4)
    cpu = CiderD(refs).score_words(cands, range(len(refs)))
    gpu = CiderD(refs, device="cuda").score_words(cands, range(len(refs)))
    assert gpu.device.type == "cuda" and gpu.cpu().tolist() == pytest.approx(cpu.tolist(), abs=1e-5)
