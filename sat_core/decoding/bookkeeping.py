"""Beam search's bookkeeping as tensors on the decoder's device: each image's top K of its K·V candidates, the
hypotheses that ended inside its beam, and whether its search is over. ``beam`` runs it step by step; ``graph``
replays it over static buffers. Nothing here copies to the host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Trace:
    """Per-step tensors and back-pointers, left on the device until decoding ends."""

    alphas: list[torch.Tensor] = field(default_factory=list)  # per step (N_t, L)
    betas: list[torch.Tensor] = field(default_factory=list)  # per step (N_t,)
    locations: list[torch.Tensor] = field(default_factory=list)  # per step (N_t,)
    parents: list[torch.Tensor] = field(default_factory=list)  # per step (N_t+1,): row at step t of row i at t+1
    words: list[torch.Tensor] = field(default_factory=list)  # per step (N_t+1,): word row i at t+1 was fed


@dataclass
class Ends:
    """Each image's hypotheses that ended inside its beam, as tensors: slot j of image b is the j-th <end> it
    found, in the order found (the order ties keep when ranked). Column 2K takes the writes of no <end>.

    At most 2K − 1 are ever needed: an image has fewer than K before a step (else it is done), and a step
    finishes at most K (only <end>s among its K best candidates)."""

    t: torch.Tensor  # (B, 2K+1) the step that produced the <end>
    row: torch.Tensor  # (B, 2K+1) the row at step t it followed
    logprob: torch.Tensor  # (B, 2K+1) fp32
    count: torch.Tensor  # (B,) slots used
    done: torch.Tensor  # (B,) bool: no live hypothesis can still win a place (``search_over``)

    @classmethod
    def empty(cls, B: int, K: int, device: torch.device) -> "Ends":
        zeros = lambda dtype: torch.zeros(B, 2 * K + 1, dtype=dtype, device=device)  # noqa: E731
        return cls(zeros(torch.long), zeros(torch.long), zeros(torch.float32),
                   torch.zeros(B, dtype=torch.long, device=device), torch.zeros(B, dtype=torch.bool, device=device))

    def tensors(self) -> list[torch.Tensor]:
        """Every field, in the constructor's order."""
        return [self.t, self.row, self.logprob, self.count, self.done]

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
class Last:
    """Where the search stopped: the images still decoding (row order), their live scores and whether the
    length cap was reached (their live beams then become unfinished hypotheses)."""

    active: torch.Tensor  # (B',) image ids
    scores: torch.Tensor  # (B', K)
    at_cap: bool


def select(cand, row_words, K, end_id, t, ends, active):
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
    done = search_over(count, scores[:, 0], K)  # (B',)
    ends.done[active] = done
    return rows.reshape(-1), words.reshape(-1), scores.masked_fill(done.view(-1, 1), -float("inf"))


def search_over(finished: torch.Tensor, best_live: torch.Tensor, K: int) -> torch.Tensor:
    """True (per image) when no live hypothesis can still win a place among the image's K results.

    The results are the first K hypotheses to end inside the beam (an <end> among the image's K
    best candidates), ranked by length-normalised score; while fewer have ended, live ones fill the
    remaining places. So a live hypothesis can win only while fewer than K have finished and one is
    alive. The rule does not depend on ``length_norm``: beam 1 is greedy for every normalisation
    (a bound on future scores would let a normalised search run on past greedy's <end>).
    """
    return (finished >= K) | (best_live == -float("inf"))


