"""An hour-long run must cost no more memory than a minute: the run turns automatic garbage collection off (a
full collection stalls every stream), so nothing made per request may sit in a reference cycle, or it stays
until the run ends (bench/soak.py measures the hour; this checks the cause)."""

from __future__ import annotations

import collections
import contextlib
import gc
from pathlib import Path

import pytest

from loadgen import api
from loadgen.drivers import asyncio_engine


@pytest.mark.slow
def test_requests_leave_no_reference_cycles_behind(tmp_path, monkeypatch):
    left: collections.Counter[str] = collections.Counter()

    @contextlib.contextmanager
    def no_gc_then_count():
        gc.collect()
        gc.disable()
        try:
            yield
        finally:
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            left.update(type(o).__name__ for o in gc.garbage)
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
    monkeypatch.setattr(asyncio_engine, "quiet_runtime", no_gc_then_count)
    sc = api.load_scenario(Path("scenarios/smoke.yaml"), overrides={"load.duration_s": 4, "load.rate_per_s": 30,
                                                                    "load.warmup_s": 0})
    result = api.run(sc, out=tmp_path / "run")
    assert result.requests["completed"] >= 60
    # per request there were ~100 unreachable objects (httpx's response <-> stream cycle held the tracker and
    # every chunk record); what remains may not grow with the requests
    assert sum(left.values()) < result.requests["completed"], left.most_common(10)
