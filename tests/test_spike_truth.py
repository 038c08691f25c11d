"""Stall attribution scored against the simulator's ground truth (its trace of every engine step), in real time
end to end: delivery jitter and the client's own timing are part of what is scored here. The same scoring on every
engine personality runs in virtual time (tests/test_attribution_replay.py)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from local_target.sim import read_trace
from tests.ground_truth import score
from tests.run_helpers import SIM_TRACE, run_cli, summary

pytestmark = pytest.mark.timing  # real-time runs scored against the simulator's trace


@pytest.fixture(scope="module")
def unchunked(tmp_path_factory) -> Path:
    """aggressor_victim.yaml, chunked prefill off, 30 s measured after a 5 s warm-up (half the shipped 60 s, for
    CI's time: 40 s measured 117 true aggressor-victim pairs, all found, none wrong)."""
    out = tmp_path_factory.mktemp("av") / "off"
    res = run_cli("run", "scenarios/aggressor_victim.yaml", "--out", str(out), "--no-progress", "--no-png",
                  "--duration", "30",
                  *SIM_TRACE)
    assert res.returncode in (0, 1, 3), res.stderr  # attribution is scored, not the verdict
    return out


def test_attribution_precision_and_recall_against_the_trace(unchunked):
    st = summary(unchunked)["stalls"]
    sc = score(unchunked, st["long_prompt_tokens"], st["min_gap_ms"])
    print(f"precision {sc.precision:.3f} recall {sc.recall:.3f} ({sc.hits} of {sc.truth} true pairs, "
          f"{sc.predicted} predicted)")
    assert sc.truth >= 50  # the run really had aggressors stalling victims
    assert sc.precision >= 0.95 and sc.recall >= 0.90, (sc.missed, sc.wrong)


def test_the_console_and_summary_name_the_worst_culprit(unchunked):
    s = summary(unchunked)
    worst = s["stalls"]["worst_events"][0]
    assert worst["cause"] == "prefill" and worst["culprits"][0]["prompt_tokens"] >= 8000
    assert s["stall_headline"].startswith(f"{s['stalls']['count']} stalls, {s['stalls']['prefill_induced']} of them")
    assert "caused by request" in s["stall_headline"]
    md = (unchunked / "summary.md").read_text()
    assert "### Tail spikes" in md and f"#{worst['culprits'][0]['seq']}" in md
    stalls = pl.read_parquet(unchunked / "stalls.parquet")
    assert stalls.height == s["stalls"]["count"] and stalls["culprits"].dtype == pl.List(pl.Int64)


def test_chunked_prefill_cuts_prefill_induced_stalls_at_least_fivefold(unchunked, tmp_path):
    # chunked on for 15 s (~4 aggressors measured; half the off run's 30, for CI's time): measured 0.000 prefill-
    # induced stalls per 1k tokens against the off run's 2.12 (the bound: a fifth of it)
    out = tmp_path / "on"
    res = run_cli("run", "scenarios/aggressor_victim.yaml", "--out", str(out), "--no-progress", "--no-png",
                  "--duration", "15",
                  "--set", "target.simulator.chunked_prefill=true",
                  "--set", "target.simulator.max_num_batched_tokens=256")
    assert res.returncode in (0, 1, 3), res.stderr  # attribution is scored, not the verdict
    off = summary(unchunked)["stalls"]["prefill_induced_per_1k_tokens"]
    on = summary(out)["stalls"]["prefill_induced_per_1k_tokens"]
    print(f"prefill-induced stalls per 1k tokens: chunked off {off:.3f}, on {on:.3f}")
    assert off > 0 and on * 5 <= off
    assert "chunked prefill on" in (out / "summary.md").read_text()  # the report says what the engine did


def test_preemption_stalls_are_not_blamed_on_prefill(preemption_heavy_run):
    out = preemption_heavy_run  # conftest.py: chat.yaml on a 9,000-token KV cache at 8 requests/s, 15 s
    requests = pl.read_parquet(out / "requests.parquet")
    seq_of = dict(zip(requests["request_id"].to_list(), requests["seq"].to_list()))
    preemptions = [(seq_of[rid], e["t_end_ns"]) for e in read_trace(out / "sim_trace.jsonl")
                   if e["type"] == "step" for rid in e["preempted"] if rid in seq_of]
    stalls = pl.read_parquet(out / "stalls.parquet")
    hit = [stalls.filter((pl.col("seq") == seq) & (pl.col("t_start_ns") <= t) & (pl.col("t_end_ns") >= t))
           for seq, t in preemptions]
    preemption_stalls = pl.concat([h for h in hit if h.height]) if any(h.height for h in hit) else stalls.head(0)
    print(f"{len(preemptions)} preemptions, {preemption_stalls.height} stalls, "
          f"{preemption_stalls['prefill_induced'].sum()} blamed on prefill")
    assert preemption_stalls.height >= 10
    assert preemption_stalls["prefill_induced"].sum() <= 0.10 * preemption_stalls.height
