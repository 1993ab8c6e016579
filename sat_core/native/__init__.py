"""Fused CPU loops for no-grad decoding and parts of training (``fused.c``), compiled on first use by the machine's C compiler.

Beam search at batch 64 × beam 5 spends most of a step outside the matrix products: f_att's
elementwise block over (B, k, L, A) and finding each row's best words among V with the softmax's
normaliser. PyTorch runs both as several passes through memory; ``fused.c`` runs each as one loop
that stays in cache (``python -m sat_core.bench decode`` shows the effect). The loops compute the same
values as the PyTorch code they replace, to fp32 rounding (tested against it).

The shared library is built once per source, compiler flags and CPU into a cache folder
(``$SAT_NATIVE_CACHE``, else ``$XDG_CACHE_HOME/sat_explorer``, else ``~/.cache/sat_explorer``), with
``$CC`` or ``cc``. Where there is no compiler, the build fails or ``SAT_NATIVE=0`` is set, everything
runs on the PyTorch code instead (``available()`` is False): slower, never different.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from sat_core.precision import cpu_flags

SOURCE = Path(__file__).with_name("fused.c")
# The first set that compiles is used: the CPU's own vector units, then portable code.
FLAG_SETS = (
    ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp"),
    ("-O3", "-march=native", "-ffast-math", "-fopenmp"),
    ("-O3", "-ffast-math", "-fopenmp"),
    ("-O3", "-ffast-math"),
)
_forced_off = False


def cache_dir() -> Path:
    """Where built libraries are kept."""
    if os.environ.get("SAT_NATIVE_CACHE"):
        return Path(os.environ["SAT_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sat_explorer"


def _key(compiler: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), compiler.encode(), " ".join(flags).encode(), platform.machine().encode(),
                 " ".join(sorted(cpu_flags())).encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _build(compiler: str, flags: tuple[str, ...]) -> Path | None:
    """The library for these flags: from the cache, else compiled into it (None when that fails)."""
    target = cache_dir() / f"fused-{_key(compiler, flags)}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [compiler, *flags, "-fPIC", "-shared", "-o", tmp, str(SOURCE), "-lm"]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=120)
        if done.returncode != 0:
            return None
        os.replace(tmp, target)  # atomic: a process building beside this one never loads half a file
        return target
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The loaded library, or None where it cannot be built or ``SAT_NATIVE=0`` is set."""
    if os.environ.get("SAT_NATIVE", "1") == "0":
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        return None
    for flags in FLAG_SETS:
        try:
            path = _build(compiler, flags)
        except (OSError, RuntimeError):  # an unwritable cache folder, or no home folder: no library, not an error
            return None
        if path is None:
            continue
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        lib.attention_scores.argtypes = [ptr, ptr, ptr, ptr, i64, i64, i64, i64, ctypes.c_int]
        lib.attention_scores.restype = None
        lib.attention_scores_backward.argtypes = [ptr, ptr, ptr, ptr, ptr, ctypes.c_int, ptr, ptr, i64, i64, i64,
                                                  i64, ctypes.c_int]
        lib.attention_scores_backward.restype = None
        lib.attention_context.argtypes = [ptr, ptr, ctypes.c_int, ptr, i64, i64, i64, i64, ctypes.c_int]
        lib.attention_context.restype = None
        lib.attention_context_backward.argtypes = [ptr, ptr, ctypes.c_int, ptr, i64, i64, i64, i64, ctypes.c_int]
        lib.attention_context_backward.restype = None
        lib.top_words.argtypes = [ptr, ctypes.c_int, ptr, i64, i64, i64, ptr, ptr, ptr, ptr, ctypes.c_int]
        lib.top_words.restype = None
        lib.exact_logits.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
        lib.exact_logits.restype = None
        return lib
    return None


def available() -> bool:
    """True when the fused loops run here (and have not been switched off by ``disabled``)."""
    return not _forced_off and library() is not None


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the PyTorch code instead, within this block (for comparisons and benchmarks)."""
    global _forced_off
    before, _forced_off = _forced_off, True
    try:
        yield
    finally:
        _forced_off = before


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def attention_scores(proj: torch.Tensor, wh: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """e (B, k, L) = Σ_a w_a σ(proj[b, l, a] + wh[b, j, a]) for fp32 CPU tensors proj (B, L, A), wh (B, k, A), w (A,)."""
    lib = library()
    assert lib is not None, "attention_scores called where available() is False"
    B, L, A = proj.shape
    k = wh.shape[1]
    proj, wh, w = (t.float().contiguous() for t in (proj, wh.reshape(B, k, A), w))
    e = proj.new_empty(B, k, L)
    lib.attention_scores(_ptr(proj), _ptr(wh), _ptr(w), _ptr(e), B, k, L, A, torch.get_num_threads())
    return e


def attention_scores_backward(proj: torch.Tensor, wh: torch.Tensor, w: torch.Tensor, grad_e: torch.Tensor,
                              grad_proj: torch.Tensor,
                              accumulate: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward pass of ``attention_scores`` for ∂e (B, k, L): σ formed again, never stored.

    Writes (or, with ``accumulate``, adds) ∂proj into ``grad_proj`` (B, L, A), a contiguous fp32 buffer;
    returns (∂wh (B, k, A), ∂w (A,)). All fp32 CPU tensors.
    """
    lib = library()
    assert lib is not None, "attention_scores_backward called where available() is False"
    B, L, A = proj.shape
    k = wh.shape[1]
    proj, wh, w, grad_e = (t.float().contiguous() for t in (proj, wh.reshape(B, k, A), w, grad_e))
    if not (grad_proj.is_contiguous() and grad_proj.dtype == torch.float32 and grad_proj.shape == proj.shape):
        raise ValueError("grad_proj must be a contiguous fp32 tensor shaped like proj")
    grad_wh, grad_w = proj.new_empty(B, k, A), proj.new_empty(B, A)
    lib.attention_scores_backward(_ptr(proj), _ptr(wh), _ptr(w), _ptr(grad_e), _ptr(grad_proj), int(accumulate),
                                  _ptr(grad_wh), _ptr(grad_w), B, k, L, A, torch.get_num_threads())
    return grad_wh, grad_w.sum(0)


def _features(feats: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Contiguous bf16 or fp32 annotations and whether they are bf16."""
    if feats.dtype not in (torch.bfloat16, torch.float32):
        feats = feats.float()
    return feats.contiguous(), int(feats.dtype == torch.bfloat16)


def attention_context(alpha: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
    """Context vectors (B, k, D) = α (B, k, L) · annotations (B, L, D), in the annotations' dtype (bf16 or fp32;
    sums in fp32); CPU tensors."""
    lib = library()
    assert lib is not None, "attention_context called where available() is False"
    feats, bf16 = _features(feats)
    B, L, D = feats.shape
    alpha = alpha.float().contiguous()
    k = alpha.shape[1]
    out = torch.full((B, k, D), float("nan"), dtype=feats.dtype)  # stays NaN if the loop could not run
    lib.attention_context(_ptr(alpha), _ptr(feats), bf16, _ptr(out), B, k, L, D, torch.get_num_threads())
    return out


def attention_context_backward(feats: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """∂α (B, k, L) fp32 = annotations (B, L, D) · ∂context (B, k, D): the backward pass of ``attention_context``
    for α; CPU tensors."""
    lib = library()
    assert lib is not None, "attention_context_backward called where available() is False"
    feats, bf16 = _features(feats)
    B, L, D = feats.shape
    grad = grad.to(feats.dtype).contiguous()
    k = grad.shape[1]
    out = torch.empty(B, k, L)
    lib.attention_context_backward(_ptr(feats), _ptr(grad), bf16, _ptr(out), B, k, L, D, torch.get_num_threads())
    return out


def exact_logits(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """fp32 logits W[w]·x_r + b[w] (N, n) of the words (N, n) chosen for each row of x (N, m); CPU tensors."""
    lib = library()
    assert lib is not None, "exact_logits called where available() is False"
    W, b, x = (t.float().contiguous() for t in (weight, bias, x))
    words = words.to(torch.long).contiguous()
    if len(words) and (int(words.min()) < 0 or int(words.max()) >= W.shape[0]):
        raise IndexError(f"word ids must lie in [0, {W.shape[0]})")
    out = x.new_empty(words.shape)
    lib.exact_logits(_ptr(W), _ptr(b), _ptr(x), _ptr(words), _ptr(out), words.shape[0], W.shape[1], words.shape[1],
                     torch.get_num_threads())
    return out


def top_words(logits: torch.Tensor, banned: torch.Tensor,
              n_top: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's ``n_top`` best allowed words of CPU logits (N, V), bf16 or fp32, in one pass.

    ``banned`` is a bool (V,) mask of words never chosen (they still count in the normaliser).
    Returns (values (N, n_top) fp32, best first, −inf past the allowed words; their ids (N, n_top);
    each row's max over all words (N,); Σ_i exp(x_i − max) (N,) in fp64). Equal values keep the lower id first.
    """
    lib = library()
    assert lib is not None, "top_words called where available() is False"
    if logits.dtype not in (torch.bfloat16, torch.float32):
        logits = logits.float()
    logits = logits.contiguous()
    N, V = logits.shape
    mask = banned.to(torch.uint8).contiguous()
    top = logits.new_empty(N, n_top, dtype=torch.float32)
    words = torch.empty(N, n_top, dtype=torch.long)
    row_max = torch.empty(N)
    total = torch.empty(N, dtype=torch.float64)
    lib.top_words(_ptr(logits), int(logits.dtype == torch.bfloat16), _ptr(mask), N, V, n_top, _ptr(top),
                  _ptr(words), _ptr(row_max), _ptr(total), torch.get_num_threads())
    return top, words, row_max, total
