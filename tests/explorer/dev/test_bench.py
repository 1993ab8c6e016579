"""explorer.dev.bench measures the app's paths with a real checkpoint."""

from __future__ import annotations

import json

import pytest

from explorer.dev import bench


def test_bench_reports_caption_and_step_timings(explorer_env, tmp_path, capsys):
    scene = explorer_env.scene_path(explorer_env.test_ids()[0])
    out = tmp_path / "bench.json"
    bench.main(["--checkpoint", str(explorer_env.roots / "tiny-soft"), "--image", str(scene), "--runs", "3",
                "--max-len", "6", "--json", str(out)])
    report = json.loads(out.read_text())
    figures = report["images"][scene.name]
    for part in ("caption", "step", "step_and_overlay"):
        assert figures[part]["runs"] == 3
        assert 0 < figures[part]["p50_ms"] <= figures[part]["p95_ms"]
        assert figures[part]["mean_ms"] > 0
    assert report["attention"] == "soft" and report["beam"] == 3
    printed = capsys.readouterr().out
    assert "upload -> caption + α strip" in printed and "one decode step" in printed


def test_bench_refuses_a_missing_checkpoint(explorer_env, tmp_path, capsys):
    scene = explorer_env.scene_path(explorer_env.test_ids()[0])
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--checkpoint", str(tmp_path / "nothing"), "--runs", "1", "--image", str(scene)])
    assert exit_info.value.code == 2
    assert "No checkpoint at" in capsys.readouterr().err


def test_summary_percentiles():
    s = bench.summary([float(v) for v in range(1, 21)])
    assert s["p50_ms"] == 10.5 and s["p95_ms"] == 19.0 and s["mean_ms"] == 10.5 and s["runs"] == 20
