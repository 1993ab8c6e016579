"""The fast backend of f_att (``AttentionMLP(backend="fast")``, the default): the same α as the paper's
equations in ``attention.py``, computed for a CPU's caches and vector units.

* The σ trick: tanh(x) = 2σ(2x) − 1, and the constant −w^T 1 + w_0 drops out of the softmax, so
  α_t = softmax(2w^T σ(2(W_a a_i + b) + 2 W_h h_{t−1})). On this project's CPU σ runs about 6× faster than
  tanh, and this elementwise block over (N, L, A) is half a decode step at batch 64 × beam 5. ReLU is
  positively homogeneous, so on the same doubled projections w^T relu(x) = ½ w^T relu(2x).
* The (B, k, L, A) block is never materialised whole: a few images at a time it is formed in a buffer that
  stays in cache, and under autograd (``_Scores``) the backward pass forms it again rather than storing it.
* On a CPU, ``sat_core.native`` computes the scores, and under autograd their backward pass and the context
  vectors, in fused C loops where they can be built (the same values to fp32 rounding; the scores about twice
  as fast at batch 64 × beam 5, the backward pass about five times at COCO size in training).

tests/test_model.py holds this backend's α and gradients to the plain equations'.
"""

from __future__ import annotations

import torch

from sat_core import native
from sat_core.precision import compute_dtype

# Images per chunk of the (chunk, k, L, A) block in no-grad decoding: small enough to stay in
# cache (5 beams × 196 × 512 fp32 is 2 MB per image), large enough to amortise the call overhead.
# Measured at COCO dims, batch 64 × beam 5: 1 → 49 ms, 2 → 40, 4 → 30, 8 → 56, 16 → 49, whole → 124.
# On a GPU the chunks would only multiply kernel launches (there a step is launch-bound, not
# cache-bound), so it runs every image in one chunk.
CHUNK_IMAGES = 4


def project(mlp, feats: torch.Tensor) -> torch.Tensor:
    """2(W_a a_i + b) in fp32 (B, L, A): independent of t, so computed (and cast) once per image."""
    proj = 2 * mlp.W_a(feats).float()  # (B, L, A)
    if torch.is_grad_enabled() and proj.requires_grad:
        sink = _GradSink()
        proj = _Collect.apply(proj, sink)
        proj._grad_sink = sink  # read by ``alpha``: every step adds its gradient into one buffer
    return proj


def alpha(mlp, proj: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """α (fp32) for N = B·k rows of hidden state over B images' projections (B, L, A) from ``project``."""
    B, L, A = proj.shape
    k = h.shape[0] // B
    relu = mlp.activation == "relu"
    wh = 2 * mlp.W_h(h).float().view(B, k, 1, A)  # (B, k, 1, A)
    w = (0.5 if relu else 2) * mlp.w.weight.float().view(A)  # (A,)
    step = B if proj.is_cuda else CHUNK_IMAGES
    if torch.is_grad_enabled():
        sink = getattr(proj, "_grad_sink", None)
        e = _Scores.apply(proj, wh, w, relu, step, sink)  # (B, k, L)
        # w's bias cancels in the softmax (zero gradient), but DDP wants every parameter used.
        e = e + mlp.w.bias.float()
    elif _fused_here(proj, relu):
        e = native.attention_scores(proj, wh.view(B, k, A), w)  # one fused loop, same values
    else:
        e = _scores(proj, wh, w, relu, step)
    return torch.softmax(e.view(B * k, L), dim=1)  # (N, L)


def context(alpha: torch.Tensor, feats: torch.Tensor) -> torch.Tensor | None:
    """Σ_i α_i a_i (B, k, D) for training on a CPU in ``sat_core.native``'s loops; None where they do not run
    (no autograd, another device, no compiler): the caller's ``torch.bmm`` is as fast there."""
    if not (torch.is_grad_enabled() and _fused_here(feats, False)):
        return None
    return _Context.apply(alpha, feats.to(compute_dtype(feats)))


def _blocks(proj: torch.Tensor, wh: torch.Tensor, relu: bool, step: int):
    """(first image, act(proj + wh) for ``step`` images (c, k, L, A)) in one reused buffer."""
    B = proj.shape[0]
    buf = proj.new_empty(min(step, B), wh.shape[1], *proj.shape[1:])  # reused: stays in cache
    for s in range(0, B, step):
        x = buf[: min(B - s, step)]
        torch.add(proj[s : s + step].unsqueeze(1), wh[s : s + step], out=x)
        yield s, (x.relu_() if relu else x.sigmoid_())


def _scores(proj: torch.Tensor, wh: torch.Tensor, w: torch.Tensor, relu: bool, step: int) -> torch.Tensor:
    """e (B, k, L) = act(proj + wh) · w, a few images at a time."""
    B, L, A = proj.shape
    e = proj.new_empty(B, wh.shape[1], L)
    for s, x in _blocks(proj, wh, relu, step):
        # torch.mv is outside autocast's bf16 list: the scores stay fp32 (matmul/@ would round them).
        torch.mv(x.view(-1, A), w, out=e[s : s + step].view(-1))  # (c·k·L,)
    return e


class _GradSink:
    """One (B, L, A) gradient buffer for a projection that every time step reads."""

    def __init__(self) -> None:
        self.grad: torch.Tensor | None = None

    def buffer(self, like: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """(the buffer, whether it is new: the caller writes instead of adding)."""
        if self.grad is None:
            self.grad = torch.empty_like(like)
            return self.grad, True
        return self.grad, False

    def take(self) -> torch.Tensor | None:
        grad, self.grad = self.grad, None
        return grad


class _Collect(torch.autograd.Function):
    """Identity on the projection whose backward hands on what the steps added into the sink.

    Without it autograd would give each of the T steps its own (B, L, A) gradient and sum them, two
    more passes through memory per step; autograd runs this node after all the steps that read it.
    """

    @staticmethod
    def forward(ctx, proj, sink):
        ctx.sink = sink
        ctx.set_materialize_grads(False)
        return proj.view_as(proj)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        collected = ctx.sink.take()
        if grad is None:
            return collected, None
        return (grad if collected is None else collected + grad), None


class _Scores(torch.autograd.Function):
    """``_scores`` with a backward pass that forms the block again, a few images at a time.

    Autograd would store the (B, k, L, A) activations at every step and stream them through memory
    four more times; recomputing them in cache is cheaper on a CPU (one more sigmoid per element).
    With a sink (from ``project``) the projection's gradient is added there instead of returned.
    """

    @staticmethod
    def forward(ctx, proj, wh, w, relu, step, sink=None):
        ctx.save_for_backward(proj, wh, w)
        ctx.relu, ctx.step, ctx.sink = relu, step, sink
        ctx.fused = _fused_here(proj, relu)
        if ctx.fused:
            return native.attention_scores(proj, wh.view(wh.shape[0], wh.shape[1], -1), w)
        return _scores(proj, wh, w, relu, step)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_e):  # (B, k, L)
        proj, wh, w = ctx.saved_tensors
        B, L, A = proj.shape
        k = wh.shape[1]
        grad_e = grad_e.float().contiguous()
        if ctx.sink is not None:
            grad_proj, fresh = ctx.sink.buffer(proj)
        else:
            grad_proj, fresh = proj.new_empty(proj.shape), True  # contiguous, as the fused loop writes it
        if ctx.fused and native.available():  # one loop per image: σ formed again in cache
            grad_wh, grad_w = native.attention_scores_backward(proj, wh, w, grad_e, grad_proj, not fresh)
            return None if ctx.sink is not None else grad_proj, grad_wh.view(B, k, 1, A), grad_w, None, None, None
        grad_wh, grad_w = wh.new_empty(B, k, 1, A), w.new_zeros(A)
        for s, x in _blocks(proj, wh, ctx.relu, ctx.step):
            g = grad_e[s : s + ctx.step]  # (c, k, L)
            grad_w.addmv_(x.view(-1, A).t(), g.reshape(-1))  # Σ act · ∂e
            if ctx.relu:
                x.gt_(0)  # act'(x) from act(x)
            else:
                x.addcmul_(x, x, value=-1)  # σ' = σ(1 − σ)
            x.mul_(g.unsqueeze(-1)).mul_(w)  # ∂e/∂x, scaled by ∂e
            torch.sum(x, 2, keepdim=True, out=grad_wh[s : s + ctx.step])
            part = x[:, 0] if k == 1 else x.sum(1)  # (c, L, A)
            if fresh:
                grad_proj[s : s + ctx.step].copy_(part)
            else:
                grad_proj[s : s + ctx.step].add_(part)
        return None if ctx.sink is not None else grad_proj, grad_wh, grad_w, None, None, None


class _Context(torch.autograd.Function):
    """Context vectors α · a (B, k, D) for training on a CPU, in ``sat_core.native``'s loops.

    ``torch.bmm`` reads the annotations twice per step (forward, and backward for α) at a tenth of
    the memory's speed here: about 2.6 ms a call at COCO size, batch 32; the loops read each image's
    annotations once for its k rows. α stays fp32 (bmm rounds it to bf16 under autocast). The
    annotations' gradient, needed only when encoder blocks train, is PyTorch's product.
    """

    @staticmethod
    def forward(ctx, alpha, feats):  # (B, k, L) fp32, (B, L, D)
        ctx.save_for_backward(alpha, feats)
        return native.attention_context(alpha, feats)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):  # (B, k, D)
        alpha, feats = ctx.saved_tensors
        grad_alpha = grad_feats = None
        if ctx.needs_input_grad[0]:
            grad_alpha = native.attention_context_backward(feats, grad)
        if ctx.needs_input_grad[1]:
            grad_feats = torch.bmm(alpha.transpose(1, 2).to(grad.dtype), grad.to(feats.dtype))  # (B, L, D)
        return grad_alpha, grad_feats


def _fused_here(x: torch.Tensor, relu: bool) -> bool:
    """Whether ``sat_core.native``'s loops run for this tensor: on a CPU (f_att's scores: with tanh)."""
    return x.device.type == "cpu" and not relu and native.available()
