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
from torch import nn

from sat_core.config import ModelConfig
from sat_core.models.attention import AttentionMLP, attend

AlphaEdit = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Prepared:
    """Per-image tensors computed once and reused at every step.

    Decoder rows come in groups of k adjacent rows per image (k beams or samples), all reading the
    same B images' tensors; k is inferred from the number of rows at each step.
    """

    feats: torch.Tensor  # (B, L, D) annotations a_i
    proj: torch.Tensor  # (B, L, A) W_a a_i + b

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

    def prepare(self, feats: torch.Tensor) -> tuple[Prepared, torch.Tensor, torch.Tensor]:
        """Projections for attention and the initial state (h_0, c_0) (B, n) from the mean annotation."""
        mean = feats.mean(dim=1)  # (N, D)
        return Prepared(feats, self.attention.project(feats)), self.init_h(mean), self.init_c(mean)

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
        alpha = self.attention(prep.proj, h)  # (N, L)
        if alpha_edit is not None:
            alpha = alpha_edit(alpha)
        context, location, log_p_loc = attend(
            prep.feats, alpha, sample=sample if self.hard else None, generator=generator
        )  # (N, D)
        if self.f_beta is not None:
            gate = torch.sigmoid(self.f_beta(h))  # (N, 1), or (N, D) for a vector gate
            context = gate * context
            beta = gate.mean(dim=1)  # (N,): a vector gate is reported by its mean
        else:
            beta = torch.ones_like(alpha[:, 0])
        h, c = self.lstm(torch.cat([emb, context], dim=1), (h, c))  # (N, n)
        out = emb + self.L_h(h) + self.L_z(context) if self.deep_output else h  # (N, m) or (N, n)
        logits = self.L_o(self.dropout(out))  # (N, V)
        return StepOut(logits, alpha, beta, location, log_p_loc, h, c)
