"""What every decoding path shares around the decoder's ``step``: inputs, banned words, interventions, and
each step's word log-probabilities (exact under bf16).

``beam`` (search), ``scoring`` (teacher forcing) and ``session`` (word by word) all call the decoder through
these, so the three see the same distribution at every step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sat_core import native
from sat_core.config import DecodeConfig
from sat_core.data.vocab import Vocab
from sat_core.errors import SatError
from sat_core.models.captioner import Captioner
from sat_core.models.decoder import AlphaEdit
from sat_core.models.encoder import Annotations
from sat_core.precision import autocast


def pick_device(name: str | None = None) -> torch.device:
    """``None``/"auto": CUDA when available, else CPU; otherwise the named device."""
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(name).startswith("cuda") and not torch.cuda.is_available():
        raise SatError(f"Device {name!r} was asked for but no CUDA GPU is available; use --device cpu.")
    return torch.device(name)


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


def suppressed(vocab: Vocab, cfg: DecodeConfig, t: int) -> list[int]:
    """The ids step ``t`` may not produce. <end> is never the first word: no caption is empty (a model can
    prefer "" on an image unlike its training data; the paper's captions all have words)."""
    ids = [vocab.pad_id, vocab.start_id] + ([vocab.end_id] if t == 0 else [])
    return ids + [vocab.unk_id] if cfg.suppress_unk else ids


Inputs = torch.Tensor | Annotations  # images (B, 3, H, W), or annotations with their grid


def encode(model: Captioner, inputs: Inputs, device: torch.device) -> Annotations:
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


def as_batch(image: torch.Tensor | Annotations) -> torch.Tensor | Annotations:
    if isinstance(image, Annotations):  # already encoded (encode_images)
        return image
    return image.unsqueeze(0) if image.dim() == 3 else image  # (1, 3, H, W)


@torch.no_grad()
def encode_images(model: Captioner, images: torch.Tensor, precision: str = "auto") -> Annotations:
    """The annotations (B, L, D) that ``beam_search`` and ``best_reference`` would compute from ``images``
    (B, 3, H, W), for a caller that gives the same images to both: the encoder runs once."""
    device = next(model.parameters()).device
    with autocast(device, precision):
        return encode(model, images, device)


def sample_mask(model: Captioner, cfg: DecodeConfig, n: int, device) -> torch.Tensor | None:
    if not model.hard or cfg.hard_mode == "expect":
        return None
    if cfg.hard_mode != "sample":
        raise SatError(f"hard_mode must be expect or sample, not {cfg.hard_mode!r}.")
    return torch.ones(n, dtype=torch.bool, device=device)


def top_log_probs(model: Captioner, out, banned: torch.Tensor, n_top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``n_top`` best words and their fp32 log-probabilities (N, n_top); the ids ``banned`` (a long
    tensor on the logits' device) −inf.

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
    logits.index_fill_(1, banned, -inf)  # not ``logits[:, banned] = -inf``: it copies a host scalar (no CUDA graph)
    top, words = logits.topk(n_top, dim=1)  # (N, T)
    if bf16:
        top_exact = model.decoder.exact_logits(out.deep_out, words)  # (N, T) fp32
        logits.scatter_(1, words, -inf)  # every other word, as bf16 gave it
        parts = [logits, held, top_exact]
    else:
        top_exact, parts = top, [logits, held]
    norm = torch.logsumexp(torch.cat([torch.logsumexp(x, 1, keepdim=True) for x in parts], 1), 1, keepdim=True)
    return words, (top_exact - norm).masked_fill(top == -inf, -inf)


def _top_log_probs_fused(model: Captioner, out, banned: torch.Tensor, n_top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``top_log_probs`` with the best words, the row's max and Σ exp found in one pass (``native.top_words``).

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


def exact_log_probs(model: Captioner, out, words: torch.Tensor) -> torch.Tensor:
    """fp32 log p of ``words`` (N, W) under one step's distribution (not renormalised for banned ids)."""
    logits = out.logits  # (N, V)
    if logits.dtype == torch.float32:
        return logits.gather(1, words) - torch.logsumexp(logits, dim=1, keepdim=True)
    exact = model.decoder.exact_logits(out.deep_out, words)  # (N, W) fp32
    rest = logits.float().scatter_(1, words, -float("inf"))  # (N, V) every other word, as bf16 gave it
    norm = torch.logaddexp(torch.logsumexp(rest, 1, keepdim=True), torch.logsumexp(exact, 1, keepdim=True))
    return exact - norm


def draw_words(out, banned: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One word per row drawn from the step's distribution over the words it may produce: ids (N, 1) and their
    fp32 log-probabilities under that distribution (renormalised without the banned ids)."""
    logits = out.logits.float().index_fill(1, banned, -float("inf"))  # (N, V) our own copy
    logp = torch.log_softmax(logits, dim=1)  # (N, V)
    words = torch.multinomial(logp.exp(), 1, generator=generator)  # (N, 1)
    return words, logp.gather(1, words)
