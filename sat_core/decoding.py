"""THE decode loop: batched beam search (greedy = beam 1), decode sessions, scoring, interventions.

Every caption the project shows — CLI, evaluation, validation during training, the explorer — comes
from ``beam_search`` or from ``DecodeSession``/``score_caption``, which share the decoder's ``step``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from sat_core import native
from sat_core.config import DecodeConfig
from sat_core.errors import SatError
from sat_core.models.captioner import Captioner
from sat_core.models.decoder import AlphaEdit
from sat_core.models.encoder import Annotations
from sat_core.precision import autocast
from sat_core.data.vocab import Vocab
from sat_core.data.words import caption_words


def pick_device(name: str | None = None) -> torch.device:
    """``None``/"auto": CUDA when available, else CPU; otherwise the named device."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(name).startswith("cuda") and not torch.cuda.is_available():
        raise SatError(f"Device {name!r} was asked for but no CUDA GPU is available; use --device cpu.")
    return torch.device(name)


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
class Intervention:
    """Change α at chosen steps over a chosen region before the context is formed.

    ``region`` is a bool mask over the grid (gh, gw) or (L,). ``mode``: "exclude" keeps attention out
    of the region, "include" keeps it inside; α is renormalised over what is left (uniform there if
    nothing was left). ``steps``: the step indices to act on (None: every step).
    """

    region: np.ndarray
    mode: str = "exclude"
    steps: Sequence[int] | None = None

    def editor(self, step: int, device: torch.device) -> AlphaEdit | None:
        if self.steps is not None and step not in self.steps:
            return None
        if self.mode not in ("exclude", "include"):
            raise SatError(f"Intervention mode must be exclude or include, not {self.mode!r}.")
        region = torch.as_tensor(np.asarray(self.region, dtype=bool).reshape(-1), device=device)
        keep = ~region if self.mode == "exclude" else region  # (L,)
        if not bool(keep.any()):
            raise SatError("The intervention leaves no region to attend to; choose a smaller region.")

        def edit(alpha: torch.Tensor) -> torch.Tensor:
            kept = alpha * keep  # (N, L)
            total = kept.sum(1, keepdim=True)
            uniform = keep.to(alpha.dtype) / keep.sum()
            return torch.where(total > 0, kept / total.clamp_min(1e-30), uniform.expand_as(alpha))

        return edit


def _suppressed(vocab: Vocab, cfg: DecodeConfig, t: int) -> list[int]:
    """The ids step ``t`` may not produce. <end> is never the first word: no caption is empty (a model can
    prefer "" on an image unlike its training data; the paper's captions all have words)."""
    ids = [vocab.pad_id, vocab.start_id] + ([vocab.end_id] if t == 0 else [])
    return ids + [vocab.unk_id] if cfg.suppress_unk else ids


Inputs = torch.Tensor | Annotations  # images (B, 3, H, W), or annotations with their grid


def _encode(model: Captioner, inputs: Inputs, device: torch.device) -> Annotations:
    """Images -> annotations with this call's grid; given annotations pass through.

    A bare (B, L, D) tensor is taken to lie on a square grid (benchmarks' random annotations).
    """
    if isinstance(inputs, Annotations):
        return Annotations(inputs.feats.to(device), inputs.grid)
    inputs = inputs.to(device)
    if inputs.dim() == 4:
        return model.encode(inputs)
    side = int(round(inputs.shape[1] ** 0.5))
    if side * side != inputs.shape[1]:
        raise SatError(f"Annotations of {inputs.shape[1]} regions do not lie on a square grid; "
                       "pass Annotations(feats, grid).")
    return Annotations(inputs, (side, side))


def _sample_mask(model: Captioner, cfg: DecodeConfig, n: int, device) -> torch.Tensor | None:
    if not model.hard or cfg.hard_mode == "expect":
        return None
    if cfg.hard_mode != "sample":
        raise SatError(f"hard_mode must be expect or sample, not {cfg.hard_mode!r}.")
    return torch.ones(n, dtype=torch.bool, device=device)


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
) -> list[list[Hypothesis]]:
    """Decode B images at once with K beams each (B·K rows in one tensor); greedy is K = 1.

    ``inputs``: images (B, 3, H, W) or ``Annotations`` (B, L, D). Returns per image its ``beam_size``
    hypotheses, best first: finished ones by length-normalised score, then, if the length cap was hit
    before K finished, the best unfinished ones. Runs on the model's device in ``cfg.precision``
    (autocast is entered once for the whole decode). An image leaves the batch as soon as it is done,
    so the others run on fewer rows; the first step runs one row per image, and never ends the caption
    (``_suppressed``). In bf16, finished hypotheses within ``cfg.fp32_ties`` of the best are scored again
    in fp32 and ranked by it.
    """
    cfg = cfg or DecodeConfig()
    K = cfg.beam_size  # DecodeConfig guarantees K ≥ 1 and max_len ≥ 1
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    try:
        with autocast(device, cfg.precision) as precision:
            feats, grid = _encode(model, inputs, device)  # (B, L, D)
            settle = precision == "bf16" and cfg.fp32_ties > 0 and not (model.hard and cfg.hard_mode == "sample")
            ends, trace = _search(model, feats, device, vocab, cfg, intervention, generator)
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
        logp = _forced_steps(model, vocab, feats[rows].float(), target, intervention=intervention)[0]  # (R, T)
    for (b, i), n, row in zip(picks, lengths, logp):
        total = float(row[:n].sum())
        results[b][i] = dataclasses.replace(results[b][i], logprob=total, score=total / n ** cfg.length_norm)
    for b in {b for b, _ in picks}:
        results[b].sort(key=_rank)


def _search(model, feats, device, vocab, cfg, intervention, generator):
    """The beam loop over annotations (B, L, D). Rows are numbered afresh at every step; ``trace`` links
    them back."""
    K = cfg.beam_size
    prep, h, c = model.decoder.prepare(feats)  # (B, L, A), (B, n): one row per image at t = 0
    B, V = feats.shape[0], len(vocab)
    active = np.arange(B)  # the images still decoding, in row order
    tokens = torch.full((B,), vocab.start_id, dtype=torch.long, device=device)
    scores = torch.zeros(B, 1, device=device)  # (B', k) log-probabilities of the live rows
    if model.hard and cfg.hard_mode == "sample" and generator is None:
        generator = torch.Generator(device).manual_seed(cfg.seed)
    width = 2 * K  # candidates per image: K to keep, and room for the <end>s among them
    trace, ends = _Trace(), [[] for _ in range(B)]  # ends: (t, row, word, logprob, finished)
    done = np.zeros(B, dtype=bool)
    for t in range(cfg.max_len):
        n, k = tokens.shape[0], scores.shape[1]  # rows, rows per image
        edit = intervention.editor(t, device) if intervention is not None else None
        sample = _sample_mask(model, cfg, n, device)
        out = model.decoder.step(tokens, h, c, prep, sample=sample, generator=generator, alpha_edit=edit)
        trace.alphas.append(out.alpha)
        trace.betas.append(out.beta)
        trace.locations.append(out.location)
        # An image's best candidates are among each row's as many best words (a row's score is a constant).
        n_top = min(width, V)
        row_words, logp = _top_log_probs(model, out, _suppressed(vocab, cfg, t), n_top)  # (n, T), (n, T)
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


def _top_log_probs(model: Captioner, out, banned: list[int], n_top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``n_top`` best words and their fp32 log-probabilities (N, n_top); banned ones −inf.

    Under bf16 the logits carry 3 significant digits, which swaps near-tied captions: the words are
    found on the bf16 logits, then re-scored exactly (``Decoder.exact_logits``), and the softmax's
    normaliser uses the exact values for them and the bf16 ones for the rest of the vocabulary.
    """
    if out.logits.device.type == "cpu" and native.available():
        return _top_log_probs_fused(model, out, banned, n_top)
    inf = float("inf")
    bf16 = out.logits.dtype != torch.float32
    logits = out.logits.float() if bf16 else out.logits.clone()  # (N, V) fp32, our own copy
    held = logits[:, banned]  # (N, b) banned ids still count in the normaliser
    logits[:, banned] = -inf
    top, words = logits.topk(n_top, dim=1)  # (N, T)
    if bf16:
        top_exact = model.decoder.exact_logits(out.deep_out, words)  # (N, T) fp32
        logits.scatter_(1, words, -inf)  # every other word, as bf16 gave it
        parts = [logits, held, top_exact]
    else:
        top_exact, parts = top, [logits, held]
    norm = torch.logsumexp(torch.cat([torch.logsumexp(x, 1, keepdim=True) for x in parts], 1), 1, keepdim=True)
    return words, (top_exact - norm).masked_fill(top == -inf, -inf)


def _top_log_probs_fused(model: Captioner, out, banned: list[int], n_top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``_top_log_probs`` with the best words, the row's max and Σ exp found in one pass (``native.top_words``).

    The normaliser swaps the top words' bf16 terms for their exact ones: Σ_all − Σ_top(bf16) + Σ_top(exact),
    in fp64 (the difference loses nothing that matters: the exact terms are added back at full size).
    """
    logits = out.logits
    mask = torch.zeros(logits.shape[1], dtype=torch.bool)
    mask[banned] = True
    top, words, row_max, total = native.top_words(logits, mask, n_top)  # (N, T), (N, T), (N,), (N,)
    allowed = top > -float("inf")  # (N, T) False past the allowed words
    top_exact = model.decoder.exact_logits(out.deep_out, words) if logits.dtype != torch.float32 else top
    m = row_max.double().unsqueeze(1)  # (N, 1)
    kept = lambda x: torch.where(allowed, (x.double() - m).exp(), 0.0).sum(1)  # noqa: E731
    norm = m.squeeze(1) + (total - kept(top) + kept(top_exact)).log()  # (N,)
    logp = (top_exact.double() - norm.unsqueeze(1)).float()
    return words, logp.masked_fill(~allowed, -float("inf"))


def _exact_log_probs(model: Captioner, out, words: torch.Tensor) -> torch.Tensor:
    """fp32 log p of ``words`` (N, W) under one step's distribution (not renormalised for banned ids)."""
    logits = out.logits  # (N, V)
    if logits.dtype == torch.float32:
        return logits.gather(1, words) - torch.logsumexp(logits, dim=1, keepdim=True)
    exact = model.decoder.exact_logits(out.deep_out, words)  # (N, W) fp32
    rest = logits.float().scatter_(1, words, -float("inf"))  # (N, V) every other word, as bf16 gave it
    norm = torch.logaddexp(torch.logsumexp(rest, 1, keepdim=True), torch.logsumexp(exact, 1, keepdim=True))
    return exact - norm


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


def _as_batch(image: torch.Tensor | Annotations) -> torch.Tensor | Annotations:
    if isinstance(image, Annotations):  # already encoded (encode_images)
        return image
    return image.unsqueeze(0) if image.dim() == 3 else image  # (1, 3, H, W)


@torch.no_grad()
def encode_images(model: Captioner, images: torch.Tensor, precision: str = "auto") -> Annotations:
    """The annotations (B, L, D) that ``beam_search`` and ``best_reference`` would compute from ``images``
    (B, 3, H, W), for a caller that gives the same images to both: the encoder runs once."""
    device = next(model.parameters()).device
    with autocast(device, precision):
        return _encode(model, images, device)


@dataclass
class StepView:
    """What one decoding step shows: the word, the distribution it came from, α, β."""

    index: int
    token: int
    word: str
    logprob: float
    top_words: list[str]
    top_probs: list[float]
    alpha: np.ndarray  # (gh, gw)
    beta: float
    location: int  # hard: sampled region (sample mode) or argmax α (expect mode); −1 for soft
    forced: bool  # a word the user chose instead of the model's
    # The next word of a caption the session replays (``DecodeSession.sync``'s ``follow``: the beam's best),
    # which need not be the most probable word of this step
    followed: bool = False

    @property
    def rank(self) -> int | None:
        """1 + how many shown words are more probable than this step's word; None: not among those shown."""
        return self.top_words.index(self.word) + 1 if self.word in self.top_words else None

    @property
    def beam_chose(self) -> bool:
        """A replayed beam caption's word that is not this step's most probable one (greedy would say another)."""
        return self.followed and self.rank != 1


class DecodeSession:
    """Step through one image's caption word by word; go back; force a word and continue.

    The encoder runs once when the session starts; each step is one decoder step.
    """

    def __init__(
        self,
        model: Captioner,
        vocab: Vocab,
        image: torch.Tensor,
        cfg: DecodeConfig | None = None,
        *,
        top_k: int = 5,
        intervention: Intervention | None = None,
    ) -> None:
        self.model, self.vocab, self.cfg = model.eval(), vocab, cfg or DecodeConfig()
        self.top_k, self.intervention = top_k, intervention
        self.device = next(model.parameters()).device
        with torch.no_grad(), autocast(self.device, self.cfg.precision):
            feats, self.grid = _encode(model, _as_batch(image), self.device)
            self._prep, h, c = model.decoder.prepare(feats)
        start = torch.tensor([vocab.start_id], device=self.device)
        self._states: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = [(h, c, start)]
        self.steps: list[StepView] = []

    @property
    def done(self) -> bool:
        ended = bool(self.steps) and self.steps[-1].token == self.vocab.end_id
        return ended or len(self.steps) >= self.cfg.max_len

    @property
    def words(self) -> list[str]:
        return self.vocab.decode(s.token for s in self.steps)

    @property
    def logprob(self) -> float:
        return float(sum(s.logprob for s in self.steps))

    @torch.no_grad()
    def step(self, force: str | int | None = None, *, followed: bool = False) -> StepView:
        """Advance one word: the most probable one, or ``force`` (a word or an id); ``followed``: ``force`` is the
        next word of a replayed caption (``sync``'s ``follow``), not one the user chose."""
        if self.done:
            raise SatError("The caption is complete; go back a step or force a different word.")
        t = len(self.steps)
        h, c, prev = self._states[-1]
        sample = _sample_mask(self.model, self.cfg, 1, self.device)
        gen = None
        if sample is not None:  # one seed per step, so back() + step() draws the same location
            gen = torch.Generator(self.device).manual_seed(self.cfg.seed * 1_000_003 + t)
        edit = self.intervention.editor(t, self.device) if self.intervention is not None else None
        with autocast(self.device, self.cfg.precision):
            out = self.model.decoder.step(prev, h, c, self._prep, sample=sample, generator=gen, alpha_edit=edit)
        V = len(self.vocab)
        banned = _suppressed(self.vocab, self.cfg, t)
        if force is None:  # the decision beam 1 makes: the best of each row's two best candidates
            words, logp = _top_log_probs(self.model, out, banned, min(2, V))  # (1, 2)
            token = int(words[0, logp[0].argmax()])
        else:
            token = self._token(force)
            if t == 0 and token == self.vocab.end_id:
                raise SatError("A caption has at least one word: <end> cannot be the first; force another word.")
        logprob = float(_exact_log_probs(self.model, out, torch.tensor([[token]], device=self.device))[0, 0])
        shown, shown_logp = _top_log_probs(self.model, out, banned, min(self.top_k, V))  # (1, top_k)
        order = shown_logp[0].argsort(descending=True)
        alpha = out.alpha[0].float()
        location = int(out.location[0])
        if self.model.hard and location < 0:
            location = int(alpha.argmax())
        view = StepView(
            index=t,
            token=token,
            word=self.vocab.itos[token],
            logprob=logprob,
            top_words=[self.vocab.itos[i] for i in shown[0, order].tolist()],
            top_probs=shown_logp[0, order].exp().tolist(),
            alpha=alpha.cpu().numpy().reshape(self.grid),
            beta=float(out.beta[0]),
            location=location,
            forced=force is not None and not followed,
            followed=force is not None and followed,
        )
        self._states.append((out.h, out.c, torch.tensor([token], device=self.device)))
        self.steps.append(view)
        return view

    @property
    def alphas(self) -> np.ndarray:
        """α of every step taken so far, flattened over the grid: (T, L)."""
        L = self.grid[0] * self.grid[1]
        return np.stack([s.alpha.reshape(-1) for s in self.steps]) if self.steps else np.zeros((0, L))

    @property
    def betas(self) -> np.ndarray:
        return np.array([s.beta for s in self.steps])  # (T,)

    def sync(self, n_steps: int, forced: Mapping[int, str], follow: Sequence[int | str] = ()) -> None:
        """Bring the session to ``n_steps`` steps. Step t is ``forced[t]`` if given; else ``follow[t]`` while every
        step before it agrees with ``follow`` (a caption to replay, such as the beam's best: its tokens, ending
        with <end> when it finished); else the most probable word.

        Keeps the longest prefix that already agrees, so one more step costs one decoder step.
        """
        follow = [self._token(w) for w in follow]
        keep = 0
        while keep < min(n_steps, len(self.steps)):
            step = self.steps[keep]
            want, followed = self._wanted(keep, forced, follow)
            if (step.forced, step.followed) != (want is not None and not followed, followed) or (
                    want is not None and step.token != self._token(want)):
                break
            keep += 1
        while len(self.steps) > keep:
            self.back()
        while len(self.steps) < n_steps and not self.done:
            want, followed = self._wanted(len(self.steps), forced, follow)
            self.step(force=want, followed=followed)

    def _wanted(self, t: int, forced: Mapping[int, str], follow: Sequence[int]) -> tuple[str | int | None, bool]:
        """Step t's word for ``sync`` (None: the most probable) and whether it is ``follow``'s."""
        if t in forced:
            return forced[t], False
        if t < len(follow) and all(s.token == w for s, w in zip(self.steps[:t], follow)):
            return follow[t], True
        return None, False

    def back(self) -> None:
        """Undo the last step (no-op at the start)."""
        if self.steps:
            self.steps.pop()
            self._states.pop()

    def force(self, word: str | int) -> StepView:
        """Replace the last step's word with ``word`` (or force the next one at the start)."""
        self.back()
        return self.step(force=word)

    def run(self) -> list[StepView]:
        """Step until <end> or the length cap."""
        while not self.done:
            self.step()
        return self.steps

    def _token(self, word: str | int) -> int:
        if isinstance(word, int):
            if not 0 <= word < len(self.vocab):
                raise SatError(f"Token id {word} is outside the vocabulary of {len(self.vocab)} words.")
            return word
        if word not in self.vocab.stoi:
            raise SatError(f"{word!r} is not in the model's vocabulary; pick one of the listed words.")
        return self.vocab.stoi[word]


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


def _caption_ids(vocab: Vocab, caption: str | Sequence[str] | Sequence[int]) -> tuple[list[int], list[str], list[str]]:
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
        feats, grid = _encode(model, _as_batch(image), device)
        forced = _forced_steps(model, vocab, feats.expand(rows, -1, -1), target, sample=sample, generator=gen,
                               intervention=intervention)  # rows share the image
    return (*forced, grid)


def _forced_steps(model: Captioner, vocab: Vocab, feats: torch.Tensor, target: torch.Tensor, *,
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
        logps.append(_exact_log_probs(model, out, target[:, t : t + 1])[:, 0])  # (R,) exact under bf16 too
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
    ids, words, unknown = _caption_ids(vocab, caption)
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
        ids, _words, unknown = _caption_ids(vocab, ref)
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
    ids, words, _ = _caption_ids(vocab, caption)
    logps, alphas, _, locations, grid = _teacher_force(model, vocab, image, ids + [vocab.end_id], rows=n, seed=seed,
                                                       precision=precision)
    return SampledPaths(words, locations.astype(int), logps, alphas, grid, seed)


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
        feats, grid = _encode(model.eval(), _as_batch(image), device)
    shared = Annotations(feats.expand(n, -1, -1), grid)  # (n, L, D): one encoder pass for all samples
    return [hyps[0] for hyps in beam_search(model, shared, vocab, cfg)]
