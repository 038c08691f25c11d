"""`loadgen compare`: the bootstrap's statistics, the verdict change said first (and failing the comparison when
it got worse), thresholds derived from the scenario's own limits, compare and summary agreeing to the digit on a
real run directory, and the verdict on a planted regression vs an identical rerun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadgen.analysis.compare import RunSamples, pool_samples, poisson_weights, statistic, status_of, weighted_quantile
from loadgen.analysis.compare_basis import change_line, derived_thresholds, verdict_change
from loadgen.report.writers import fmt
from tests.run_helpers import run_cli



def test_weighted_quantile_with_unit_weights_is_the_plain_quantile():
    rng = np.random.default_rng(1)
    values = rng.lognormal(size=500)
    owner = rng.integers(0, 50, size=500)
    for q in (0.5, 0.9, 0.99):
        got = weighted_quantile(values, owner, np.ones((1, 50)), q)[0]
        assert got == np.quantile(values, q, method="inverted_cdf")


def test_weighted_quantile_follows_the_weights():
    values, owner = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 1, 2, 3])
    w = np.array([[1, 1, 1, 1], [0, 0, 0, 5], [3, 0, 0, 1], [0, 0, 0, 0]], dtype=float)
    got = weighted_quantile(values, owner, w, 0.5)
    assert list(got[:3]) == [2.0, 4.0, 1.0] and np.isnan(got[3])


def test_status_needs_the_whole_interval_beyond_the_threshold():
    assert status_of(0.12, 0.30, 0.10) == "regressed"
    assert status_of(0.05, 0.30, 0.10) == "uncertain"
    assert status_of(-0.05, 0.08, 0.10) == "unchanged"
    assert status_of(-0.40, -0.15, 0.10) == "improved"


def _samples(seqs: list[int]) -> RunSamples:
    n = len(seqs)
    z = np.zeros(n)
    return RunSamples(z, z, z, np.ones(n, bool), np.zeros(n, bool), np.ones(n, bool), z, z, np.array([]),
                      np.array([], dtype=np.int64), 1.0, np.array(seqs))


def test_paired_weights_follow_the_plan_sequence_number():
    base, new = _samples([1, 2, 3, 5]), _samples([5, 3, 2, 1, 9])
    wb, wn = poisson_weights(base, new, 200, True, np.random.default_rng(0))
    for i, seq in enumerate([1, 2, 3, 5]):
        assert (wb[:, i] == wn[:, [5, 3, 2, 1, 9].index(seq)]).all()
    wb, wn = poisson_weights(base, new, 200, False, np.random.default_rng(0))
    assert not (wb[:, 0] == wn[:, 3]).all()


@pytest.fixture
def runs(seeded_reruns: dict[str, Path]) -> dict[str, Path]:
    """The same seeded plan three times: a baseline, an identical rerun, and the simulator slowed by 20%
    (conftest.py: shared with tests/test_analysis_once.py)."""
    return seeded_reruns


@pytest.mark.slow
def test_planted_20_percent_slowdown_is_a_regression(runs):
    res = run_cli("compare", str(runs["base"]), str(runs["slow"]))
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads((runs["slow"] / "compare.json").read_text())
    by = {m["metric"]: m for m in doc["metrics"]}
    assert doc["verdict"] == "regressed" and doc["paired"]
    for metric in ("itl_ms.p50", "tpot_ms.p50", "e2e_ms.p99"):
        assert by[metric]["status"] == "regressed", by[metric]
        assert 0.10 < by[metric]["ci_low"] and by[metric]["ci_high"] < 0.30  # the planted +20%, give or take
        assert 0.17 < by[metric]["worsening"] < 0.25
    assert "REGRESSED" in res.stdout and "itl_ms.p50" in (runs["slow"] / "compare.md").read_text()


@pytest.mark.slow
def test_identical_rerun_passes(runs):
    out = runs["base"].parent / "cmp-same"
    res = run_cli("compare", str(runs["base"]), str(runs["same"]), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((out / "compare.json").read_text())
    assert doc["verdict"] == "ok" and not doc["regressed"]
    itl = next(m for m in doc["metrics"] if m["metric"] == "itl_ms.p50")
    assert itl["status"] == "unchanged" and abs(itl["worsening"]) < 0.02
    assert "no regression" in res.stdout


@pytest.mark.slow
def test_bad_input_exits_2(runs, tmp_path):
    res = run_cli("compare", str(runs["base"]), str(tmp_path))
    assert res.returncode == 2 and "no run.json" in res.stderr
    res = run_cli("compare", str(runs["base"]), str(runs["same"]), "--metric", "ttft_ms.p42")
    assert res.returncode == 2 and "unknown metric" in res.stderr
    res = run_cli("compare", str(runs["base"]), str(runs["same"]), "--confidence", "1.5")
    assert res.returncode == 2 and "--confidence" in res.stderr


# ---- the verdict change and the derived thresholds (pure) ---------------------------------------------------
def _summary(verdict: str, **decisions: Any) -> dict[str, Any]:
    return {"verdict": verdict, "slo": [{"objective": name, "passed": passed, "value": 1.0, "threshold": 2.0,
                                         "comparison": "<="} for name, passed in decisions.items()]}


def test_a_verdict_change_names_the_objectives_that_changed_decision() -> None:
    base = _summary("pass", a=True, b=True)
    new = _summary("fail", a=True, b=False)
    change = verdict_change(base, new)
    assert change["changed"] and change["worse"] and change["objectives_changed"] == ["b"]
    assert change_line(change) == "verdict PASS → FAIL (worse): b pass → fail"
    back = verdict_change(new, base)
    assert back["changed"] and not back["worse"]
    assert verdict_change(base, _summary("inconclusive", a=True, b=None))["worse"]
    assert verdict_change(_summary("inconclusive", a=None), _summary("fail", a=False))["worse"]
    assert not verdict_change(_summary("fail", a=False), _summary("inconclusive", a=None))["worse"]
    same = verdict_change(base, base)
    assert not same["changed"] and change_line(same) == "verdict PASS → PASS (unchanged)"


def test_the_contract_s_decision_wins_over_passed_and_a_missing_objective_is_absent() -> None:
    base = {"verdict": "pass", "slo": [{"objective": "a", "passed": True, "decision": "pass"}]}
    new = {"verdict": "inconclusive", "slo": [{"objective": "a", "passed": True, "decision": "inconclusive"},
                                              {"objective": "c", "passed": True}]}
    change = verdict_change(base, new)
    assert change["objectives_changed"] == ["a", "c"]
    assert [(o["base"], o["new"]) for o in change["objectives"]] == [("pass", "inconclusive"), ("absent", "pass")]


def test_thresholds_are_half_the_scenario_s_limits_the_stricter_of_the_two_runs() -> None:
    base = {"slo": {"stalls": {"max_prefill_induced_per_1k_tokens": 0.1}, "error_rate": {"max": 0.02}}}
    new = {"slo": {"stalls": {"max_prefill_induced_per_1k_tokens": 0.3, "max_per_1k_tokens": 1.0}}}
    got = derived_thresholds([base, new], {})
    assert got["prefill_stalls_per_1k_tokens"]["value"] == pytest.approx(0.05)
    assert got["stalls_per_1k_tokens"]["value"] == pytest.approx(0.5)
    assert "max_per_1k_tokens (1)" in got["stalls_per_1k_tokens"]["source"]
    assert got["error_rate"]["value"] == pytest.approx(0.01)
    bare = derived_thresholds([{"slo": {"error_rate": None}}, {}], {})
    assert bare["error_rate"] == {"value": 0.01, "source": "fallback: no slo.error_rate.max in either run"}
    assert bare["prefill_stalls_per_1k_tokens"]["source"].startswith("fallback")
    flagged = derived_thresholds([base, new], {"prefill_stalls_per_1k_tokens": 0.7, "error_rate": 0.03})
    assert flagged["prefill_stalls_per_1k_tokens"] == {"value": 0.7, "source": "flag"}
    assert flagged["error_rate"]["value"] == 0.03


def test_pooled_runs_are_one_sample_with_each_token_owned_by_its_own_request() -> None:
    def run(ttft: list[float], itl: list[float], owner: list[int]) -> RunSamples:
        n = len(ttft)
        one = np.ones(n)
        return RunSamples(np.array(ttft), one, one, np.ones(n, bool), np.zeros(n, bool), np.ones(n, bool),
                          one * 10, np.zeros(n), np.array(itl), np.array(owner), 2.0, np.arange(n), {},
                          np.array([1.0] + [0.0] * (n - 1)))
    a, b = run([1, 2], [5, 6, 7], [0, 0, 1]), run([3, 4, 5], [8, 9], [2, 1])
    pooled = pool_samples([a, b])
    assert pooled.n == 5 and list(pooled.itl_request) == [0, 0, 1, 4, 3] and len(set(pooled.seq)) == 5
    w = np.ones((1, 5))
    assert statistic("output_tokens_per_s", pooled, w)[0] == pytest.approx(50 / 4.0)
    assert statistic("prefill_stalls_per_1k_tokens", pooled, w)[0] == pytest.approx(2 / 0.05)
    assert statistic("ttft_ms.p50", pooled, w)[0] == 3.0


# ---- one short simulator run: compare states the summary's figures; a worse verdict fails ----------------------
STATED = {"output_tokens_per_s": ("throughput", "output_tokens_per_s"), "error_rate": ("requests", "error_rate"),
          "stalls_per_1k_tokens": ("stalls", "per_1k_tokens"),
          "prefill_stalls_per_1k_tokens": ("stalls", "prefill_induced_per_1k_tokens")}


def _stated(summary: dict[str, Any], metric: str) -> Any:
    if metric in STATED:
        section, key = STATED[metric]
        return summary[section][key]
    name, stat = metric.split(".")
    return summary["metrics"][name][stat]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-second run of the advise scenario on the embedded simulator (its stall objective: 2 per 1k tokens)."""
    out = tmp_path_factory.mktemp("short") / "run"
    res = run_cli("run", "tests/data/advise_sim.yaml", "--out", str(out), "--no-progress", "--no-png",
                  "--set", "load.duration_s=2", "--set", "load.rate_per_s=10", "--set", "load.warmup_s=0.5")
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr
    return out


def test_compare_and_summary_agree_to_the_digit_on_every_shared_statistic(short_run: Path, tmp_path: Path) -> None:
    res = run_cli("compare", str(short_run), str(short_run), "--out", str(tmp_path), "--replicates", "200")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((short_run / "summary.json").read_text())
    doc = json.loads((tmp_path / "compare.json").read_text())
    md = (tmp_path / "compare.md").read_text()
    assert len(doc["metrics"]) == 10
    for m in doc["metrics"]:
        stated = _stated(summary, m["metric"])
        assert m["base"] == m["new"] == stated, m
        assert f"| `{m['metric']}` | {fmt(stated)} | {fmt(stated)} |" in md
    slo = {o["objective"]: o["value"] for o in summary["slo"]}
    shown = doc["verdict_change"]["objectives"]
    assert [o["objective"] for o in shown] == list(slo)
    assert all(o["base_value"] == o["new_value"] == slo[o["objective"]] for o in shown)
    assert doc["thresholds"]["prefill_stalls_per_1k_tokens"]["value"] == 1.0  # half of the scenario's 2
    assert doc["thresholds"]["error_rate"]["value"] == 0.005  # half of its slo.error_rate.max 0.01


def _with_verdict(run: Path, out: Path, verdict: str, failing: set[str]) -> Path:
    shutil.copytree(run, out)
    summary = json.loads((out / "summary.json").read_text())
    summary["verdict"] = verdict
    for o in summary["slo"]:
        o["passed"] = o["objective"] not in failing
        o.pop("decision", None)
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def test_a_worse_verdict_is_said_first_everywhere_and_fails_the_comparison(short_run: Path, tmp_path: Path) -> None:
    """The same records under two verdicts: every metric is unchanged, the verdict change alone fails it."""
    base = _with_verdict(short_run, tmp_path / "base", "pass", set())
    new = _with_verdict(short_run, tmp_path / "new", "fail", {"itl_ms.p99"})
    res = run_cli("compare", str(base), str(new), "--replicates", "200")
    assert res.returncode == 1, res.stdout + res.stderr
    assert res.stdout.lstrip().startswith("verdict PASS → FAIL (worse): itl_ms.p99 pass → fail")
    doc = json.loads((new / "compare.json").read_text())
    assert list(doc)[0] == "verdict_change" and doc["exit_code"] == 1 and doc["regressed"] == []
    assert doc["verdict_change"]["objectives_changed"] == ["itl_ms.p99"]
    assert (new / "compare.md").read_text().startswith("## loadgen compare — ❌ verdict PASS → FAIL (worse)")
    assert "VerdictWorse" in (new / "compare-junit.xml").read_text()
    xmlschema = pytest.importorskip("xmlschema")
    xmlschema.XMLSchema(str(Path(__file__).parent / "data" / "junit-10.xsd")).validate(str(new / "compare-junit.xml"))
    assert "verdict PASS → FAIL (worse)" in (new / "compare.html").read_text()
    back = run_cli("compare", str(new), str(base), "--out", str(tmp_path / "back"), "--replicates", "200")
    assert back.returncode == 0, back.stdout + back.stderr
    assert back.stdout.lstrip().startswith("verdict FAIL → PASS (changed)")
