"""A run is analysed once, at its end: ``compare``, ``advise`` and a sweep step's judging read the summary.json
and stalls.parquet the run wrote instead of summarising its records again (an hour's analysis is the costly
part), and ``compare`` states the summary's own value of a statistic (one value per statistic)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from loadgen.advise import whatif
from loadgen.analysis import summary as summary_module
from loadgen.analysis.result import RunResult
from loadgen.plan.scenario import Scenario
from loadgen.run import advise as advise_run, comparison, reporting, sweep

@pytest.fixture
def runs(seeded_reruns: dict[str, Path]) -> dict[str, Path]:
    """Two runs of one seeded plan on the embedded simulator, each summarised at its end (conftest.py: the
    baseline and the identical rerun tests/test_compare.py compares)."""
    out = {"base": seeded_reruns["base"], "new": seeded_reruns["same"]}
    for run_dir in out.values():
        assert (run_dir / "summary.json").exists() and (run_dir / "stalls.parquet").exists()
    return out


@pytest.fixture
def summaries(monkeypatch: pytest.MonkeyPatch) -> list[pl.DataFrame]:
    """Every call to the summary computation, wherever it is called from: the requests it summarised."""
    calls: list[pl.DataFrame] = []
    real = summary_module.summarize

    def counted(scenario: Scenario, requests: pl.DataFrame, *args: Any, **kwargs: Any) -> Any:
        calls.append(requests)
        return real(scenario, requests, *args, **kwargs)
    for module in (summary_module, comparison, whatif, reporting):
        monkeypatch.setattr(module, "summarize", counted)
    return calls


def _is_run(requests: pl.DataFrame, run_dir: Path) -> bool:
    recorded = pl.read_parquet(run_dir / "requests.parquet").select("seq", "t_sent_ns").sort("seq")
    return requests.select("seq", "t_sent_ns").sort("seq").equals(recorded)


@pytest.mark.slow  # two real-time runs of 6 s (conftest.py's seeded_reruns)
def test_compare_reads_both_summaries_and_states_their_values(runs: dict[str, Path],
                                                              summaries: list[pl.DataFrame]) -> None:
    doc, _ = comparison.compare_runs(runs["base"], runs["new"], comparison.CompareOptions(replicates=200))
    assert summaries == []
    stated = {name: json.loads((runs[name] / "summary.json").read_text()) for name in ("base", "new")}
    by = {m["metric"]: m for m in doc["metrics"]}
    for label in ("base", "new"):
        assert by["ttft_ms.p99"][label] == stated[label]["metrics"]["ttft_ms"]["p99"]
        assert by["itl_ms.p50"][label] == stated[label]["metrics"]["itl_ms"]["p50"]
        assert by["output_tokens_per_s"][label] == stated[label]["throughput"]["output_tokens_per_s"]


@pytest.mark.slow  # two real-time runs of 6 s (conftest.py's seeded_reruns)
def test_compare_over_a_repeat_reads_its_runs_summaries(runs: dict[str, Path], summaries: list[pl.DataFrame]) -> None:
    """A repeat directory (here: the two runs under one repeat.json) is pooled from its runs' records, its
    verdict read from repeat.json and its runs' figures from their summary.json: nothing is summarised again."""
    from loadgen.analysis.repeat_result import combine

    root = runs["base"].parent
    stated = [json.loads((runs[name] / "summary.json").read_text()) for name in ("base", "new")]
    entries = [{"dir": runs[name].name, "seed": s["seed"], "verdict": s["verdict"], "exit_code": 0}
               for name, s in zip(("base", "new"), stated)]
    (root / "repeat.json").write_text(json.dumps(combine("smoke", entries, stated).to_dict()))
    try:
        doc, _ = comparison.compare_runs(runs["base"], root, comparison.CompareOptions(replicates=200))
    finally:
        (root / "repeat.json").unlink()
    assert summaries == []
    assert doc["runs"] == {"base": 1, "new": 2} and doc["verdict_change"]["base"] == stated[0]["verdict"]


@pytest.mark.slow  # two real-time runs of 6 s (conftest.py's seeded_reruns)
def test_a_sweep_step_is_judged_on_the_summary_the_run_wrote(runs: dict[str, Path],
                                                             summaries: list[pl.DataFrame]) -> None:
    run_dir = runs["base"]
    result = RunResult.from_dict(json.loads((run_dir / "summary.json").read_text()), run_dir)
    _, scenario = reporting.read_run_info(run_dir)
    step = sweep.judge_step(result, scenario, sweep.SweepOptions(mode="rate", replicates=200), 8.0, 5.0, 1, 6.0)
    assert summaries == []
    assert step.load == 8.0


@pytest.mark.slow  # two real-time runs of 6 s (conftest.py's seeded_reruns)
def test_advise_replays_the_settings_but_reads_the_measured_run_s_summary(runs: dict[str, Path],
                                                                          summaries: list[pl.DataFrame]) -> None:
    run_dir = runs["new"]
    before = (run_dir / "summary.json").read_text()
    advice = advise_run.advise_run(run_dir, whatif.AdviseOptions(tries={"max_num_seqs": [64]}), png=False)
    assert advice.candidates and summaries, "the replays are analysed"
    assert not any(_is_run(requests, run_dir) for requests in summaries), "the measured run is not summarised"
    assert (run_dir / "summary.json").read_text() == before
    assert "advice" in (run_dir / "report.html").read_text().lower()


@pytest.mark.parametrize("shuffle", [False, True], ids=["as recorded", "rows shuffled"])
def test_the_narrow_gaps_are_the_sorted_gaps_whatever_the_record_order(shuffle: bool) -> None:
    """The gaps are taken in record order where each request's chunks are together and in time order (as the
    sink writes them); records in any other order are sorted first: the same gaps either way."""
    from loadgen.analysis import metrics as m
    from loadgen.analysis.run_analysis import RunAnalysis
    from loadgen.records.scan import load_records

    requests, chunks = load_records(Path(__file__).parent / "data" / "golden_run", merge=False)
    if shuffle:
        chunks = chunks.sample(fraction=1.0, shuffle=True, seed=3)
    req = m.with_request_metrics(requests)
    ok = req.filter(~pl.col("warmup") & pl.col("ok")).select("worker", "seq")
    columns = ["worker", "seq", "t_ns", "tokens", "chunk_gap_ms", "itl_ms", "class_name"]
    expected = m.chunk_gaps(req, chunks).join(ok, on=["worker", "seq"], how="semi").select(columns)
    got = RunAnalysis(requests, chunks).wide().collect().select(columns)
    assert got.height == expected.height > 1000
    assert got.sort(columns).equals(expected.sort(columns))
