"""Step through one image's caption word by word: go back, force a word, replay a caption (the explorer's
Step-through page). Each step is one decoder ``step``; the encoder runs once per session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sat_core.config import DecodeConfig
from sat_core.data.vocab import Vocab
from sat_core.decoding.steps import (
    Intervention, as_batch, encode, exact_log_probs, sample_mask, suppressed, top_log_probs,
)
from sat_core.errors import SatError
from sat_core.models.captioner import Captioner
from sat_core.precision import autocast


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
            feats, self.grid = encode(model, as_batch(image), self.device)
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
        sample = sample_mask(self.model, self.cfg, 1, self.device)
        gen = None
        if sample is not None:  # one seed per step, so back() + step() draws the same location
            gen = torch.Generator(self.device).manual_seed(self.cfg.seed * 1_000_003 + t)
        edit = self.intervention.editor(t, self.device) if self.intervention is not None else None
        with autocast(self.device, self.cfg.precision):
            out = self.model.decoder.step(prev, h, c, self._prep, sample=sample, generator=gen, alpha_edit=edit)
        V = len(self.vocab)
        banned = torch.tensor(suppressed(self.vocab, self.cfg, t), device=self.device)
        if force is None:  # the decision beam 1 makes: the best of each row's two best candidates
            words, logp = top_log_probs(self.model, out, banned, min(2, V))  # (1, 2)
            token = int(words[0, logp[0].argmax()])
        else:
            token = self._token(force)
            if t == 0 and token == self.vocab.end_id:
                raise SatError("A caption has at least one word: <end> cannot be the first; force another word.")
        logprob = float(exact_log_probs(self.model, out, torch.tensor([[token]], device=self.device))[0, 0])
        shown, shown_logp = top_log_probs(self.model, out, banned, min(self.top_k, V))  # (1, top_k)
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
