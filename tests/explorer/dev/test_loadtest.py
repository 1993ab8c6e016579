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



def test_the_run_log_records_each_step_click_with_its_server_time(explorer_env, tmp_path, monkeypatch):
    from tests.explorer.test_step import open_step

    log = tmp_path / "runs.jsonl"
    monkeypatch.setenv("SAT_RUN_LOG", str(log))
    at = open_step()
    for _ in range(3):
        at.button(key="step_next").click().run()
    at.button(key="step_back").click().run()
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    steps = [r for r in runs if r["page"] == "Step through"]
    assert [r["presses"] for r in steps] == [0, 1, 1, 1, 1]  # one line per click, each with its server time
    assert all(r["kind"] == "page" and 0 < r["seconds"] < 60 for r in steps)  # AppTest reruns the whole page


def test_play_keeps_its_pace_by_the_clock(explorer_env, monkeypatch):
    """A late tick catches up (two words at once) instead of slowing the caption down."""
    from explorer import stepping
    from tests.explorer.test_step import FakeClock, open_step, step_line

    clock = FakeClock()
    monkeypatch.setattr(stepping, "time", clock)
    at = open_step({"maxlen": "12"})
    at.button(key="step_play").click().run()
    for seconds, step in ((0.9, 2), (1.0, 3), (2.2, 5), (0.05, 5), (0.75, 6)):  # ticks early, on time, late
        clock.now += seconds
        at.run()
        assert step_line(at).startswith(f"**Step {step}:**"), (seconds, step_line(at)[:40])
    assert stepping.play_target(100.0, 3, 0.4, 100.31) == 4 and stepping.play_target(100.0, 3, 0.4, 100.28) == 3
