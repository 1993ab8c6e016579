"""The LSTM decoder of PAPER.md: init MLPs, attention, gate β, LSTM, deep output layer.

``step`` is the one decoder step used by training (teacher forcing), beam search, decode sessions,
caption scoring and interventions alike. ModelConfig's ``gate_size``, ``deep_output``,
``attention_activation`` and ``init_activation`` describe variants (sgrvinod's tutorial: a vector gate,
logits = L_o h_t, ReLU attention, linear init) so converted checkpoints run here; the defaults are the paper's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sat_core import native
from sat_core.config import ModelConfig
from sat_core.models.attention import AttentionMLP, attend
from sat_core.precision import compute_dtype

AlphaEdit = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Prepared:
    """Per-image tensors computed once and reused at every step.

    Decoder rows come in groups of k adjacent rows per image (k beams or samples), all reading the
    same B images' tensors; k is inferred from the number of rows at each step.
    """

    feats: torch.Tensor  # (B, L, D) annotations a_i, in the compute dtype (bf16 under autocast)
    proj: torch.Tensor  # (B, L, A) 2(W_a a_i + b), fp32 (see AttentionMLP)

    def index(self, images: torch.Tensor) -> "Prepared":
        """Keep only these images (B',)."""
        return Prepared(self.feats[images], self.proj[images])


@dataclass
class StepOut:
    logits: torch.Tensor  # (N, V)
    alpha: torch.Tensor  # (N, L)
    beta: torch.Tensor  # (N,)  1 where there is no gate (hard attention)
    location: torch.Tensor  # (N,) sampled region, −1 when the expectation was used
    log_p_loc: torch.Tensor  # (N,) log p(s_t | a) for sampled rows, 0 elsewhere
    h: torch.Tensor  # (N, n)
    c: torch.Tensor  # (N, n)
    deep_out: torch.Tensor  # (N, m) what L_o reads (after dropout): exact re-scoring of bf16 logits


class Decoder(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        D, n, m, K = config.feature_dim, config.hidden_dim, config.embed_dim, config.vocab_size
        self.hard = config.attention == "hard"
        # The paper introduces β with soft attention; hard attention's ẑ_t is one region, ungated.
        self.gated = config.gate and not self.hard
        self.embed = nn.Embedding(K, m)  # E
        act = nn.Tanh if config.init_activation == "tanh" else nn.Identity
        self.init_h = nn.Sequential(nn.Linear(D, n), act())  # f_init,h
        self.init_c = nn.Sequential(nn.Linear(D, n), act())  # f_init,c
        self.attention = AttentionMLP(D, n, config.attn_dim, config.attention_activation)  # f_att
        self.f_beta = nn.Linear(n, D if config.gate_size == "vector" else 1) if self.gated else None
        # LSTMCell's gates are an affine map of [input; h_{t−1}] with input = [E y_{t−1}; ẑ_t].
        self.lstm = nn.LSTMCell(m + D, n)
        self.deep_output = config.deep_output
        self.L_h = nn.Linear(n, m, bias=False) if self.deep_output else None
        self.L_z = nn.Linear(D, m, bias=False) if self.deep_output else None
        self.dropout = nn.Dropout(config.dropout)
        self.L_o = nn.Linear(m if self.deep_output else n, K)
        self._compiled: Callable | None = None  # ``compile_recurrence``

    def prepare(self, feats: torch.Tensor) -> tuple[Prepared, torch.Tensor, torch.Tensor]:
        """Projections for attention and the initial state (h_0, c_0) (B, n) from the mean annotation.

        Under bf16 autocast the annotations are cast here, once per image, for the context products;
        the projection and (h_0, c_0) stay fp32.
        """
        mean = feats.float().mean(dim=1)  # (B, D)
        proj = self.attention.project(feats)  # (B, L, A) fp32
        prep = Prepared(feats.to(compute_dtype(feats)), proj)
        return prep, self.init_h(mean).float(), self.init_c(mean).float()

    def _lstm(self, gates: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """LSTMCell's update from its pre-activations (N, 4n) = W_ih x + W_hh h + b; (h, c) stay fp32."""
        i, f, g, o = gates.float().chunk(4, dim=1)  # (N, n) each, nn.LSTMCell's order
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c

    def _context(self, h, prep, sample, generator, alpha_edit):
        """α_t from h_{t−1}, then the (gated) context ẑ_t: (α (N, L), β (N,), ẑ (N, D), location, log p)."""
        alpha = self.attention(prep.proj, h)  # (N, L) fp32
        if alpha_edit is not None:
            alpha = alpha_edit(alpha)
        context, location, log_p_loc = attend(prep.feats, alpha, sample=sample if self.hard else None,
                                              generator=generator, backend=self.attention.backend)  # (N, D)
        if self.f_beta is not None:
            gate = torch.sigmoid(self.f_beta(h).float())  # (N, 1), or (N, D) for a vector gate
            context = gate.to(context.dtype) * context
            beta = gate.mean(dim=1)  # (N,): a vector gate is reported by its mean
        else:
            beta = torch.ones_like(alpha[:, 0])
        return alpha, beta, context, location, log_p_loc

    def step(
        self,
        prev_tokens: torch.Tensor,
        h: torch.Tensor,
        c: torch.Tensor,
        prep: Prepared,
        *,
        sample: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        alpha_edit: AlphaEdit | None = None,
    ) -> StepOut:
        """One word: α_t from h_{t−1}, context ẑ_t, LSTM update, p(y_t | a, y_<t) as logits.

        ``sample`` (N,) bool picks the rows that draw a hard location (hard attention only);
        ``alpha_edit`` replaces α before the context is formed (attention interventions).
        """
        emb = self.embed(prev_tokens)  # (N, m)
        alpha, beta, context, location, log_p_loc = self._context(h, prep, sample, generator, alpha_edit)
        lstm = self.lstm
        x = torch.cat([emb.to(context.dtype), context], dim=1)  # (N, m + D)
        gates = F.linear(x, lstm.weight_ih, lstm.bias_ih).float() + F.linear(h, lstm.weight_hh, lstm.bias_hh)  # (N, 4n)
        h, c = self._lstm(gates, h, c)
        out = self.dropout(emb + self.L_h(h) + self.L_z(context) if self.deep_output else h)  # (N, m) or (N, n)
        logits = self.L_o(out)  # (N, V)
        return StepOut(logits, alpha, beta, location, log_p_loc, h, c, out)

    def exact_logits(self, deep_out: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        """fp32 logits of chosen words (N, W) from ``StepOut.deep_out``, whatever the autocast.

        ``deep_out`` is (N, m), or (N, n) for a model without the deep output layer.

        bf16 rounds a logit of 10 by up to 0.03, enough to swap near-tied captions; beam search finds
        its candidates on the bf16 logits and re-scores these few exactly.
        """
        if deep_out.device.type == "cpu" and native.available():
            return native.exact_logits(self.L_o.weight, self.L_o.bias, deep_out, words)  # no (N, W, m) gather
        W = self.L_o.weight.float()[words]  # (N, W, m)
        # Elementwise product and sum: matmul would run in bf16 again under autocast.
        return (W * deep_out.float().unsqueeze(1)).sum(2) + self.L_o.bias.float()[words]  # (N, W)

    def _recurrence(self, gates_emb: torch.Tensor, h: torch.Tensor, c: torch.Tensor, prep: Prepared,
                    W_z: torch.Tensor, sample: torch.Tensor | None, generator: torch.Generator | None):
        """What each teacher-forced step cannot share with the others: α_t and ẑ_t from h_{t−1}, the LSTM's
        recurrent part and update. ``gates_emb`` (B, 4n) is the embedding's share of the gates."""
        alpha, beta, context, _loc, log_p = self._context(h, prep, sample, generator, None)
        gates = gates_emb + F.linear(context, W_z) + F.linear(h, self.lstm.weight_hh)  # (B, 4n)
        h, c = self._lstm(gates, h, c)
        return h, c, alpha, beta, context, log_p

    def compile_recurrence(self, backend: str = "inductor") -> None:
        """Train with the teacher-forced recurrence compiled (``torch.compile``, one graph per batch shape):
        on a GPU the attention scores, softmax, context and LSTM cell of a step become a few fused kernels
        instead of some forty launches. Attention then runs as written (``backend="plain"``): the compiler
        fuses what the hand-made blocks of ``attention_fast`` do for eager code. Same values, up to rounding."""
        self.attention.backend = "plain"
        self._compiled = torch.compile(self._recurrence, backend=backend, dynamic=False)

    def teacher_forced(
        self,
        prev_tokens: torch.Tensor,
        h: torch.Tensor,
        c: torch.Tensor,
        prep: Prepared,
        *,
        sample: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``step`` over known inputs prev_tokens (B, T) at once: (logits (B,T,V), α (B,T,L), β, log p(s_t)).

        Under teacher forcing the embedding, its share of the LSTM input and the deep output layer
        (L_h h_t, L_z ẑ_t, L_o) do not feed the recurrence, so they run once over all B·T rows as one
        large product each; the time loop keeps only W_h h, attention and the LSTM's recurrent part.
        Same numbers as calling ``step`` T times (up to float rounding and dropout's draws).
        """
        B, T = prev_tokens.shape
        lstm, m = self.lstm, self.embed.embedding_dim
        emb = self.embed(prev_tokens)  # (B, T, m)
        gates_emb = F.linear(emb, lstm.weight_ih[:, :m], lstm.bias_ih + lstm.bias_hh).float()  # (B, T, 4n)
        # Weight slices are not parameters, so autocast would recast them at every step: cast once here.
        W_z = lstm.weight_ih[:, m:].to(compute_dtype(emb))  # (4n, D)
        hs, contexts, alphas, betas, log_ps = [], [], [], [], []
        recur = self._compiled or self._recurrence
        for t in range(T):
            h, c, alpha, beta, context, log_p = recur(gates_emb[:, t], h, c, prep, W_z, sample, generator)
            hs.append(h)
            contexts.append(context)
            alphas.append(alpha)
            betas.append(beta)
            log_ps.append(log_p)
        H, Z = torch.stack(hs, 1), torch.stack(contexts, 1)  # (B, T, n), (B, T, D)
        out = emb + self.L_h(H) + self.L_z(Z) if self.deep_output else H  # (B, T, m) or (B, T, n)
        logits = self.L_o(self.dropout(out))  # (B, T, V)
        return logits, torch.stack(alphas, 1), torch.stack(betas, 1), torch.stack(log_ps, 1)
