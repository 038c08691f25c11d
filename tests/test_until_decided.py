"""``load.until: decided``: the run goes on until every objective is decided (PASS or FAIL by its interval) or its
``max_duration_s`` is reached; a run that decided ends normally (run.json ``ended: "decided"``, nothing cut)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.plan.scenario import Scenario
from loadgen.plan.until_spec import horizon
from tests.conftest import scenario_file
from tests.run_helpers import run_cli

BASE = {"name": "until", "target": {"base_url": "embedded", "model": "auto", "api": "chat",
                                    "simulator": {"preset": "a100-llama-7b"}},
        "workload": {"classes": [{"name": "c", "prompt_tokens": {"dist": "fixed", "value": 200},
                                  "output_tokens": {"dist": "fixed", "value": 30}}]}}


def _scenario(load: dict[str, object], slo: dict[str, object] | None = None) -> Scenario:
    return Scenario.model_validate({**BASE, "load": load, "slo": slo or {}})


@pytest.mark.parametrize("load, message", [
    ({"arrival": "poisson", "rate_per_s": 5, "duration_s": 5, "until": "decided"}, "needs load.max_duration_s"),
    ({"arrival": "poisson", "rate_per_s": 5, "duration_s": 5, "max_duration_s": 60}, "caps a run with"),
    ({"arrival": "stages", "stages": [{"rate_per_s": 2, "duration_s": 5}], "until": "decided",
      "max_duration_s": 60}, "needs arrival constant"),
    ({"arrival": "poisson", "rate_per_s": 5, "requests": 50, "until": "decided", "max_duration_s": 60},
     "not load.requests"),
    ({"arrival": "poisson", "rate_per_s": 5, "duration_s": 90, "until": "decided", "max_duration_s": 60},
     "cannot exceed load.max_duration_s"),
    ({"arrival": "poisson", "rate_per_s": 500, "duration_s": 5, "until": "decided", "max_duration_s": 7200},
     "planned up front")])
def test_until_decided_is_validated_with_one_line(load: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _scenario(load)


def test_the_plan_is_made_for_the_maximum() -> None:
    sc = _scenario({"arrival": "poisson", "rate_per_s": 5, "duration_s": 5, "until": "decided",
                    "max_duration_s": 60})
    assert horizon(sc).load.duration_s == 60 and sc.load.duration_s == 5
    fixed = _scenario({"arrival": "poisson", "rate_per_s": 5, "duration_s": 5})
    assert horizon(fixed) is fixed


def test_locust_refuses_until_decided_before_anything_starts(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, json.dumps({**BASE, "load": {
        "arrival": "poisson", "rate_per_s": 5, "duration_s": 2, "until": "decided", "max_duration_s": 10}}))
    res = run_cli("run", str(path), "--engine", "locust", "--out", str(tmp_path / "run"), "--no-progress",
                  timeout=120)
    assert res.returncode == 2 and "runs on the asyncio engine" in res.stderr
    assert not (tmp_path / "run" / "requests.parquet").exists()


def _run(tmp_path: Path, load: dict[str, object], slo: dict[str, object]) -> tuple[int, dict, dict]:
    path = scenario_file(tmp_path, json.dumps({**BASE, "seed": 5, "load": load, "slo": slo}))
    out = tmp_path / "run"
    res = run_cli("run", str(path), "--out", str(out), "--no-progress", "--no-png", timeout=300)
    run = json.loads((out / "run.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    return res.returncode, run, summary


@pytest.mark.slow
def test_a_run_ends_once_every_objective_is_decided(tmp_path: Path) -> None:
    """TTFT p95 needs >= 72 samples for its upper end: at 20 req/s the first check (2 s) cannot decide it, a
    later one does; the run then stops sending, lets what is in flight end, and PASSes with nothing cut, long
    before its 60 s maximum."""
    code, run, summary = _run(tmp_path, {"arrival": "constant", "rate_per_s": 20, "duration_s": 2,
                                         "warmup_s": 0.5, "until": "decided", "max_duration_s": 60},
                              {"ttft_ms": {"p95": 5000}})
    assert code == 0 and summary["verdict"] == "pass"
    assert run["ended"] == "decided" and run["until_checks"] >= 2 and run["undecided"] == []
    assert 2.5 <= run["decided_at_s"] < 30
    assert summary["requests"]["cancelled"] == 0 and not run["stopped_early"]
    assert summary["requests"]["sent"] < run["planned"] / 2  # the plan was made for 60 s
    assert all(o["decision"] == "pass" for o in summary["slo"])


@pytest.mark.slow
def test_a_run_that_cannot_decide_ends_at_its_maximum(tmp_path: Path) -> None:
    """TTFT p99 needs >= 367 samples: 10 req/s for at most 4 s cannot; the run lasts its maximum, ends
    ``max_duration`` and is INCONCLUSIVE, naming the objective."""
    code, run, summary = _run(tmp_path, {"arrival": "constant", "rate_per_s": 10, "duration_s": 1,
                                         "until": "decided", "max_duration_s": 4}, {"ttft_ms": {"p99": 5000}})
    assert code == 3 and summary["verdict"] == "inconclusive"
    assert run["ended"] == "max_duration" and run["decided_at_s"] is None
    assert "ttft_ms.p99" in run["undecided"]
    assert summary["requests"]["sent"] == run["planned"] == 40
