"""CIDEr-D on tensors: the reward of self-critical training, computed on the device the model runs on.

The same figure as pycocoevalcap's ``Cider`` (which computes CIDEr-D, Vedantam et al. 2015), for a whole batch
of candidates at once and with the document frequencies of a fixed corpus (self-critical training takes them
from the training references, Rennie et al. 2017):

- every n-gram (n = 1…4) of a caption becomes an integer key: its words' ids as base-B digits, exact (no hash);
- df(g): in how many images' reference sets g occurs; a sorted table of keys, read with ``searchsorted``;
  idf(g) = log(images) − log(max(1, df(g)));
- a caption's vector holds tf(g)·idf(g) per n-gram; against each reference, CIDEr-D clips the candidate's
  entries by the reference's: Σ_g min(v_c(g), v_r(g))·v_r(g) / (|v_c|·|v_r|);
- times the gaussian length penalty exp(−δ²/2σ²), σ = 6; the mean over n, over the references, × 10.

``evaluation.metrics`` stays the one path of reported figures (pycocoevalcap itself); this module is what a
training step can afford to call for every sampled caption, and a test holds the two equal.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch

from sat_core.data.vocab import SPECIALS, Vocab
from sat_core.errors import SatError

MAX_UNSEEN = 256  # ids kept for words of a candidate that neither the references nor ``words`` hold
CHUNK = 512  # images per pass when the reference tables are built


class CiderD:
    """CIDEr-D of candidate captions against the references of the images of a fixed corpus."""

    def __init__(self, references: Sequence[Sequence[Sequence[str]]], *, words: Iterable[str] = (), n: int = 4,
                 sigma: float = 6.0, device: torch.device | str = "cpu") -> None:
        """``references``: per image, its reference captions as token lists; the document frequencies come
        from them. ``words``: words candidates may hold that no reference has (a model's vocabulary)."""
        if not references or not any(len(refs) for refs in references):
            raise SatError("CIDEr-D needs reference captions; the corpus given has none.")
        self.n, self.sigma, self.device = n, sigma, torch.device(device)
        self.index: dict[str, int] = {}  # word -> id ≥ 1; 0 is padding
        for refs in references:
            for ref in refs:
                for w in ref:
                    self.index.setdefault(w, len(self.index) + 1)
        for w in words:
            if w not in SPECIALS[:3]:  # <pad>, <start>, <end> are no words; <unk> is one that matches nothing
                self.index.setdefault(w, len(self.index) + 1)
        self.base = len(self.index) + 1 + MAX_UNSEEN
        if self.base ** n >= 2**63:
            raise SatError(f"The references hold {len(self.index):,} distinct words: too many for exact {n}-gram "
                           f"keys in 64 bits (at most {int(2 ** (63 / n)) - MAX_UNSEEN - 1:,}). Lower-case or "
                           "normalise the captions, or build the vocabulary with a larger --min-word-count.")
        self.refs = _pad([[[self.index[w] for w in ref] for ref in refs] for refs in references]).to(self.device)
        self.ref_lengths = (self.refs > 0).sum(-1)  # (I, M)
        self.ref_counts = torch.tensor([len(refs) for refs in references], device=self.device)  # (I,)
        self.log_images = math.log(len(references))
        self.df_keys, self.df_counts = self._document_frequencies()
        self.ref_norms = self._reference_norms()  # (I, M, n)

    # -- candidates as word ids

    def encode(self, captions: Sequence[Sequence[str]]) -> torch.Tensor:
        """Captions (token lists) -> word ids (C, T), 0-padded. Words the corpus lacks get ids of their own,
        numbered per caption: they match nothing and still count in the caption's length and n-grams."""
        rows = []
        for caption in captions:
            unseen: dict[str, int] = {}
            row = []
            for w in caption:
                if w not in self.index:
                    unseen.setdefault(w, len(self.index) + 1 + min(len(unseen), MAX_UNSEEN - 1))
                row.append(self.index.get(w) or unseen[w])
            rows.append(row)
        return _pad([rows])[0].to(self.device)

    def vocab_table(self, vocab: Vocab) -> torch.Tensor:
        """(V,) word id of each vocabulary id: what ``score`` reads a decoder's tokens through; <pad>, <start>
        and <end> map to padding. Build the scorer with ``words=vocab.itos`` so every word has an id."""
        missing = [w for w in vocab.itos if w not in SPECIALS[:3] and w not in self.index]
        if missing:
            raise SatError(f"{len(missing)} vocabulary words (e.g. {missing[:3]}) have no CIDEr-D id; build the "
                           "scorer with words=vocab.itos.")
        return torch.tensor([0 if w in SPECIALS[:3] else self.index[w] for w in vocab.itos], device=self.device)

    # -- scores

    def score_words(self, captions: Sequence[Sequence[str]], images: Sequence[int]) -> torch.Tensor:
        """CIDEr-D (C,) of ``captions[c]`` (token lists) against the references of corpus image ``images[c]``."""
        return self.score(self.encode(captions), torch.as_tensor(list(images), device=self.device))

    @torch.no_grad()
    def score(self, tokens: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        """CIDEr-D (C,) of candidates ``tokens`` (C, T) (word ids, 0-padded on the right) against the
        references of corpus images ``images`` (C,)."""
        tokens = _at_least(tokens.to(self.device).long(), self.n)  # (C, T)
        images = images.to(self.device)
        lengths = (tokens > 0).sum(1)  # (C,)
        refs, ref_lengths = self.refs[images].long(), self.ref_lengths[images]  # (C, M, Tr), (C, M)
        total = torch.zeros(ref_lengths.shape, device=self.device)  # (C, M): Σ over n of the clipped cosines
        for k in range(1, self.n + 1):
            keys, valid = _ngram_keys(tokens, lengths, k, self.base)  # (C, P)
            tf, first = _term_counts(keys, valid)  # (C, P)
            idf = self._idf(keys)  # (C, P)
            vec = tf * idf  # (C, P) the candidate's tf-idf at each of its n-grams
            norm = (first * vec**2).sum(1).sqrt()  # (C,)
            ref_keys, ref_valid = _ngram_keys(refs, ref_lengths, k, self.base)  # (C, M, Q)
            matches = (keys[:, None, :, None] == ref_keys[:, :, None, :]) & ref_valid[:, :, None, :]  # (C, M, P, Q)
            ref_vec = matches.sum(-1) * idf[:, None, :]  # (C, M, P) each reference's tf-idf at those n-grams
            clipped = (first[:, None, :] * torch.minimum(vec[:, None, :], ref_vec) * ref_vec).sum(-1)  # (C, M)
            denominator = norm[:, None] * self.ref_norms[images, :, k - 1]  # (C, M)
            total += torch.where(denominator > 0, clipped / denominator.clamp_min(1e-30), clipped)
        # pycocoevalcap measures length in bigrams (its counts2vec counts n-grams of index 1): the same
        # difference as in words whenever both captions have a word.
        delta = (lengths[:, None] - 1).clamp_min(0) - (ref_lengths - 1).clamp_min(0)  # (C, M)
        penalty = torch.exp(-(delta.float() ** 2) / (2 * self.sigma**2))
        present = torch.arange(refs.shape[1], device=self.device) < self.ref_counts[images, None]  # (C, M)
        per_ref = total / self.n * penalty * present
        return 10.0 * per_ref.sum(1) / self.ref_counts[images]  # (C,)

    # -- the corpus tables

    def _idf(self, keys: torch.Tensor) -> torch.Tensor:
        at = torch.searchsorted(self.df_keys, keys.contiguous()).clamp_max(len(self.df_keys) - 1)
        df = torch.where(self.df_keys[at] == keys, self.df_counts[at], 0).clamp_min(1)
        return self.log_images - torch.log(df.float())

    def _document_frequencies(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Sorted n-gram keys of the corpus and, for each, the number of images whose references hold it."""
        found = []
        for start in range(0, len(self.refs), CHUNK):
            refs, lengths = self.refs[start : start + CHUNK].long(), self.ref_lengths[start : start + CHUNK]
            grams = []
            for k in range(1, self.n + 1):
                keys, valid = _ngram_keys(_at_least(refs, self.n), lengths, k, self.base)  # (c, M, P)
                grams.append(torch.where(valid, keys, -1).flatten(1))  # (c, M·P)
            grams = torch.cat(grams, 1).sort(1).values  # (c, G)
            new = torch.ones_like(grams, dtype=torch.bool)
            new[:, 1:] = grams[:, 1:] != grams[:, :-1]  # each image's n-grams once
            found.append(grams[new & (grams >= 0)])
        return torch.unique(torch.cat(found), return_counts=True)

    def _reference_norms(self) -> torch.Tensor:
        """|v_r| (I, M, n) of every reference's tf-idf vector, per n."""
        norms = []
        for start in range(0, len(self.refs), CHUNK):
            refs, lengths = self.refs[start : start + CHUNK].long(), self.ref_lengths[start : start + CHUNK]
            per_n = []
            for k in range(1, self.n + 1):
                keys, valid = _ngram_keys(_at_least(refs, self.n), lengths, k, self.base)  # (c, M, P)
                tf, first = _term_counts(keys, valid)
                per_n.append((first * (tf * self._idf(keys)) ** 2).sum(-1).sqrt())  # (c, M)
            norms.append(torch.stack(per_n, -1))  # (c, M, n)
        return torch.cat(norms)


def _pad(nested: Sequence[Sequence[Sequence[int]]]) -> torch.Tensor:
    """Per image, per caption, word ids -> (I, M, T) int32, zeros where a caption or an image has fewer."""
    M = max(len(caps) for caps in nested)
    T = max((len(c) for caps in nested for c in caps), default=0)
    out = torch.zeros(len(nested), M, max(T, 1), dtype=torch.int32)
    for i, caps in enumerate(nested):
        for m, cap in enumerate(caps):
            out[i, m, : len(cap)] = torch.tensor(cap, dtype=torch.int32)
    return out


def _at_least(tokens: torch.Tensor, width: int) -> torch.Tensor:
    """Zero columns on the right up to ``width``: every n-gram size then has a position, valid or not."""
    short = width - tokens.shape[-1]
    return torch.nn.functional.pad(tokens, (0, short)) if short > 0 else tokens


def _ngram_keys(tokens: torch.Tensor, lengths: torch.Tensor, k: int, base: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys of the k-grams starting at each position of (…, T) word ids -> (…, T−k+1), and whether each
    k-gram lies inside its caption (``lengths`` (…,))."""
    P = tokens.shape[-1] - k + 1
    keys = tokens[..., :P]
    for i in range(1, k):
        keys = keys * base + tokens[..., i : i + P]  # ids ≥ 1 are digits: k-grams of every k stay apart
    valid = torch.arange(P, device=tokens.device) + k <= lengths[..., None]  # (…, P)
    return keys, valid


def _term_counts(keys: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each position (…, P): how often its n-gram occurs in the caption (tf), and whether this is its first
    occurrence (so that sums over positions count each distinct n-gram once)."""
    same = (keys[..., :, None] == keys[..., None, :]) & valid[..., None, :] & valid[..., :, None]  # (…, P, P)
    P = keys.shape[-1]
    earlier = torch.ones(P, P, dtype=torch.bool, device=keys.device).tril(-1)  # [p, q]: q before p
    return same.sum(-1).float(), valid & ~(same & earlier).any(-1)
