"""``load.until: decided`` while the run goes (plan/until_spec.py has the fields and their rule).

The runner's tick asks ``due``; when due, ``check`` (on a worker thread, between two flushes: the record parts
are not merged under it) flushes the records, reads every record taken so far and summarises them as the end of
the run will (analysis/summary.py, the same objectives and intervals), and the run is decided when every
objective is PASS or FAIL. The first check is at ``warmup_s + duration_s`` (the least the run lasts), then at
gaps doubling from ``FIRST_GAP_S`` to at most ``MAX_GAP_S``, and never closer than ``COST_FACTOR`` times the last
check's own time, so the analysis costs at most about a tenth of one core however long the run goes. Decided,
the engine stops sending and what is in flight may end, within ``drain_timeout_s`` (``stop(drain=True)``).
"""

from __future__ import annotations

import math
import time
from typing import Any

from loadgen.analysis.summary import summarize
from loadgen.errors import ScenarioError
from loadgen.plan.scenario import Scenario
from loadgen.run.session import RunSession

FIRST_GAP_S = 5.0
MAX_GAP_S = 60.0
COST_FACTOR = 10.0


def refuse_engine(scenario: Scenario, engine: str) -> None:
    """Only the asyncio engine runs ``until: decided``: one line (exit 2) before anything starts."""
    if scenario.load.until == "decided":
        raise ScenarioError(f"load.until: decided runs on the asyncio engine (not {engine}): drop --engine "
                            f"{engine}, or set load.until: duration")


class DecidedWatch:
    """When to check, and whether the objectives are decided (see the module's docstring)."""

    def __init__(self, scenario: Scenario, session: RunSession) -> None:
        self.scenario, self.session = scenario, session
        load = scenario.load
        self.next_s = load.warmup_s + (load.duration_s or 0.0)  # seconds since the engine's t0
        self.gap_s = FIRST_GAP_S
        self.checks = 0
        self.check_s = 0.0  # the analysis time, all checks together
        self.ended_at_s: float | None = None
        self.undecided: list[str] = []

    def due(self, elapsed_s: float) -> bool:
        return self.ended_at_s is None and elapsed_s >= self.next_s

    def check(self, elapsed_s: float) -> bool:
        """Flush, summarise the records so far; True when every objective is decided (then ``ended_at_s``)."""
        started = time.monotonic()
        if self.session.flush():
            return False  # the disk is full: the session stops the run
        requests, chunks = self.session.sink.frames()
        summary, _ = summarize(self.scenario, requests, chunks, None, ledger=False)
        spent = time.monotonic() - started
        self.checks += 1
        self.check_s += spent
        self.undecided = [o["objective"] for o in summary["slo"] if o.get("decision") not in ("pass", "fail")]
        if not self.undecided and summary["requests"]["completed"] > 0:
            self.ended_at_s = elapsed_s
            return True
        self.next_s = elapsed_s + max(self.gap_s, COST_FACTOR * spent)
        self.gap_s = min(2 * self.gap_s, MAX_GAP_S)
        return False

    def stop(self, engine: Any) -> None:
        """The engine stops sending; what is in flight ends by itself, by ``drain_timeout_s`` at the latest."""
        drain_end_ns = time.monotonic_ns() + int(self.scenario.load.drain_timeout_s * 1e9)
        engine.hard_end_ns = min(engine.hard_end_ns or math.inf, drain_end_ns)
        engine.stop(drain=True)

    def info(self, finished: bool, interrupted: bool) -> dict[str, Any]:
        """run.json's keys: ``ended`` ("decided" when every objective was; "max_duration" when the run reached
        its maximum undecided; None while it goes or when it was interrupted), when, and the checks' count and
        cost."""
        ended = "decided" if self.ended_at_s is not None else "max_duration" if finished and not interrupted \
            else None
        return {"ended": ended,
                "decided_at_s": None if self.ended_at_s is None else round(self.ended_at_s, 3),
                "until_checks": self.checks, "until_check_s": round(self.check_s, 3),
                "undecided": self.undecided}
