"""The benchmark CLI at --quick sizes: figures present, positive, consistent (no timing assertions)."""

from __future__ import annotations

import json

import pytest
import torch

from sat_core import bench, native
from sat_core.benchmarks import graphs, measure


def _precisions() -> list[str]:
    """``--precision all``: fp32, and bf16 wherever the CPU has bf16 instructions (even when slower)."""
    from sat_core.precision import cpu_has_bf16

    return ["fp32"] + (["bf16"] if cpu_has_bf16() else [])


def test_train_quick(tmp_path, capsys):
    out, threads = tmp_path / "train.json", torch.get_num_threads()
    assert bench.main(["train", "--quick", "--device", "cpu", "--threads", "1", "--json", str(out)]) == 0
    assert torch.get_num_threads() == threads, "--threads must not leak out of main()"
    rows = json.loads(out.read_text())["train"]
    assert [(r["attention"], r["device"], r["precision"]) for r in rows] == [
        (a, "cpu", p) for p in _precisions() for a in ("soft", "hard")]
    for r in rows:
        assert r["captions_per_s"] > 0 and r["ms_per_step"] > 0 and r["peak_mb"] >= 0
        assert r["gemm_ms"] > 0 and r["attention_ms"] > 0 and 0 < r["floor_ms"] <= r["gemm_ms"]
        assert r["floor_precision"] in _precisions()  # the faster of the row's own and the other precision
        assert r["captions_per_s"] == pytest.approx(r["batch"] * 1000 / r["ms_per_step"])
        assert r["step_over_floor"] == pytest.approx(r["ms_per_step"] / r["floor_ms"])
        assert r["ceiling_captions_per_s"] == pytest.approx(r["batch"] * 1000 / r["floor_ms"])
    printed = capsys.readouterr().out
    assert "captions/s" in printed and "peak MB" in printed and printed.count(" quick ") == 2 * len(_precisions())
    assert all(f"precision {p}" in printed for p in _precisions())


def test_decode_quick(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert bench.main(["decode", "--quick", "--device", "cpu", "--threads", "1", "--precision", "fp32",
                       "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    rows, serial = figures["decode"], figures["one_by_one"]
    assert [(r["beam"], r["batch"], r["precision"]) for r in rows] == [(1, 1, "fp32"), (1, 4, "fp32"),
                                                                       (2, 1, "fp32"), (2, 4, "fp32")]
    for r in rows:
        assert r["steps"] == 4, "<end> is unreachable for random weights: every decode runs max_len steps"
        assert r["images_per_s"] > 0 and r["peak_mb"] >= 0
        assert r["gemm_ms"] > 0 and r["attention_ms"] > 0 and r["decoder_step_ms"] > 0
        assert 0 < r["floor_ms"] <= r["gemm_ms"] and r["floor_precision"] in _precisions()
        assert r["step_over_floor"] == pytest.approx(r["ms_per_step"] / r["floor_ms"])
        assert r["ceiling_images_per_s"] == pytest.approx(1000 * r["batch"] / (r["steps"] * r["floor_ms"]))
        assert r["ms_per_step"] == pytest.approx(1000 * r["batch"] / r["images_per_s"] / r["steps"])
    assert [(s["beam"], s["batch"]) for s in serial] == [(1, 4), (2, 4)]
    for s, batched in zip(serial, (rows[1], rows[3])):
        assert s["batched_images_per_s"] == batched["images_per_s"] and s["one_by_one_images_per_s"] > 0
        assert s["speedup"] == pytest.approx(s["batched_images_per_s"] / s["one_by_one_images_per_s"])
        assert s["ceiling_speedup"] == pytest.approx(batched["ceiling_images_per_s"] / s["one_by_one_images_per_s"])
    printed = capsys.readouterr().out
    assert "step/floor" in printed and "one-by-one img/s" in printed and "precision fp32" in printed
    assert "ceiling img/s" in printed and "ceiling speed-up" in printed
    on = native.available()
    assert all(r["fused_loops"] is on for r in rows)
    assert f"fused CPU loops (sat_core/native) {'on' if on else 'off'}" in printed


def test_decode_with_the_fused_loops_off_is_the_pytorch_baseline(tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert bench.main(["decode", "--quick", "--device", "cpu", "--threads", "1", "--precision", "fp32",
                       "--fused", "off", "--json", str(out)]) == 0
    assert not any(r["fused_loops"] for r in json.loads(out.read_text())["decode"])
    assert "fused CPU loops (sat_core/native) off" in capsys.readouterr().out
    assert native.available() == (native.library() is not None), "--fused off must not outlive main()"


def test_compile_quick_agrees_with_the_eager_block(tmp_path, capsys):
    """bench compile: torch.compile of the attention scores gives the chunked eager block's values."""
    out = tmp_path / "compile.json"
    assert bench.main(["compile", "--quick", "--device", "cpu", "--threads", "1", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert (figures["batch"], figures["beam"], figures["device"]) == (8, 5, "cpu")
    assert figures["max_abs_diff"] < 1e-3  # σ sums over 512 dims of N(0, 2) inputs: |e| is in the hundreds
    assert figures["compiled_ms"] > 0 and figures["eager_chunked_ms"] > 0 and figures["compile_s"] > 0
    printed = capsys.readouterr().out
    assert "torch.compile" in printed and "chunked eager" in printed
    if native.available():
        assert figures["fused_ms"] > 0 and figures["fused_max_abs_diff"] < 1e-3
        assert "fused C loop (sat_core/native)" in printed


def test_peak_memory_sees_an_allocation():
    with measure.PeakMemory(torch.device("cpu")) as mem:
        block = torch.ones(64, 2**20 // 4)  # 64 MiB, every page touched
        del block
    assert 50 < mem.mb < 1000


def test_cuda_device_refused_without_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench.main(["decode", "--quick", "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_graph_refused_on_cpu(capsys):
    assert bench.main(["graph", "--quick", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--device cuda" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_graph_replay_matches_eager_on_cuda():
    rows = graphs.run_graph(torch.device("cuda"), quick=True, precision="all")
    assert {r["precision"] for r in rows} == {"fp32", "bf16"} and len(rows) == 4
    for r in rows:
        assert r["graph_max_diff"] < 1e-3  # the same kernels replayed: the same logits
        assert r["compiled_max_diff"] < (0.1 if r["precision"] == "bf16" else 1e-2)
        assert r["eager_ms"] > 0 and r["graph_ms"] > 0 and r["compiled_ms"] > 0
