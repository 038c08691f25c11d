from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from local_target.sim import SimProcess, build_config, start_simulator


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
