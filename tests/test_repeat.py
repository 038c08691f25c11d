"""`loadgen run --repeat N`: the across-run figures (t-interval, CV), the combined verdict's three cases, the runs'
seeds and directories, the reports, and compare and history reading a repeat (one short real repeat of two runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from scipy import stats

from loadgen.api import load_scenario
from loadgen.analysis.repeat_result import combine, combined_verdict, objective_spreads, spread, summary_view
from loadgen.analysis.result import RunResult
from loadgen.plan.scenario import Scenario
from loadgen.report import repeat_report
from loadgen.run.repeat import run_repeat
from tests.run_helpers import run_cli

XSD = Path(__file__).parent / "data" / "junit-10.xsd"


def test_the_interval_is_student_t_over_the_runs_values() -> None:
    values = [10.0, 12.0, 11.0, 15.0]
    s = spread([*values, None], 0.95)
    mean, sd = sum(values) / 4, math.sqrt(sum((v - 12.0) ** 2 for v in values) / 3)
    half = stats.t.ppf(0.975, 3) * sd / 2
    assert (s.n, s.mean, s.sd) == (4, mean, pytest.approx(sd))
    assert (s.ci_low, s.ci_high) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert s.cv == pytest.approx(sd / mean)
    one = spread([3.0, None], 0.95)
    assert (one.n, one.mean, one.ci_low, one.cv) == (1, 3.0, None, None)
    assert spread([0.0, 0.0], 0.95).cv is None  # no CV of a zero mean


def _summary(verdict: str, **values: float | None) -> dict[str, Any]:
    return {"verdict": verdict, "metrics": {"ttft_ms": {"p99": 100.0}},
            "slo": [{"objective": name, "value": v, "threshold": 10.0, "comparison": ">=" if name == "goodput" else "<=",
                     "passed": None if v is None else (v >= 10 if name == "goodput" else v <= 10)}
                    for name, v in values.items()]}


def _verdict(*summaries: dict[str, Any]) -> tuple[str, list[str]]:
    return combined_verdict([s["verdict"] for s in summaries], objective_spreads(list(summaries), 0.95))


def test_pass_needs_every_run_passing_and_every_interval_on_the_passing_side() -> None:
    assert _verdict(_summary("pass", a=5.0, goodput=20.0), _summary("pass", a=6.0, goodput=21.0),
                    _summary("pass", a=5.5, goodput=19.0)) == ("pass", [])
    verdict, reasons = _verdict(_summary("pass", a=5.0), _summary("pass", a=9.9), _summary("pass", a=6.0))
    assert verdict == "inconclusive" and "a: across-run interval" in reasons[0] and "straddles" in reasons[0]


def test_fail_when_an_interval_lies_wholly_beyond_the_limit_whatever_the_runs_said() -> None:
    verdict, reasons = _verdict(_summary("fail", a=12.0), _summary("pass", a=12.5), _summary("fail", a=13.0))
    assert verdict == "fail" and reasons[0].startswith("a: across-run interval [")
    verdict, _ = _verdict(_summary("fail", goodput=2.0), _summary("fail", goodput=3.0))
    assert verdict == "fail"


def test_inconclusive_names_the_runs_that_did_not_pass_and_objectives_without_two_values() -> None:
    verdict, reasons = _verdict(_summary("pass", a=5.0, b=1.0), _summary("inconclusive", a=5.2, b=None))
    assert verdict == "inconclusive"
    assert reasons[0] == "not every run passed: run 2 (inconclusive)"
    assert reasons[1] == "b: values in 1 run(s), an interval needs 2"
    verdict, reasons = _verdict(_summary("pass", a=5.0), _summary("inconclusive", a=None), _summary("pass", a=5.0))
    assert reasons[1] == "a: across-run interval [5, 5] passes, but not in every run (run 2 inconclusive)"


def test_an_objective_passes_across_runs_only_when_every_run_decided_it_pass() -> None:
    """No errors in any run: a zero-width interval under the limit, but each run too small to decide it."""
    undecided = [{"verdict": "inconclusive", "slo": [{"objective": "error_rate.max", "value": 0.0, "threshold": 0.01,
                                                      "comparison": "<=", "passed": None, "decision": "inconclusive"}]}
                 for _ in range(3)]
    (o,) = objective_spreads(undecided, 0.95)
    assert (o.spread.ci_low, o.spread.ci_high, o.decision) == (0.0, 0.0, "inconclusive")
    assert combined_verdict(["inconclusive"] * 3, [o])[0] == "inconclusive"


def _result(verdict: str, seed: int, itl_p99: float) -> dict[str, Any]:
    return {"verdict": verdict, "reasons": [], "seed": seed, "requests": {"completed": 10, "error_rate": 0.0},
            "metrics": {"itl_ms": {"p99": itl_p99}, "ttft_ms": {"p99": 2 * itl_p99}},
            "throughput": {"output_tokens_per_s": 100.0}, "stalls": {"per_1k_tokens": 0.0},
            "slo": [{"objective": "itl_ms.p99", "value": itl_p99, "threshold": 50.0, "comparison": "<=",
                     "passed": itl_p99 <= 50, "samples": 500}]}


def test_each_run_gets_the_next_seed_and_its_own_directory(tmp_path: Path) -> None:
    sc = load_scenario("tests/data/advise_sim.yaml", {"seed": 7})
    seen: list[tuple[int, Path]] = []
    sources: list[Any] = []

    def run_one(one: Scenario, run_dir: Path) -> RunResult:
        seen.append((one.seed, run_dir))
        sources.append(one.source)
        return RunResult.from_dict(_result("pass", one.seed, 20.0 + one.seed), run_dir)
    run_repeat(sc, 3, tmp_path, run_one, Console(quiet=True))
    assert seen == [(7, tmp_path / "run-01-seed7"), (8, tmp_path / "run-02-seed8"), (9, tmp_path / "run-03-seed9")]
    assert [items[-1] for _, items in sources] == ["seed=7", "seed=8", "seed=9"]  # Locust workers reload these
    assert load_scenario(*sources[1]).seed == 8
    doc = json.loads((tmp_path / "repeat.json").read_text())
    assert doc["seeds"] == [7, 8, 9] and doc["verdict"] == "pass" and doc["exit_code"] == 0
    assert doc["metrics"]["itl_ms.p99"]["values"] == [27.0, 28.0, 29.0] and doc["metrics"]["itl_ms.p99"]["mean"] == 28.0
    assert summary_view(doc)["metrics"]["itl_ms"]["p99"] == 28.0
    assert "**PASS over 3 runs" in (tmp_path / "summary.md").read_text()
    assert 'id="verdict">PASS' in (tmp_path / "repeat.html").read_text()
    xmlschema = pytest.importorskip("xmlschema")
    xmlschema.XMLSchema(str(XSD)).validate(str(tmp_path / "junit.xml"))


def test_an_interrupted_run_ends_the_repeat_inconclusive(tmp_path: Path) -> None:
    sc = load_scenario("tests/data/advise_sim.yaml")

    def run_one(one: Scenario, run_dir: Path) -> RunResult:
        result = RunResult.from_dict(_result("pass", one.seed, 20.0), run_dir)
        result.interrupted = one.seed == sc.seed + 1
        return result
    result = run_repeat(sc, 4, tmp_path, run_one, Console(quiet=True))
    assert [r["seed"] for r in result.runs] == [sc.seed, sc.seed + 1]
    assert (result.verdict, result.exit_code) == ("inconclusive", 3)
    assert result.reasons[0] == "interrupted: 2 of 4 runs done"


def test_the_exit_code_is_the_combined_verdict_s() -> None:
    runs = [{"dir": f"run-{i}", "seed": i, "verdict": "fail", "exit_code": 1} for i in (1, 2)]
    failed = combine("r", runs, [_result("fail", 1, 80.0), _result("fail", 2, 81.0)])
    assert (failed.verdict, failed.exit_code) == ("fail", 1)
    mixed = combine("r", runs, [_result("pass", 1, 30.0), _result("fail", 2, 60.0)])
    assert (mixed.verdict, mixed.exit_code) == ("inconclusive", 3)
    runs[0]["exit_code"] = 4
    assert combine("r", runs, [_result("pass", 1, 30.0), _result("pass", 2, 31.0)]).exit_code == 4
    assert "run-2" in repeat_report.junit_xml(failed).decode()


# ---- one short real repeat: two runs of about two seconds ---------------------------------------------------------
@pytest.fixture(scope="module")
def repeat_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    root = tmp_path_factory.mktemp("repeat")
    res = run_cli("run", "tests/data/advise_sim.yaml", "--repeat", "2", "--out", str(root / "rep"), "--no-progress",
                  "--no-png", "--set", "load.duration_s=1.5", "--set", "load.rate_per_s=10",
                  "--set", "load.warmup_s=0.5")
    return root, res


def test_a_real_repeat_writes_its_runs_and_one_report(repeat_dir: tuple[Path, Any]) -> None:
    root, res = repeat_dir
    doc = json.loads((root / "rep" / "repeat.json").read_text())
    assert res.returncode == doc["exit_code"] == {"pass": 0, "fail": 1, "inconclusive": 3}[doc["verdict"]], res.stdout
    assert [r["dir"] for r in doc["runs"]] == ["run-01-seed11", "run-02-seed12"]
    for r in doc["runs"]:
        info = json.loads((root / "rep" / r["dir"] / "run.json").read_text())
        summary = json.loads((root / "rep" / r["dir"] / "summary.json").read_text())
        assert info["seed"] == r["seed"] and summary["verdict"] == r["verdict"]
    itl = [json.loads((root / "rep" / r["dir"] / "summary.json").read_text())["metrics"]["itl_ms"]["p50"]
           for r in doc["runs"]]
    assert doc["metrics"]["itl_ms.p50"]["values"] == itl
    assert f"verdict: {doc['verdict'].upper()} over 2 runs" in res.stdout


@pytest.mark.slow  # two CLI calls over the repeat (about 20 s on a busy machine)
def test_history_lists_a_repeat_once_and_compare_pools_its_runs(repeat_dir: tuple[Path, Any]) -> None:
    root, _ = repeat_dir
    rep = root / "rep"
    res = run_cli("history", str(root))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 runs →" in res.stdout and "CV TTFT p99" in res.stdout and "run-01" not in res.stdout
    single = rep / "run-01-seed11"
    res = run_cli("compare", str(single), str(rep), "--out", str(root / "cmp"), "--replicates", "200")
    doc = json.loads((root / "cmp" / "compare.json").read_text())
    assert res.returncode == doc["exit_code"], res.stdout + res.stderr
    assert doc["runs"] == {"base": 1, "new": 2} and not doc["paired"]
    assert doc["verdict_change"]["new"] == json.loads((rep / "repeat.json").read_text())["verdict"]
    assert "pools the requests of 2 repeated runs" in " ".join(doc["warnings"])


def test_bad_repeat_counts_exit_2_before_anything_is_sent(tmp_path: Path) -> None:
    for n in ("0", "101"):
        res = run_cli("run", "tests/data/advise_sim.yaml", "--repeat", n, "--out", str(tmp_path / n))
        assert res.returncode == 2, res.stdout + res.stderr
        assert not (tmp_path / n).exists()


def test_history_folds_a_repeat_into_one_entry_with_its_spread(tmp_path: Path) -> None:
    """A reports directory with one single run and one repeat of two: two entries, the repeat's with its runs'
    count, combined verdict, across-run means and CVs."""
    from loadgen.report.history import collect_runs, spread_text

    def write_run(run_dir: Path, verdict: str, seed: int, itl_p99: float) -> dict[str, Any]:
        run_dir.mkdir(parents=True)
        summary = _result(verdict, seed, itl_p99)
        (run_dir / "summary.json").write_text(json.dumps(summary))
        (run_dir / "run.json").write_text(json.dumps({"scenario": {"name": "s"},
                                                      "started_at": f"2026-01-0{seed}T00:00:00+0000"}))
        return summary
    write_run(tmp_path / "single", "pass", 1, 20.0)
    summaries = [write_run(tmp_path / "rep" / f"run-0{i}", "pass", i + 1, v) for i, v in ((1, 30.0), (2, 40.0))]
    runs = [{"dir": f"run-0{i}", "seed": i + 1, "verdict": "pass", "exit_code": 0} for i in (1, 2)]
    (tmp_path / "rep" / "repeat.json").write_text(json.dumps(combine("s", runs, summaries).to_dict()))
    rows = {r["run"]: r for r in collect_runs(tmp_path).iter_rows(named=True)}
    assert set(rows) == {"single", "rep"}
    assert (rows["rep"]["runs"], rows["rep"]["itl_p99_ms"], rows["single"]["runs"]) == (2, 35.0, 1)
    assert rows["rep"]["itl_p99_cv"] == pytest.approx(math.sqrt(50) / 35)
    assert spread_text(rows["rep"]) == "CV TTFT p99 20%, ITL p99 20%" and spread_text(rows["single"]) == "–"
