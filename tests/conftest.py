from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from local_target.sim import SimProcess, build_config, start_simulator
from tests.misbehaving_server import MisbehavingServer


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

    path = tmp_path / "fault.yaml"
    path.write_text(SCENARIO)
    return path
