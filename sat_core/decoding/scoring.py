"""Teacher forcing through the decoder's ``step``: a given caption's per-word log p, α and β; the best
reference by the model's own score (search errors); hard attention's sampled location paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sat_core.config import DecodeConfig
from sat_core.data.vocab import Vocab
from sat_core.data.words import caption_words
from sat_core.decoding.steps import Intervention, as_batch, encode, exact_log_probs
from sat_core.errors import SatError
from sat_core.models.captioner import Captioner
from sat_core.models.encoder import Annotations
from sat_core.precision import autocast


@dataclass
class ScoredCaption:
    words: list[str]  # as scored, unknown words shown as <unk>
    tokens: list[int]  # ids incl. the final <end>
    logprobs: np.ndarray  # (T,) log p(y_t | a, y_<t), the last one for <end>
    alphas: np.ndarray  # (T, L)
    betas: np.ndarray  # (T,)
    grid: tuple[int, int]
    unknown: list[str]  # words of the input that are not in the vocabulary

    @property
    def logprob(self) -> float:
        return float(self.logprobs.sum())


def caption_ids(vocab: Vocab, caption: str | Sequence[str] | Sequence[int]) -> tuple[list[int], list[str], list[str]]:
    """(ids without specials, words as scored, input words not in the vocabulary); typed text loses
    its punctuation first ("hexagons!" -> "hexagons")."""
    if isinstance(caption, str):
        caption = caption_words(caption)
        if not caption:
            raise SatError("The caption to score is empty; type at least one word.")
    caption = list(caption)
    if caption and isinstance(caption[0], (int, np.integer)):
        ids = [int(i) for i in caption if int(i) not in (vocab.start_id, vocab.end_id)]
        return ids, [vocab.itos[i] for i in ids], []
    ids = vocab.encode(caption, add_specials=False)
    return ids, [vocab.itos[i] for i in ids], [w for w in caption if w not in vocab.stoi]


@torch.no_grad()
def _teacher_force(model: Captioner, vocab: Vocab, image: torch.Tensor, tokens: list[int] | list[list[int]], *,
                   rows: int = 1, seed: int | None = None, intervention: Intervention | None = None,
                   precision: str = "auto"):
    """Feed ``tokens`` (ending with <end>) through ``step`` for ``rows`` copies of one image, or, given
    one list of ids per row (equal lengths: pad with <end>), each row its own caption.

    ``seed`` set (hard attention): every row samples its own location s_t ~ Multinoulli(α_t).
    Returns log p (R, T), α (R, T, L), β (R, T), locations (R, T) (−1 when not sampled) and the grid.
    """
    model.eval()
    device = next(model.parameters()).device
    per_row = bool(tokens) and isinstance(tokens[0], list)
    rows = len(tokens) if per_row else rows
    sample = torch.ones(rows, dtype=torch.bool, device=device) if seed is not None and model.hard else None
    gen = torch.Generator(device).manual_seed(seed) if sample is not None else None
    target = torch.tensor(tokens, device=device).expand(rows, -1)  # (R, T)
    with autocast(device, precision):
        feats, grid = encode(model, as_batch(image), device)
        forced = forced_steps(model, vocab, feats.expand(rows, -1, -1), target, sample=sample, generator=gen,
                               intervention=intervention)  # rows share the image
    return (*forced, grid)


def forced_steps(model: Captioner, vocab: Vocab, feats: torch.Tensor, target: torch.Tensor, *,
                  sample: torch.Tensor | None = None, generator: torch.Generator | None = None,
                  intervention: Intervention | None = None):
    """The teacher-forced loop: row r of annotations ``feats`` (R, L, D) reads ``target[r]`` (R, T) from
    <start>, one ``decoder.step`` per word, in the precision of the caller's autocast.
    Returns log p (R, T), α (R, T, L), β (R, T), locations (R, T) as numpy arrays."""
    device, rows = target.device, target.shape[0]
    prep, h, c = model.decoder.prepare(feats)
    prev = torch.full((rows,), vocab.start_id, device=device)  # (R,)
    logps, alphas, betas, locations = [], [], [], []
    for t in range(target.shape[1]):
        edit = intervention.editor(t, device) if intervention is not None else None
        out = model.decoder.step(prev, h, c, prep, sample=sample, generator=generator, alpha_edit=edit)
        h, c = out.h, out.c
        logps.append(exact_log_probs(model, out, target[:, t : t + 1])[:, 0])  # (R,) exact under bf16 too
        alphas.append(out.alpha.float())  # (R, L)
        betas.append(out.beta.float().reshape(rows))
        locations.append(out.location.reshape(rows))
        prev = target[:, t]
    stack = lambda xs: torch.stack(xs, 1).cpu().numpy()  # noqa: E731  (R, T, …)
    return stack(logps), stack(alphas), stack(betas), stack(locations)


def score_caption(
    model: Captioner, vocab: Vocab, image: torch.Tensor, caption: str | Sequence[str] | Sequence[int],
    *, precision: str = "auto", intervention: Intervention | None = None,
) -> ScoredCaption:
    """Teacher forcing: per-token log-probabilities, α and β of a given caption (<end> appended).

    Hard attention uses the expectation α (as at test time); ``intervention`` edits α as in beam_search.
    """
    ids, words, unknown = caption_ids(vocab, caption)
    tokens = ids + [vocab.end_id]
    logps, alphas, betas, _, grid = _teacher_force(model, vocab, image, tokens, intervention=intervention,
                                                   precision=precision)
    return ScoredCaption(words, tokens, logps[0].astype(np.float64), alphas[0], betas[0].astype(np.float64), grid,
                         unknown)


@dataclass(frozen=True)
class ReferenceScore:
    """The reference caption the model itself scores highest, scored the way beam search ranks."""

    caption: str
    score: float  # Σ log p / len(tokens incl. <end>) ** length_norm, as Hypothesis.score
    reachable: int  # references beam search could have produced (known words, within the length cap)


def check_search_errors(model: Captioner, cfg: DecodeConfig) -> None:
    """Raise SatError when ``best_reference`` cannot judge ``cfg``'s captions (hard attention, sampled)."""
    if model.hard and cfg.hard_mode == "sample":
        raise SatError("Search errors compare the caption's score with the references' under the expectation α; "
                       "a caption decoded with sampled locations has no such score. Decode with hard_mode expect "
                       "(--hard-mode expect) to check search errors.")


def best_reference(
    model: Captioner, vocab: Vocab, image: torch.Tensor | Annotations, references: Sequence[str],
    cfg: DecodeConfig,
) -> ReferenceScore | None:
    """Teacher-force every reference beam search could produce (no <unk>; with its <end>, at most
    ``cfg.max_len`` tokens, the search's step cap)
    in one batch; None when there is none. A best reference scoring above beam search's caption is a
    *search error* (the model prefers a reference the search did not find); below it, the caption's
    mistakes are the model's own."""
    check_search_errors(model, cfg)
    captions = []
    for ref in references:
        ids, _words, unknown = caption_ids(vocab, ref)
        if ids and not unknown and len(ids) < cfg.max_len:
            captions.append((ref, ids + [vocab.end_id]))
    if not captions:
        return None
    width = max(len(ids) for _, ids in captions)
    padded = [ids + [vocab.end_id] * (width - len(ids)) for _, ids in captions]  # (R, T), scored up to len
    logps = _teacher_force(model, vocab, image, padded, precision=cfg.precision)[0]  # (R, T)
    scores = [float(logps[r, : len(ids)].sum()) / len(ids) ** cfg.length_norm for r, (_, ids) in enumerate(captions)]
    best = int(np.argmax(scores))
    return ReferenceScore(captions[best][0], scores[best], len(captions))


@dataclass
class SampledPaths:
    """Hard attention teacher-forced on one caption along N sampled location sequences s̃ ~ Multinoulli(α)."""

    words: list[str]
    locations: np.ndarray  # (N, T) region index sampled at each step (the last step is <end>)
    logprobs: np.ndarray  # (N, T) log p(y_t | s̃_≤t, a, y_<t)
    alphas: np.ndarray  # (N, T, L) α_t along each sampled path
    grid: tuple[int, int]
    seed: int

    @property
    def caption_logprobs(self) -> np.ndarray:
        return self.logprobs.sum(1)  # (N,) log p(y | s̃ⁿ, a), the reward of the paper's REINFORCE


def sample_locations(
    model: Captioner, vocab: Vocab, image: torch.Tensor, caption: str | Sequence[str] | Sequence[int], n: int,
    *, seed: int = 0, precision: str = "auto",
) -> SampledPaths:
    """N seeded location sequences of a hard-attention model while it reads a given caption."""
    if not model.hard:
        raise SatError("Sampling locations needs a hard-attention checkpoint; this one uses soft attention.")
    ids, words, _ = caption_ids(vocab, caption)
    logps, alphas, _, locations, grid = _teacher_force(model, vocab, image, ids + [vocab.end_id], rows=n, seed=seed,
                                                       precision=precision)
    return SampledPaths(words, locations.astype(int), logps, alphas, grid, seed)
