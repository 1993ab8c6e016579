"""The commands keep freed memory (an encoder pass reuses the previous pass's pages); importing sat_core does not."""

import os
import resource
import subprocess
import sys

import pytest
import torch

from sat_core import allocator
from sat_core.models.efficientnet import EfficientNetLite0


def test_encoder_passes_reuse_freed_pages():
    if not allocator.keep_freed_memory():
        pytest.skip("needs glibc's mallopt (Linux)")
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
    assert allocator.keep_freed_memory() == allocator.keep_freed_memory()
    assert allocator.asked()


def _run(code: str, **env: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def test_environment_can_keep_glibcs_defaults():
    code = "import sat_core.allocator as a; print(a.keep_freed_memory())"
    assert _run(code, SAT_KEEP_FREED_MEMORY="0") == "False"


def test_importing_the_library_leaves_the_allocator_alone():
    """Every module of sat_core imported (the commands' too, without running them): nobody asked for mallopt."""
    code = ("import importlib, pkgutil, sat_core, sat_core.allocator as a\n"
            "for m in pkgutil.walk_packages(sat_core.__path__, 'sat_core.'):\n"
            "    importlib.import_module(m.name)\n"
            "print(a.asked())")
    assert _run(code) == "False"
