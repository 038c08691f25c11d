"""Every wait of a Locust run has a deadline, derived from the run's stated bound (pure: no locust or gevent,
so a test can compute the bound it asserts without monkey-patching itself).

The stated bound of a run, from the plan's first send ``t0``:
- ``hard_end_s``: the plan's hard end (the last send plus ``load.drain_timeout_s``; a closed loop bounded by its
  request count only: its rounds, each bounded by ``target.request_timeout_s``, and its rate ceiling). Each
  process's engine thread cancels what is still in flight then (recorded ``cancelled``);
- ``WORKER_GRACE_S`` on top: the time a process has to hand its last records over (a worker: to the master).
  Past it a process stops waiting for whatever did not end: a user's answer, a worker's ``done``, a process
  that does not say it is done is *left* (its records up to then are kept; the run is cut short, as a run whose
  requests the hard end cut: a would-be pass becomes inconclusive, exit 3);
- ``SHUTDOWN_S`` for each step of the shutdown that waits on something else (``SHUTDOWN_STEPS``: the Locust
  runner's quit, the scraper, the engine thread, the worker processes' exit and then their SIGTERM, the
  embedded simulator); a worker that outlives them all is SIGKILLed.

Before ``t0``: the master waits at most ``WORKER_CONNECT_TIMEOUT_S`` for its workers to connect, and a worker
that is never given its slice gives up after ``ORPHAN_S``.
"""

from __future__ import annotations

import math

from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import Plan

START_LEAD_S = 1.0  # the plan's t0 is this far after the slices are sent
WORKER_GRACE_S = 15.0  # after the plan's hard end, a process waits this long for the last records
WORKER_CONNECT_TIMEOUT_S = 60.0
SHUTDOWN_S = 10.0  # a runner's quit, then a worker process's exit after SIGTERM (then SIGKILL)
ORPHAN_S = 2 * WORKER_CONNECT_TIMEOUT_S  # a worker never given its slice (its master gone) gives up
SHUTDOWN_STEPS = 6


def hard_end_s(plan: Plan, scenario: Scenario) -> float:
    """Seconds from ``t0`` to the plan's hard end; finite for every plan (see the module's docstring)."""
    end_s = plan.hard_end_s(scenario.load.drain_timeout_s)
    if end_s is not None:
        return end_s
    load, size = scenario.load, plan.size or 0
    users = max(1, load.concurrency or load.max_in_flight)
    rounds_s = math.ceil(size / users) * scenario.target.request_timeout_s
    ceiling_s = size / load.max_rate_per_s if load.max_rate_per_s else 0.0
    return load.warmup_s + rounds_s + ceiling_s + load.drain_timeout_s


def give_up_s(plan: Plan, scenario: Scenario) -> float:
    """Seconds from ``t0`` after which a process stops waiting for the plan: its hard end and the grace."""
    return hard_end_s(plan, scenario) + WORKER_GRACE_S


def run_bound_s(plan: Plan, scenario: Scenario) -> float:
    """Seconds from the slices' sending by which a Locust run has stopped sending, waiting and shutting down
    (run.json says ``finished``), whatever its workers do (stall, die, never answer): the start's lead, the
    give-up point, then each step of the shutdown."""
    return START_LEAD_S + give_up_s(plan, scenario) + SHUTDOWN_STEPS * SHUTDOWN_S
