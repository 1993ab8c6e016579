"""Cached annotations reach the training device as the rows a step asks for: read on a CPU; on a GPU gathered
there when resident, or copied from pinned host buffers that take turns (a buffer is refilled only after its
copy has ended)."""

from __future__ import annotations

import pytest
import torch

from sat_core.training.feed import AnnotationFeed

ROWS = [[3, 0, 7], [1, 1, 2, 9, 4], [5], [8, 6, 0, 2]]  # steps of other sizes, a repeated image


def _cache() -> torch.Tensor:
    return torch.randn(10, 6, 4, generator=torch.Generator().manual_seed(0)).half()  # (N, L, D) fp16, as cached


def test_on_a_cpu_a_step_reads_its_rows():
    cache = _cache()
    feed = AnnotationFeed(cache, torch.device("cpu"))
    assert not feed.resident
    for rows in ROWS:
        got = feed(rows)
        assert got.dtype == torch.float16 and got.shape == (len(rows), 6, 4)
        assert torch.equal(got, cache[rows])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("resident", ["on", "off", "auto"])
def test_on_a_gpu_resident_or_pinned_every_step_gets_its_own_rows(resident):
    cache, said = _cache(), []
    feed = AnnotationFeed(cache, torch.device("cuda"), resident, say=said.append)
    assert feed.resident == (resident != "off") and len(said) == 1
    assert ("on the GPU" in said[0]) == feed.resident
    got = [feed(rows) for rows in ROWS]  # several copies in flight before any is read
    torch.cuda.synchronize()
    for rows, x in zip(ROWS, got):
        assert x.is_cuda and torch.equal(x.cpu(), cache[rows])
