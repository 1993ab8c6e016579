"""The load test's server-side figures: the app logs its own runs, the summary reads them."""

from __future__ import annotations

import json

from explorer.dev.loadtest import summarise
from tests.explorer.conftest import new_app


def test_the_app_logs_each_run_with_its_page_source_and_seconds(explorer_env, tmp_path, monkeypatch):
    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv("SAT_RUN_LOG", str(log))
    at = new_app()
    at.run()
    at.switch_page("views/step.py")
    at.run()
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["page"] for r in runs] == ["Caption", "Step through"]
    assert all(r["source"] == "Gallery scene" and 0 < r["seconds"] < 60 for r in runs)


def test_server_time_to_caption_comes_from_the_upload_caption_runs():
    runs = [{"page": "Caption", "source": "Gallery scene", "seconds": 9.0},
            *({"page": "Caption", "source": "Upload", "seconds": s} for s in (0.2, 0.4, 0.3, 1.5)),
            {"page": "Step through", "source": "Upload", "seconds": 0.1}]
    phase = {"results": [], "sessions": 4, "peak_mb": 1.0, "rss_at_start_mb": 1.0, "wall_s": 1.0,
             "server_cpu_s": 2.0, "client_cpu_s": 3.0, "server_runs": runs}
    figures = summarise(phase)
    assert figures["server_caption_p50_s"] == 0.35 and figures["server_caption_p95_s"] == 1.5
    assert figures["server_runs"] == 6 and figures["server_run_p95_s"] == 9.0
