"""sat_core keeps freed memory: an encoder pass reuses the previous pass's pages."""

import resource

import pytest
import torch

from sat_core import allocator
from sat_core.models.efficientnet import EfficientNetLite0


@pytest.mark.skipif(not allocator.KEPT, reason="needs glibc's mallopt (Linux)")
def test_encoder_passes_reuse_freed_pages():
    model = EfficientNetLite0().eval()  # random weights: only the allocation pattern matters
    images = torch.randn(16, 3, 224, 224)  # activations up to 16×96×112×112 fp32 (77 MB)
    faults = []
    with torch.no_grad():
        model.features(images)  # the heap grows to the pass's peak
        for _ in range(3):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            feats = model.features(images)  # (16, 320, 7, 7)
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    assert feats.shape == (16, 320, 7, 7)
    # With mmap'd blocks every pass faults its activations in again (about 600,000 pages measured
    # with mmap for every block over 128 KiB); with freed memory kept, none (0–1 measured).
    assert min(faults) < 10_000, faults


def test_keep_freed_memory_is_idempotent():
    assert allocator.keep_freed_memory() == allocator.KEPT


def test_environment_can_keep_glibcs_defaults():
    import os
    import subprocess
    import sys

    code = "import sat_core.allocator as a; print(a.KEPT)"
    env = {**os.environ, "SAT_KEEP_FREED_MEMORY": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
