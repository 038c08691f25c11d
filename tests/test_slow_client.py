"""The slow-client mode (``target.simulator.faults.client_block_ms`` every ``client_block_every_s``,
loadgen/run/client_faults.py): a user produces the SLO-miss ledger's ``client_lag`` on purpose. Its bounds and
where it may run are checked when the scenario is read or the run starts (one line, exit 2); unset, it changes
nothing. One short real-time run on the embedded simulator blocks loadgen's loop twice: each block is a
``client_block`` line of the trace, and the misses of the requests in flight across a block are client_lag in
the ledger (misses.parquet) and in the truth (``truth_causes`` with the trace's windows)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

from loadgen import api
from loadgen.cli.app import app
from loadgen.errors import ScenarioError
from loadgen.run.client_faults import ClientBlocks, client_blocks, refuse_client_blocks, trace_windows
from tests.conftest import scenario_file

BASE = """\
name: slow_client
target: {base_url: embedded, simulator: {faults: {client_block_ms: 400, client_block_every_s: 2}}}
load: {arrival: poisson, rate_per_s: 2, duration_s: 2}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 10}, output_tokens: {dist: fixed, value: 5}}]
"""
FAULTS = "target.simulator.faults."


def _load(tmp_path: Path, *sets: str) -> api.Scenario:
    return api.load_scenario(scenario_file(tmp_path, BASE), list(sets))


@pytest.mark.parametrize(("sets", "says"), [
    ((f"{FAULTS}client_block_every_s=0.4",), "client_block_every_s (0.4 s) must be longer than client_block_ms"),
    ((f"{FAULTS}client_block_every_s=0",), "client_block_ms needs client_block_every_s"),
    ((f"{FAULTS}client_block_ms=0",), "client_block_every_s needs client_block_ms"),
    ((f"{FAULTS}client_block_ms=-5",), "client_block_ms: Input should be greater than or equal to 0"),
])
def test_bad_client_blocks_are_one_line_naming_the_field(tmp_path: Path, sets: tuple[str, ...], says: str) -> None:
    with pytest.raises(ScenarioError) as err:
        _load(tmp_path, *sets)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_validate_exits_2_on_a_bad_value(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, BASE)
    bad = CliRunner().invoke(app, ["validate", str(path), "--set", f"{FAULTS}client_block_every_s=0.1"])
    assert bad.exit_code == 2 and "must be longer than client_block_ms" in bad.output
    assert CliRunner().invoke(app, ["validate", str(path)]).exit_code == 0


def test_a_target_other_than_the_embedded_simulator_is_refused_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="a slow client is a fault of the embedded simulator's runs"):
        _load(tmp_path, "target.base_url=http://127.0.0.1:9/v1")  # refused as the scenario loads
    bad = CliRunner().invoke(app, ["validate", str(scenario_file(tmp_path, BASE, "url.yaml")), "--set", "target.base_url=http://127.0.0.1:9/v1"])
    assert bad.exit_code == 2 and "embedded" in " ".join(bad.output.split())
    with pytest.raises(ScenarioError, match="not locust's"):
        refuse_client_blocks(_load(tmp_path), "locust")
    refuse_client_blocks(_load(tmp_path), "asyncio")  # the embedded simulator on the asyncio engine: allowed


def test_unset_it_changes_nothing_and_the_simulator_never_sees_it(tmp_path: Path) -> None:
    from local_target.sim import build_config

    plain = _load(tmp_path, f"{FAULTS}client_block_ms=0", f"{FAULTS}client_block_every_s=0")
    assert ClientBlocks.of(plain) is None and plain.target.simulator.overrides() == {}
    notes: list[str] = []

    async def drive() -> int:
        before = len(asyncio.get_running_loop()._scheduled)  # type: ignore[attr-defined]
        with client_blocks(ClientBlocks.of(plain), notes):
            return len(asyncio.get_running_loop()._scheduled) - before  # type: ignore[attr-defined]
    assert asyncio.run(drive()) == 0 and notes == []  # nothing scheduled, no note
    refuse_client_blocks(_load(tmp_path, "target.base_url=http://127.0.0.1:9/v1", f"{FAULTS}client_block_ms=0",
                               f"{FAULTS}client_block_every_s=0"), "locust")  # off: any target, any engine
    mixed = _load(tmp_path, f"{FAULTS}error_rate=0.1")
    assert mixed.target.simulator.overrides() == {"faults": {"error_rate": 0.1}}  # only the simulator's own
    assert build_config(overrides=mixed.target.simulator.overrides()).faults.error_rate == 0.1


@pytest.mark.timing  # real busy-waits against the loop's clock: on a quiet machine, in the timing tier
def test_blocks_come_every_period_from_the_start_and_stop_with_the_run(tmp_path: Path) -> None:
    blocks, notes = ClientBlocks(block_ms=30.0, every_s=0.1), list[str]()

    async def drive() -> int:
        with client_blocks(blocks, notes):
            await asyncio.sleep(0.35)  # the run: blocks at 0.1, 0.2, 0.3 s
        t_end = time.monotonic_ns()
        await asyncio.sleep(0.15)  # after the run: no block more
        return t_end
    t0 = time.monotonic_ns()
    t_end = asyncio.run(drive())
    starts_s = [(a - t0) / 1e9 for a, _ in blocks.windows_ns]
    assert len(starts_s) == 3 and all(b <= t_end for _, b in blocks.windows_ns)
    assert all(k * 0.1 <= s < k * 0.1 + 0.08 for k, s in zip((1, 2, 3), starts_s)), starts_s  # on the period
    assert all(30e6 <= b - a < 60e6 for a, b in blocks.windows_ns)
    assert notes and "3 time(s)" in notes[0] and "client_lag" in notes[0]
    trace = tmp_path / "sim_trace.jsonl"
    trace.write_text('{"type":"step"}\n')
    blocks.add_to_trace(trace)
    blocks.add_to_trace(None)  # no trace asked for: nothing written, no error
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert trace_windows(events) == blocks.windows_ns and len(events) == 4


# ---- one real-time run on the embedded simulator --------------------------------------------------------------
RUN = """\
name: slow_client_run
target:
  base_url: embedded
  simulator: {seed: 3, trace: true, faults: {client_block_ms: 400, client_block_every_s: 2}}
seed: 11
load: {arrival: poisson, rate_per_s: 10, duration_s: 4.5, warmup_s: 0.5}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 200}, output_tokens: {dist: fixed, value: 32}}]
slo:
  ttft_ms: {p99: 250}
  itl_ms: {p99: 100}
"""


@pytest.fixture(scope="module")
def slow_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    tmp = tmp_path_factory.mktemp("slow_client")
    t0 = time.monotonic()
    result = api.run(scenario_file(tmp, RUN), out=tmp / "run")
    return Path(str(result.run_dir)), time.monotonic() - t0


def _truth(run_dir: Path, trace: list[dict[str, Any]]) -> dict[int, str]:
    """seq → the true cause of each measured request that missed (truth_causes on the trace's own windows)."""
    from local_target.sim import build_config
    from local_target.sim.costmodel import prefill_alone_ms
    from local_target.sim.truth_causes import true_causes
    from tests.test_miss_truth_realtime import _records_by_id

    spec = api.load_scenario(scenario_file(run_dir.parent, RUN, "again.yaml")).target.simulator
    cfg = build_config(spec.preset_name, overrides=spec.overrides())
    s = json.loads((run_dir / "summary.json").read_text())
    by_id, seq_of = _records_by_id(run_dir, trace)
    truth = true_causes(trace, by_id, s["misses"]["limits"], trace_windows(trace), s["stalls"]["long_prompt_tokens"],
                        s["stalls"]["min_gap_ms"], lambda n: prefill_alone_ms(cfg, n) * cfg.time_scale)
    return {seq_of[rid]: cause for rid, cause in truth.items()}


@pytest.mark.slow
def test_a_slow_client_run_blames_the_client_as_the_trace_does(slow_run: tuple[Path, float]) -> None:
    from local_target.sim import read_trace

    run_dir, wall_s = slow_run
    trace = read_trace(run_dir / "sim_trace.jsonl")
    windows = trace_windows(trace)
    records = pl.read_parquet(run_dir / "requests.parquet").filter(~pl.col("warmup"))
    ledger = dict(pl.read_parquet(run_dir / "misses.parquet").select("seq", "cause").iter_rows())
    truth = _truth(run_dir, trace)
    across = {seq for seq, t_due, t_done in records.select("seq", "t_intended_ns", "t_done_ns").iter_rows()
              if any(t_due < b and t_done > a for a, b in windows)}  # due or in flight during a block
    agree = sum(truth.get(seq) == cause for seq, cause in ledger.items())
    print(f"\nrun {wall_s:.1f} s; blocks (ms) {[(b - a) / 1e6 for a, b in windows]}; {records.height} measured, "
          f"{len(across)} across a block; ledger {len(ledger)} misses {sorted(set(ledger.values()))}, truth "
          f"{len(truth)}, agree {agree}; misses across a block {len(across & ledger.keys())}")
    assert len(windows) == 2 and all(400e6 <= b - a < 600e6 for a, b in windows)
    t_first, t_last = records["t_sent_ns"].min(), records["t_done_ns"].max()
    assert isinstance(t_first, int) and isinstance(t_last, int) and t_first < windows[0][0] < windows[1][1] < t_last
    notes = json.loads((run_dir / "run.json").read_text())["notes"]
    assert any("blocked its own event loop 2 time(s)" in n for n in notes)
    missed_across = across & ledger.keys()
    assert len(missed_across) >= 5  # 8 measured: 400 ms blocks over 100 ms ITL / 250 ms TTFT limits, 10 per s
    assert all(ledger[seq] == "client_lag" == truth.get(seq) for seq in missed_across), \
        {seq: (ledger[seq], truth.get(seq)) for seq in missed_across}
    assert agree >= 0.9 * len(ledger) and len(truth.keys() ^ ledger.keys()) <= 0.1 * len(ledger)
