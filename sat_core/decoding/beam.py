"""Batched beam search: THE decode loop (greedy is beam 1), and seeded hard-attention samples through it.

B images × K beams run as one (B·K)-row tensor. The bookkeeping stays on the device: each image's top K of its
K·V candidates, its finished hypotheses and whether its search is over are tensors, and the host sees them once,
when decoding ends. On a CPU an image leaves the batch as soon as its search is over; on a GPU it keeps its rows,
masked, so that every step after the first has one row count (what a CUDA graph needs).
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
    """Per-step tensors and back-pointers, left on the device until decoding ends."""

    alphas: list[torch.Tensor] = field(default_factory=list)  # per step (N_t, L)
    betas: list[torch.Tensor] = field(default_factory=list)  # per step (N_t,)
    locations: list[torch.Tensor] = field(default_factory=list)  # per step (N_t,)
    parents: list[torch.Tensor] = field(default_factory=list)  # per step (N_t+1,): row at step t of row i at t+1
    words: list[torch.Tensor] = field(default_factory=list)  # per step (N_t+1,): word row i at t+1 was fed


@dataclass
class _Ends:
    """Each image's hypotheses that ended inside its beam, as tensors: slot j of image b is the j-th <end> it
    found, in the order found (the order ties keep when ranked). Column 2K takes the writes of no <end>.

    At most 2K − 1 are ever needed: an image has fewer than K before a step (else it is done), and a step
    finishes at most K (only <end>s among its K best candidates)."""

    t: torch.Tensor  # (B, 2K+1) the step that produced the <end>
    row: torch.Tensor  # (B, 2K+1) the row at step t it followed
    logprob: torch.Tensor  # (B, 2K+1) fp32
    count: torch.Tensor  # (B,) slots used
    done: torch.Tensor  # (B,) bool: no live hypothesis can still win a place (``_search_over``)

    @classmethod
    def empty(cls, B: int, K: int, device: torch.device) -> "_Ends":
        zeros = lambda dtype: torch.zeros(B, 2 * K + 1, dtype=dtype, device=device)  # noqa: E731
        return cls(zeros(torch.long), zeros(torch.long), zeros(torch.float32),
                   torch.zeros(B, dtype=torch.long, device=device), torch.zeros(B, dtype=torch.bool, device=device))

    def record(self, finish: torch.Tensor, rows: torch.Tensor, logprobs: torch.Tensor, t, active: torch.Tensor
               ) -> torch.Tensor:
        """Take the candidates ``finish`` marks (B', W) of images ``active`` (B',); their new counts (B',)."""
        count = self.count[active]  # (B',)
        if finish.device.type == "cpu" and not bool(finish.any()):  # most steps; asking costs nothing on a CPU
            return count
        place = count.view(-1, 1) + finish.cumsum(1) - 1  # (B', W) each <end>'s slot
        place = torch.where(finish, place, self.t.shape[1] - 1)  # the last column takes the rest
        image = active.view(-1, 1).expand_as(place)
        self.t.index_put_((image, place), torch.zeros_like(place) + t)  # t: a step number, or a tensor holding it
        self.row.index_put_((image, place), rows)
        self.logprob.index_put_((image, place), logprobs)
        count = count + finish.sum(1)
        self.count[active] = count
        return count


@dataclass
class _Last:
    """Where the search stopped: the images still decoding (row order), their live scores and whether the
    length cap was reached (their live beams then become unfinished hypotheses)."""

    active: torch.Tensor  # (B',) image ids
    scores: torch.Tensor  # (B', K)
    at_cap: bool


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
    fixed = _fixed_rows(device)
    active = torch.arange(B, device=device)  # (B',) the images still decoding, in row order
    tokens = torch.full((B,), vocab.start_id, dtype=torch.long, device=device)  # (N,)
    scores = torch.zeros(B, 1, device=device)  # (B', k) log-probabilities of the live rows
    if (sample_words or model.hard and cfg.hard_mode == "sample") and generator is None:
        generator = torch.Generator(device).manual_seed(cfg.seed)
    banned = [torch.tensor(suppressed(vocab, cfg, t), device=device) for t in (0, 1)]  # <end> allowed from t = 1
    # An image's best candidates are among each row's as many best words (a row's score is a constant);
    # sampling offers one candidate per row: the word it drew.
    n_top = 1 if sample_words else min(2 * K, V)
    trace, ends = _Trace(), _Ends.empty(B, K, device)
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
        rows, words, scores = _select(logp + scores.view(-1, 1), row_words, K, vocab.end_id, t, ends, active)
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
    return ends, trace, _Last(active, scores, at_cap=t == cfg.max_len - 1 and n_live > 0)


def _select(cand, row_words, K, end_id, t, ends, active):
    """Beam bookkeeping for one step, as tensors: finish <end> candidates ranked in the top K, keep K others.

    ``cand`` (N, T): each row's candidates' scores, ``row_words`` (N, T) their words; rows come k per image
    (1 at t = 0, then K), row j of image b being b·k + j. Only an <end> among an image's K best candidates is
    finished, so beam 1 is exactly greedy. Records the finished ones in ``ends`` (images ``active``; the step
    ``t`` may be a tensor, as in a step replayed from a CUDA graph) and updates ``ends.done``. Returns the new
    rows' parents (B'·K,), words (B'·K,) and scores (B', K): −inf in slots left empty and for every image
    that is done (its rows then stay inert where they are kept)."""
    n_images, width = active.shape[0], cand.shape[1]
    k = cand.shape[0] // n_images
    top_scores, top_pos = cand.view(n_images, k * width).topk(min(2 * K, k * width), dim=1)  # (B', W)
    top_words = row_words.reshape(n_images, k * width).gather(1, top_pos)  # (B', W)
    first = k * torch.arange(n_images, device=cand.device).view(-1, 1)  # (B', 1) each image's first row
    top_rows = top_pos // width + first  # (B', W)
    valid = top_scores > -float("inf")  # (B', W) sorted: once −inf, −inf to the end
    is_end = top_words == end_id
    finish = valid & is_end  # (B', W)
    finish[:, K:] = False  # only an <end> among the K best
    going = valid & ~is_end
    slot = going.cumsum(1) - 1  # (B', W) each going candidate's place among the image's kept ones
    slot = torch.where(going & (slot < K), slot, K)  # column K: not kept
    rows = first.expand(n_images, K + 1).clone().scatter_(1, slot, top_rows)[:, :K]  # dead: the first row
    words = torch.full((n_images, K + 1), end_id, device=cand.device).scatter_(1, slot, top_words)[:, :K]
    scores = torch.full((n_images, K + 1), -float("inf"), device=cand.device).scatter_(1, slot, top_scores)
    scores = scores[:, :K]  # (B', K)
    count = ends.record(finish, top_rows, top_scores, t, active)  # (B',)
    done = _search_over(count, scores[:, 0], K)  # (B',)
    ends.done[active] = done
    return rows.reshape(-1), words.reshape(-1), scores.masked_fill(done.view(-1, 1), -float("inf"))


def _search_over(finished: torch.Tensor, best_live: torch.Tensor, K: int) -> torch.Tensor:
    """True (per image) when no live hypothesis can still win a place among the image's K results.

    The results are the first K hypotheses to end inside the beam (an <end> among the image's K
    best candidates), ranked by length-normalised score; while fewer have ended, live ones fill the
    remaining places. So a live hypothesis can win only while fewer than K have finished and one is
    alive. The rule does not depend on ``length_norm``: beam 1 is greedy for every normalisation
    (a bound on future scores would let a normalised search run on past greedy's <end>).
    """
    return (finished >= K) | (best_live == -float("inf"))


def _results(ends: _Ends, trace: _Trace, last: _Last, vocab: Vocab, grid: tuple[int, int],
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
