"""Batched beam search: THE decode loop (greedy is beam 1), and seeded hard-attention samples through it.

B images × K beams run as one (B·K)-row tensor. The bookkeeping stays on the device: each image's top K of its
K·V candidates, its finished hypotheses and whether its search is over are tensors, and the host sees them once,
when decoding ends. On a CPU an image leaves the batch as soon as its search is over; on a GPU it keeps its rows,
masked, so that every step after the first has one row count: there those steps run as one step over static
buffers (``graph``), captured once as a CUDA graph and replayed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from sat_core.config import DecodeConfig
from sat_core.data.vocab import Vocab
from sat_core.decoding import graph
from sat_core.decoding.bookkeeping import Ends, Last, Trace, select
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


def _to_host(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """Every tensor on the host, in one transfer per kind (floating point as fp32, integers as int64)."""
    out: list[np.ndarray | None] = [None] * len(tensors)
    for floating in (True, False):
        picked = [i for i, x in enumerate(tensors) if x.is_floating_point() == floating]
        if not picked:
            continue
        dtype = torch.float32 if floating else torch.long
        flat = torch.cat([tensors[i].reshape(-1).to(dtype) for i in picked]).cpu().numpy()  # the one copy
        sizes = [tensors[i].numel() for i in picked]
        for i, part in zip(picked, np.split(flat, np.cumsum(sizes)[:-1])):
            out[i] = part.reshape(tuple(tensors[i].shape))
    return out


def _hypothesis(end, host, vocab, grid, length_norm) -> Hypothesis:
    """Walk the back-pointers from (step t, row r, last word w) to the first step."""
    t, row, word, logprob, finished = end
    alphas, betas, locs, parents, words = host
    tokens, a, b, loc = [word], [alphas[t][row]], [betas[t][row]], [locs[t][row]]
    for s in range(t - 1, -1, -1):
        tokens.append(int(words[s][row]))
        row = int(parents[s][row])
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
    (autocast is entered once for the whole decode). On a CPU an image leaves the batch as soon as it is
    done, so the others run on fewer rows (on a GPU its rows stay, masked: ``_fixed_rows``); the first
    step runs one row per image, and never ends the caption
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
            ends, trace, last = _search(model, feats, device, vocab, cfg, intervention, generator, sample_words)
        results = _results(ends, trace, last, vocab, grid, cfg)
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


def _fixed_rows(device: torch.device) -> bool:
    """Whether finished images keep their rows (masked) instead of leaving the batch.

    On a GPU a step's cost barely depends on its rows, and one row count for the whole decode is what lets a
    CUDA graph (or ``torch.compile(mode="reduce-overhead")``) serve every step. On a CPU a row costs its share,
    so finished images leave the batch. Both give the same hypotheses (tests/test_beam_reference.py)."""
    return device.type != "cpu"


def _search(model, feats, device, vocab, cfg, intervention, generator, sample_words=False):
    """The beam loop over annotations (B, L, D), its bookkeeping on the device. Rows are numbered afresh at
    every step; ``trace`` links them back. Synchronises with the host once a step (is any image still
    decoding?) and copies nothing else until the end."""
    K = cfg.beam_size
    prep, h, c = model.decoder.prepare(feats)  # (B, L, A), (B, n): one row per image at t = 0
    B, V = feats.shape[0], len(vocab)
    replay = cfg.max_len > 1 and _replayed(model, cfg, device, intervention, sample_words)
    fixed = replay or _fixed_rows(device)
    active = torch.arange(B, device=device)  # (B',) the images still decoding, in row order
    tokens = torch.full((B,), vocab.start_id, dtype=torch.long, device=device)  # (N,)
    scores = torch.zeros(B, 1, device=device)  # (B', k) log-probabilities of the live rows
    if (sample_words or model.hard and cfg.hard_mode == "sample") and generator is None:
        generator = torch.Generator(device).manual_seed(cfg.seed)
    banned = [torch.tensor(suppressed(vocab, cfg, t), device=device) for t in (0, 1)]  # <end> allowed from t = 1
    # An image's best candidates are among each row's as many best words (a row's score is a constant);
    # sampling offers one candidate per row: the word it drew.
    n_top = 1 if sample_words else min(2 * K, V)
    trace, ends = Trace(), Ends.empty(B, K, device)
    for t in range(cfg.max_len):
        edit = intervention.editor(t, device) if intervention is not None else None
        sample = sample_mask(model, cfg, tokens.shape[0], device)
        out = model.decoder.step(tokens, h, c, prep, sample=sample, generator=generator, alpha_edit=edit)
        trace.alphas.append(out.alpha)
        trace.betas.append(out.beta)
        trace.locations.append(out.location)
        if sample_words:
            row_words, logp = draw_words(out, banned[min(t, 1)], generator)  # (N, 1), (N, 1)
        else:
            row_words, logp = top_log_probs(model, out, banned[min(t, 1)], n_top)  # (N, T), (N, T)
        rows, words, scores = select(logp + scores.view(-1, 1), row_words, K, vocab.end_id, t, ends, active)
        live = ~ends.done[active]  # (B',)
        n_live = int(live.sum())  # the step's one synchronisation
        if n_live == 0:
            break
        if n_live < len(active) and not fixed:  # finished images leave: their rows are never computed again
            keep = live.repeat_interleave(K)  # (B'·K,)
            rows, words, scores, active = rows[keep], words[keep], scores[live], active[live]
            prep = prep.index(live.nonzero().squeeze(1))
        trace.parents.append(rows)
        trace.words.append(words)
        h, c = out.h[rows], out.c[rows]  # (B'·K, n)
        tokens = words
        if replay:  # steps 1… over static buffers
            return _replay(model, prep, tokens, h, c, scores, ends, trace, cfg, suppressed(vocab, cfg, 1), n_top,
                           vocab.end_id)
    return ends, trace, Last(active, scores, at_cap=t == cfg.max_len - 1 and n_live > 0)


def _replayed(model: Captioner, cfg: DecodeConfig, device: torch.device, intervention, sample_words: bool) -> bool:
    """Whether steps 1… run as one step over static buffers (``graph``): ``cfg.graph`` "auto" on a GPU, "on"
    everywhere; never with an intervention or random draws (hard attention's sampled locations, sampled words),
    which the step-by-step loop serves."""
    if cfg.graph == "off" or intervention is not None or sample_words or model.hard and cfg.hard_mode == "sample":
        return False
    return cfg.graph == "on" or device.type == "cuda"


def _replay(model, prep, tokens, h, c, scores, ends, trace, cfg, banned, n_top, end_id):
    """Steps 1… of the search as ``graph.StaticSteps``: on a GPU each is one replay of a captured CUDA graph.
    One synchronisation a step, as in the loop; the results are copied out of the static buffers before the
    next decode may reuse them."""
    B, K, device = scores.shape[0], cfg.beam_size, scores.device
    key = (B, K, tuple(prep.feats.shape), prep.feats.dtype, tuple(prep.proj.shape), h.shape[1], cfg.max_len, n_top,
           end_id, tuple(banned), cfg.precision)

    def build() -> graph.StaticSteps:
        return graph.StaticSteps(model, prep, B, K, h.shape[1], cfg.max_len, torch.tensor(banned, device=device),
                                 n_top, end_id)

    # A capture must cast the weights inside the graph at every replay (autocast's cached copies would be
    # freed under it); on a CPU the same context costs a cast per step.
    with graph.LOCK, autocast(device, cfg.precision, cache=False):
        steps, run = graph.static_steps(model, key, build)
        steps.load(prep, tokens, h, c, scores, ends)
        at_cap = True
        for t in range(1, cfg.max_len):
            run()
            if bool(steps.ends.done.all()):  # the step's one synchronisation
                at_cap = False
                break
        steps.trace(trace, t + 1, at_cap)
        ends = Ends(*(x.clone() for x in steps.ends.tensors()))
        return ends, trace, Last(steps.active.clone(), steps.scores.clone(), at_cap)


def _results(ends: Ends, trace: Trace, last: Last, vocab: Vocab, grid: tuple[int, int],
             cfg: DecodeConfig) -> list[list[Hypothesis]]:
    """The one copy to the host, then each image's hypotheses, best first: finished by length-normalised score,
    then (at the length cap) the best unfinished ones."""
    T, P = len(trace.alphas), len(trace.parents)
    host = _to_host([*trace.alphas, *trace.betas, *trace.locations, *trace.parents, *trace.words,
                     ends.t, ends.row, ends.logprob, ends.count, last.active, last.scores])
    steps = host[: 3 * T + 2 * P]
    arrays = (steps[:T], steps[T : 2 * T], steps[2 * T : 3 * T], steps[3 * T : 3 * T + P], steps[3 * T + P :])
    end_t, end_row, end_logprob, count, active, scores = host[3 * T + 2 * P :]
    per_image = [[(int(end_t[b, j]), int(end_row[b, j]), vocab.end_id, float(end_logprob[b, j]), True)
                  for j in range(count[b])] for b in range(len(count))]
    if last.at_cap:
        _add_unfinished(per_image, active, scores, arrays[3][-1], arrays[4][-1], T - 1, cfg.beam_size)
    results = []
    for found in per_image:
        hyps = sorted((_hypothesis(e, arrays, vocab, grid, cfg.length_norm) for e in found), key=_rank)
        results.append(hyps[: cfg.beam_size])
    return results


def _add_unfinished(ends, active, scores, parents, words, t, K) -> None:
    """At the length cap: the live beams become (unfinished) hypotheses of the images not done."""
    for b, image in enumerate(active):
        for k in range(K):
            if scores[b, k] > -np.inf:
                # The live row at step t+1 came from parents[t]; its last word is words[t].
                ends[image].append((t, int(parents[b * K + k]), int(words[b * K + k]), float(scores[b, k]), False))


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
