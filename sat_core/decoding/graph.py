"""Beam search's steps after the first, as one function over static buffers, replayed for the whole decode.

From step 1 on every image keeps its K rows (finished ones masked, ``bookkeeping.select``), so each step reads
and writes the same tensors: the tokens, (h, c) and scores it continues from, the step number, the finished
hypotheses, and one slot per step of the trace (α, β, locations, back-pointers, words). On a GPU that step is
captured once as a CUDA graph and each step is one replay: the host launches nothing else and reads one flag a
step (is any image still decoding?). On a CPU the same function is called as it is (``DecodeConfig.graph="on"``),
which is how the tests hold it to the step-by-step search.

A captured step is kept with its model for the next decode of the same shape (``_CACHE``): a replay reads the
weights where they lie, so it follows an optimizer's in-place updates; moving or replacing them starts afresh.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch

from sat_core.decoding.bookkeeping import Ends, Trace, select
from sat_core.decoding.steps import top_log_probs
from sat_core.models.captioner import Captioner
from sat_core.models.decoder import Prepared

_CACHE: "weakref.WeakKeyDictionary[Captioner, OrderedDict]" = weakref.WeakKeyDictionary()
_KEEP = 4  # captured shapes kept per model (each holds its own memory pool)
LOCK = threading.Lock()  # one decode at a time reads and writes the static buffers (the explorer's sessions are threads)


class StaticSteps:
    """Steps 1… of a B-image, K-beam decode over buffers that never move.

    ``load`` copies in what step 0 left (annotations' projections, rows' state, scores); ``__call__`` runs
    one step and leaves its outputs in the same buffers; ``trace(n)`` gives steps 1..n as the step-by-step
    search records them."""

    def __init__(self, model: Captioner, prep: Prepared, B: int, K: int, n_hidden: int, max_len: int,
                 banned: torch.Tensor, n_top: int, end_id: int) -> None:
        device, N, L = prep.proj.device, B * K, prep.proj.shape[1]
        self.model, self.K, self.banned, self.n_top, self.end_id = model, K, banned, n_top, end_id
        self.prep = Prepared(torch.zeros_like(prep.feats), torch.zeros_like(prep.proj))  # (B, L, D), (B, L, A)
        self.tokens = torch.zeros(N, dtype=torch.long, device=device)  # (N,) the word each row was fed
        self.h = torch.zeros(N, n_hidden, device=device)  # (N, n) fp32
        self.c = torch.zeros(N, n_hidden, device=device)
        self.scores = torch.zeros(B, K, device=device)  # (B, K) live rows' log-probabilities
        self.t = torch.ones(1, dtype=torch.long, device=device)  # the step being run
        self.ends = Ends.empty(B, K, device)
        self.active = torch.arange(B, device=device)  # every image keeps its rows
        self.alphas = torch.zeros(max_len, N, L, device=device)  # (T, N, L) slot t: step t (0 unused)
        self.betas = torch.zeros(max_len, N, device=device)
        self.locations = torch.zeros(max_len, N, dtype=torch.long, device=device)
        self.parents = torch.zeros(max_len, N, dtype=torch.long, device=device)
        self.words = torch.zeros(max_len, N, dtype=torch.long, device=device)

    def load(self, prep: Prepared, tokens: torch.Tensor, h: torch.Tensor, c: torch.Tensor, scores: torch.Tensor,
             ends: Ends) -> None:
        """Continue from step 0's rows (N = B·K of them) and its finished hypotheses."""
        self.prep.feats.copy_(prep.feats)
        self.prep.proj.copy_(prep.proj)
        for mine, given in ((self.tokens, tokens), (self.h, h), (self.c, c), (self.scores, scores)):
            mine.copy_(given)
        for mine, given in zip(self.ends.tensors(), ends.tensors()):
            mine.copy_(given)
        self.t.fill_(1)

    def __call__(self) -> None:
        """One step: the decoder, the bookkeeping, the trace's slot t, then t + 1. No host copy, no new shape."""
        out = self.model.decoder.step(self.tokens, self.h, self.c, self.prep)  # (N, …)
        row_words, logp = top_log_probs(self.model, out, self.banned, self.n_top)  # (N, T)
        rows, words, scores = select(logp + self.scores.view(-1, 1), row_words, self.K, self.end_id, self.t,
                                     self.ends, self.active)
        for slots, value in ((self.alphas, out.alpha), (self.betas, out.beta), (self.locations, out.location),
                             (self.parents, rows), (self.words, words)):
            slots.index_copy_(0, self.t, value.to(slots.dtype).unsqueeze(0))
        self.h.copy_(out.h[rows])  # (N, n)
        self.c.copy_(out.c[rows])
        self.tokens.copy_(words)
        self.scores.copy_(scores)
        self.t.add_(1)

    def state(self) -> list[torch.Tensor]:
        """Every buffer a step changes outside the trace (what a warm-up run must give back)."""
        return [self.tokens, self.h, self.c, self.scores, self.t, *self.ends.tensors()]

    def trace(self, trace: Trace, steps: int, at_cap: bool) -> None:
        """Append copies of steps 1..steps−1 to ``trace`` (the next decode may reuse the buffers); the last one's
        back-pointers only when it ran at the cap (a search that ended there records none, as the step-by-step
        search does)."""
        kept = steps if at_cap else steps - 1
        for out, slots, end in ((trace.alphas, self.alphas, steps), (trace.betas, self.betas, steps),
                                (trace.locations, self.locations, steps), (trace.parents, self.parents, kept),
                                (trace.words, self.words, kept)):
            out += slots[1:end].clone().unbind(0)  # one copy per kind


def captured(steps: StaticSteps) -> Callable[[], None]:
    """``steps`` as a CUDA graph: warmed up on a side stream (as ``torch.cuda.graph`` asks), captured, its
    state given back as it was; each call is one replay."""
    state = steps.state()
    saved = [x.clone() for x in state]
    side = torch.cuda.Stream(steps.t.device)
    side.wait_stream(torch.cuda.current_stream(steps.t.device))
    with torch.cuda.stream(side):
        for _ in range(2):
            steps()
    torch.cuda.current_stream(steps.t.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        steps()
    for x, y in zip(state, saved):  # the warm-up really ran; the capture did not
        x.copy_(y)
    return graph.replay


def static_steps(model: Captioner, key: tuple, build: Callable[[], StaticSteps]
                 ) -> tuple[StaticSteps, Callable[[], None]]:
    """The model's static steps for this shape (``key``), with what runs one (on a GPU a captured graph, on a CPU
    the function itself), kept for the next decode of the same shape."""
    mine = _CACHE.setdefault(model, OrderedDict())
    weights = tuple(p.data_ptr() for p in model.parameters())  # moved or replaced weights: capture afresh
    full = (*key, weights)
    if full in mine:
        mine.move_to_end(full)
        return mine[full]
    steps = build()
    run: Callable[[], None] = steps
    if steps.t.is_cuda:
        try:
            run = captured(steps)
        except RuntimeError as err:  # a capture this GPU or driver refuses: the same step, uncaptured
            warnings.warn(f"Beam search could not capture its step as a CUDA graph ({err}); it runs the step "
                          "uncaptured (--graph off skips the attempt).", RuntimeWarning, stacklevel=3)
    mine[full] = found = (steps, run)
    while len(mine) > _KEEP:
        mine.popitem(last=False)
    return found
