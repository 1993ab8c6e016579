"""Batched beam search: THE decode loop (greedy is beam 1), and seeded hard-attention samples through it.

B images × K beams run as one (B·K)-row tensor; an image leaves the batch as soon as its search is over.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from sat_core.config import DecodeConfig
from sat_core.data.vocab import Vocab
from sat_core.decoding.scoring import forced_steps
from sat_core.decoding.steps import (
    Inputs, Intervention, as_batch, draw_words, encode, sample_mask, suppressed, top_log_probs,
)
from sat_core.errors import SatError
from sat_core.models.captioner import Captioner
from sat_core.models.encoder import Annotations
from sat_core.precision import autocast


@dataclass
class Hypothesis:
    tokens: list[int]  # generated ids, no <start>; ends with <end> when finished
    words: list[str]  # without special tokens
    logprob: float  # Σ_t log p(y_t | a, y_<t)
    score: float  # logprob / len(tokens) ** length_norm
    alphas: np.ndarray  # (T, L) α_t of the step that produced tokens[t]
    betas: np.ndarray  # (T,)
    locations: np.ndarray  # (T,) sampled region per step (hard sampling), −1 otherwise
    finished: bool
    grid: tuple[int, int]

    @property
    def caption(self) -> str:
        return " ".join(self.words)

    def alpha_grids(self) -> np.ndarray:
        return self.alphas.reshape(len(self.alphas), *self.grid)  # (T, gh, gw)


@dataclass
class _Trace:
    """Per-step tensors and back-pointers, turned into hypotheses once decoding ends."""

    alphas: list[torch.Tensor] = field(default_factory=list)  # per step (N, L)
    betas: list[torch.Tensor] = field(default_factory=list)  # per step (N,)
    locations: list[torch.Tensor] = field(default_factory=list)  # per step (N,)
    parents: list[np.ndarray] = field(default_factory=list)  # per step (N,): row at step t of row i at t+1
    words: list[np.ndarray] = field(default_factory=list)  # per step (N,): word row i at t+1 was fed

    def to_numpy(self) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
        """Per step arrays; the number of rows N_t changes as images finish."""
        return (
            [a.float().cpu().numpy() for a in self.alphas],  # per step (N_t, L)
            [b.float().cpu().numpy() for b in self.betas],  # per step (N_t,)
            [loc.cpu().numpy() for loc in self.locations],  # per step (N_t,)
        )


def _hypothesis(end, trace, arrays, vocab, grid, length_norm) -> Hypothesis:
    """Walk the back-pointers from (step t, row r, last word w) to the first step."""
    t, row, word, logprob, finished = end
    alphas, betas, locs = arrays
    tokens, a, b, loc = [word], [alphas[t][row]], [betas[t][row]], [locs[t][row]]
    for s in range(t - 1, -1, -1):
        tokens.append(int(trace.words[s][row]))
        row = int(trace.parents[s][row])
        a.append(alphas[s][row])
        b.append(betas[s][row])
        loc.append(locs[s][row])
    tokens.reverse()
    return Hypothesis(
        tokens=tokens,
        words=vocab.decode(tokens),
        logprob=float(logprob),
        score=float(logprob) / len(tokens) ** length_norm,
        alphas=np.stack(a[::-1]),
        betas=np.asarray(b[::-1]),
        locations=np.asarray(loc[::-1]),
        finished=finished,
        grid=grid,
    )


@torch.no_grad()
def beam_search(
    model: Captioner,
    inputs: Inputs,
    vocab: Vocab,
    cfg: DecodeConfig | None = None,
    *,
    intervention: Intervention | None = None,
    generator: torch.Generator | None = None,
    sample_words: bool = False,
) -> list[list[Hypothesis]]:
    """Decode B images at once with K beams each (B·K rows in one tensor); greedy is K = 1.

    ``inputs``: images (B, 3, H, W) or ``Annotations`` (B, L, D). Returns per image its ``beam_size``
    hypotheses, best first: finished ones by length-normalised score, then, if the length cap was hit
    before K finished, the best unfinished ones. Runs on the model's device in ``cfg.precision``
    (autocast is entered once for the whole decode). An image leaves the batch as soon as it is done,
    so the others run on fewer rows; the first step runs one row per image, and never ends the caption
    (``suppressed``). In bf16, finished hypotheses within ``cfg.fp32_ties`` of the best are scored again
    in fp32 and ranked by it.

    ``sample_words`` (beam 1 only): each word is drawn from p(y_t | a, y_<t) over the words the step may
    produce (``generator``, else one seeded with ``cfg.seed``) instead of taken as the best; the
    hypothesis' ``logprob`` sums the log-probabilities of that renormalised distribution. Self-critical
    training samples its captions this way.
    """
    cfg = cfg or DecodeConfig()
    K = cfg.beam_size  # DecodeConfig guarantees K ≥ 1 and max_len ≥ 1
    if sample_words and K != 1:
        raise SatError(f"Sampling words draws one caption per row: use beam size 1, not {K}.")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with autocast(device, cfg.precision) as precision:
            feats, grid = encode(model, inputs, device)  # (B, L, D)
            sampled = sample_words or (model.hard and cfg.hard_mode == "sample")
            settle = precision == "bf16" and cfg.fp32_ties > 0 and not sampled
            ends, trace = _search(model, feats, device, vocab, cfg, intervention, generator, sample_words)
        arrays = trace.to_numpy()
        results = []
        for per_image in ends:
            hyps = [_hypothesis(e, trace, arrays, vocab, grid, cfg.length_norm) for e in per_image]
            hyps.sort(key=_rank)
            results.append(hyps[:K])
        if settle:
            _settle_ties_in_fp32(model, vocab, feats, results, cfg, intervention)
    finally:
        if was_training:
            model.train()
    return results


def _rank(hyp: Hypothesis) -> tuple[bool, float]:
    return not hyp.finished, -hyp.score


@torch.no_grad()
def _settle_ties_in_fp32(model: Captioner, vocab: Vocab, feats: torch.Tensor, results: list[list[Hypothesis]],
                         cfg: DecodeConfig, intervention: Intervention | None) -> None:
    """Score again in fp32 each image's finished hypotheses that bf16 put within ``cfg.fp32_ties`` nats per
    word of its best, and rank them by those scores (in place).

    Captions that say the same thing in other words can score within 10⁻³ of each other, and then bf16's
    rounding, not the model, would pick one.
    A near-tie is best.score − score ≤ fp32_ties · len(tokens)^(1 − length_norm) (per word at
    length_norm 1, in summed nats at 0). Teacher forcing over those rows alone, on the same annotations.
    """
    picks = []  # (image, hypothesis index)
    for b, hyps in enumerate(results):
        if len(hyps) < 2 or not hyps[0].finished:
            continue
        best = hyps[0].score
        near = [i for i, h in enumerate(hyps)
                if h.finished and best - h.score <= cfg.fp32_ties * len(h.tokens) ** (1 - cfg.length_norm)]
        if len(near) > 1:
            picks += [(b, i) for i in near]
    if not picks:
        return
    device = feats.device
    lengths = [len(results[b][i].tokens) for b, i in picks]
    T = max(lengths)
    target = torch.tensor([results[b][i].tokens + [results[b][i].tokens[-1]] * (T - n)
                           for (b, i), n in zip(picks, lengths)], device=device)  # (R, T), padded with <end>
    rows = torch.tensor([b for b, _ in picks], device=device)
    with autocast(device, "fp32"):
        logp = forced_steps(model, vocab, feats[rows].float(), target, intervention=intervention)[0]  # (R, T)
    for (b, i), n, row in zip(picks, lengths, logp):
        total = float(row[:n].sum())
        results[b][i] = dataclasses.replace(results[b][i], logprob=total, score=total / n ** cfg.length_norm)
    for b in {b for b, _ in picks}:
        results[b].sort(key=_rank)


def _search(model, feats, device, vocab, cfg, intervention, generator, sample_words=False):
    """The beam loop over annotations (B, L, D). Rows are numbered afresh at every step; ``trace`` links
    them back."""
    K = cfg.beam_size
    prep, h, c = model.decoder.prepare(feats)  # (B, L, A), (B, n): one row per image at t = 0
    B, V = feats.shape[0], len(vocab)
    active = np.arange(B)  # the images still decoding, in row order
    tokens = torch.full((B,), vocab.start_id, dtype=torch.long, device=device)
    scores = torch.zeros(B, 1, device=device)  # (B', k) log-probabilities of the live rows
    if (sample_words or model.hard and cfg.hard_mode == "sample") and generator is None:
        generator = torch.Generator(device).manual_seed(cfg.seed)
    width = 2 * K  # candidates per image: K to keep, and room for the <end>s among them
    trace, ends = _Trace(), [[] for _ in range(B)]  # ends: (t, row, word, logprob, finished)
    done = np.zeros(B, dtype=bool)
    for t in range(cfg.max_len):
        n, k = tokens.shape[0], scores.shape[1]  # rows, rows per image
        edit = intervention.editor(t, device) if intervention is not None else None
        sample = sample_mask(model, cfg, n, device)
        out = model.decoder.step(tokens, h, c, prep, sample=sample, generator=generator, alpha_edit=edit)
        trace.alphas.append(out.alpha)
        trace.betas.append(out.beta)
        trace.locations.append(out.location)
        # An image's best candidates are among each row's as many best words (a row's score is a constant);
        # sampling offers one candidate per row: the word it drew.
        n_top = 1 if sample_words else min(width, V)
        if sample_words:
            row_words, logp = draw_words(out, suppressed(vocab, cfg, t), generator)  # (n, 1), (n, 1)
        else:
            row_words, logp = top_log_probs(model, out, suppressed(vocab, cfg, t), n_top)  # (n, T), (n, T)
        cand = (logp + scores.view(n, 1)).view(len(active), k * n_top)  # (B', k·T)
        top_scores, top_pos = cand.topk(min(width, k * n_top), dim=1)  # (B', width)
        top_rows = top_pos // n_top + k * torch.arange(len(active), device=device).view(-1, 1)  # (B', width)
        top_words = row_words[top_rows, top_pos % n_top]  # (B', width)
        rows, words, new_scores = _select(top_scores.cpu().numpy(), top_rows.cpu().numpy(),
                                          top_words.cpu().numpy(), K, k, vocab.end_id, t, ends, done, active)
        live = ~done[active]  # (B',)
        if not live.any():
            break
        if not live.all():  # finished images leave the batch: their rows are never computed again
            keep = np.repeat(live, K)
            rows, words, new_scores, active = rows[keep], words[keep], new_scores[live], active[live]
            prep = prep.index(torch.from_numpy(np.flatnonzero(live)).to(device))
        trace.parents.append(rows)
        trace.words.append(words)
        rows_t = torch.from_numpy(rows).to(device)
        h, c = out.h[rows_t], out.c[rows_t]  # (B'·K, n)
        tokens = torch.from_numpy(words).to(device)
        scores = torch.from_numpy(new_scores).to(device)
    else:
        _add_unfinished(ends, active, scores.cpu().numpy(), words, trace, K)
    return ends, trace


def _select(top_scores, top_rows, top_words, K, k, end_id, t, ends, done, active):
    """Beam bookkeeping for one step: finish <end> candidates ranked in the top K, keep K others.

    ``k`` is the number of rows per image this step (1 at t = 0, then K); row j of image b is
    b·k + j. Only an <end> among an image's K best candidates is finished, so beam 1 is exactly
    greedy. Returns the new rows' parents (B'·K,), their words (B'·K,) and scores (B', K).
    """
    n_images = top_scores.shape[0]
    rows = np.repeat(np.arange(n_images) * k, K)  # dead slots point at the image's first row
    words = np.full(n_images * K, end_id, dtype=np.int64)
    new_scores = np.full((n_images, K), -np.inf, dtype=np.float32)
    for b in range(n_images):
        image, kept = active[b], 0
        for j in range(top_scores.shape[1]):
            score = top_scores[b, j]
            if score == -np.inf or kept == K:
                break
            row, word = top_rows[b, j], top_words[b, j]
            if word == end_id:
                if j < K:
                    ends[image].append((t, int(row), int(word), float(score), True))
                continue
            rows[b * K + kept], words[b * K + kept], new_scores[b, kept] = row, word, score
            kept += 1
        finished = sum(1 for e in ends[image] if e[4])
        done[image] = _search_over(finished, float(new_scores[b, 0]), K)
    return rows, words, new_scores


def _search_over(finished: int, best_live: float, K: int) -> bool:
    """True when no live hypothesis can still win a place among the image's K results.

    The results are the first K hypotheses to end inside the beam (an <end> among the image's K
    best candidates), ranked by length-normalised score; while fewer have ended, live ones fill the
    remaining places. So a live hypothesis can win only while fewer than K have finished and one is
    alive. The rule does not depend on ``length_norm``: beam 1 is greedy for every normalisation
    (a bound on future scores would let a normalised search run on past greedy's <end>).
    """
    return finished >= K or best_live == -np.inf


def _add_unfinished(ends, active, scores, words, trace, K) -> None:
    """At the length cap: the live beams become (unfinished) hypotheses of the images not done."""
    t = len(trace.alphas) - 1
    for b, image in enumerate(active):
        for k in range(K):
            if scores[b, k] > -np.inf:
                # The live row at step t+1 came from parents[t]; its last word is words[t].
                row = int(trace.parents[t][b * K + k])
                ends[image].append((t, row, int(words[b * K + k]), float(scores[b, k]), False))


def sample_hard(
    model: Captioner,
    vocab: Vocab,
    image: torch.Tensor,
    n: int,
    *,
    seed: int = 0,
    cfg: DecodeConfig | None = None,
) -> list[Hypothesis]:
    """N seeded samples of the location sequence s̃ ~ Multinoulli(α) for one image, greedy words."""
    if not model.hard:
        raise SatError("Sampling locations needs a hard-attention checkpoint; this one uses soft attention.")
    cfg = dataclasses.replace(cfg or DecodeConfig(), beam_size=1, hard_mode="sample", seed=seed)
    device = next(model.parameters()).device
    with torch.no_grad(), autocast(device, cfg.precision):
        feats, grid = encode(model.eval(), as_batch(image), device)
    shared = Annotations(feats.expand(n, -1, -1), grid)  # (n, L, D): one encoder pass for all samples
    return [hyps[0] for hyps in beam_search(model, shared, vocab, cfg)]
