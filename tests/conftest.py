from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from hypothesis import settings

from local_target.sim import SimProcess, build_config, start_simulator
from tests.misbehaving_server import MisbehavingServer
from tests.shape_server import ShapeServer

# The property tests (every @given test; hypothesis marks them `hypothesis`): about 6 s in all by default, 5 times
# the examples (about 15 s) with HYPOTHESIS_PROFILE=ci (.ci/run: pytest -m hypothesis; 1,000 took 36 s of CI's 45
# minutes). No deadline: the machine is shared, a slow example is no failure; a failure prints the blob that
# reproduces it (@reproduce_failure).
settings.register_profile("default", max_examples=80, deadline=None, print_blob=True)
settings.register_profile("ci", max_examples=400, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[Callable[..., SimProcess]]:
    """Start simulators in child processes (with a trace file); all are stopped after the test."""
    started: list[SimProcess] = []

    def _start(preset: str = "a100-llama-7b", trace: bool = True, **overrides: Any) -> SimProcess:
        cfg = build_config(preset, overrides=overrides)
        trace_path = tmp_path / f"trace-{len(started)}.jsonl" if trace else None
        sim = start_simulator(cfg, trace_path=trace_path)
        started.append(sim)
        return sim

    yield _start
    for sim in started:
        sim.stop()


@pytest.fixture(scope="module")
def server() -> Iterator[MisbehavingServer]:
    """The misbehaving server (tests/misbehaving_server.py): one per test module, every mode by URL."""
    with MisbehavingServer() as srv:
        yield srv


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """The fault tests' scenario (tests/test_faults.py's SCENARIO) as a file."""
    from tests.test_faults import SCENARIO

    return scenario_file(tmp_path, SCENARIO, "fault.yaml")


@pytest.fixture(scope="module")
def shapes() -> Iterator[ShapeServer]:
    """The shape server (tests/shape_server.py): what real servers and gateways send, every shape by URL."""
    with ShapeServer() as srv:
        yield srv


def scenario_file(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    """A scenario's text as a file in the test's directory."""
    path = tmp_path / name
    path.write_text(text)
    return path


# scenarios/agentic.yaml made short (8 s, 4 agents, a server ten times as fast) with the simulator's truth on:
# one run shared by tests/test_agentic_truth.py (timing) and the session lane test in
# tests/test_report_browser.py (browser), which both run in CI's marked tier
AGENTIC_SHORT = ("--set", "load.duration_s=8", "--set", "load.warmup_s=0", "--set", "load.concurrency=4",
                 "--set", "load.steady_state=declared", "--set", "target.simulator.time_scale=0.1",
                 "--set", "target.simulator.trace=true")


@pytest.fixture(scope="session")
def agentic_short_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One short run of scenarios/agentic.yaml: records, sim_trace.jsonl and report.html (no PNGs)."""
    from tests.run_helpers import run_cli

    out = tmp_path_factory.mktemp("agentic") / "run"
    res = run_cli("run", "scenarios/agentic.yaml", "--out", str(out), "--no-progress", "--no-png", *AGENTIC_SHORT)
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr  # seconds decide few objectives: any verdict
    return out


@pytest.fixture(scope="session")
def preemption_heavy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real-time run of scenarios/chat.yaml on a 9,000-token KV cache at 8 requests/s (preemption all the
    way): records, sim_trace.jsonl, server_metrics.parquet and report.html (no PNGs). Shared by
    tests/test_spike_truth.py (timing) and tests/test_server_metrics.py (slow), both in CI's marked tier: one
    15-s run instead of two of 20 (CI's time; 15 s measured 37 preemptions, 19 stalls at them, none blamed on
    prefill: the tests ask for > 10, >= 10 and <= 10 %)."""
    from tests.run_helpers import SIM_TRACE, run_cli

    out = tmp_path_factory.mktemp("kv") / "run"
    res = run_cli("run", "scenarios/chat.yaml", "--out", str(out), "--no-progress", "--no-png", "--duration", "15",
                  "--set", "target.simulator.kv_cache_tokens=9000", "--set", "load.rate_per_s=8", *SIM_TRACE)
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr
    return out


@pytest.fixture(scope="session")
def seeded_reruns(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """scenarios/smoke.yaml's seeded plan three times, 6 s at 8 requests/s: a baseline, an identical rerun, and
    the simulator slowed by 20 %. Shared by tests/test_compare.py (the planted regression, the identical rerun)
    and tests/test_analysis_once.py (base and rerun: read, not summarised again), both in CI's marked tier:
    three runs instead of five (CI's time)."""
    from tests.run_helpers import run_cli

    root = tmp_path_factory.mktemp("reruns")
    short = ["--no-progress", "--no-png", "--set", "load.duration_s=6", "--set", "load.rate_per_s=8",
             "--set", "load.warmup_s=1"]
    out = {}
    for name, scale in (("base", 1.0), ("same", 1.0), ("slow", 1.2)):
        out[name] = root / name
        res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out[name]), *short,
                      "--set", f"target.simulator.time_scale={scale}")
        assert res.returncode in (0, 1, 3), res.stdout + res.stderr  # 3: too few requests to decide an objective
    return out
