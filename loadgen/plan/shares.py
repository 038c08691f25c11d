"""One plan split between N sending processes on one machine (``loadgen run --workers N``, the asyncio engine).
Pure: every process builds the same seeded plan and takes its share of it, so the shares together are the plan.

- Open loop: arrival ``i`` (a request, or a conversation's or session's requests together) is process
  ``i % N``'s; each keeps the plan's instants (``t_intended_offset_ns`` from one shared start), so the merged
  records are the single-process plan's, sent from N processes.
- Closed loop: the concurrency is split (``concurrency_share``: the first ``concurrency % N`` processes get one
  user more); process ``k`` takes arrivals ``k, k + N, …`` (``WorkerPlan.unit``) and numbers its requests
  ``k, k + N, …`` (``strided_seqs``), so ``seq`` stays unique across processes and a request count
  (``load.requests``) is honoured in total: seqs ``0 … requests − 1`` are each sent once, by their process.
  A closed loop never runs on more processes than it has users (``processes_for``): a process without a user
  would never send its share.
- ``max_in_flight`` and ``max_rate_per_s`` are split as the concurrency is (the rate evenly).
"""

from __future__ import annotations

import itertools
import os
from typing import Iterator

from loadgen.plan.scenario import Scenario, ScenarioError
from loadgen.plan.schedule import Plan, PlannedRequest


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity): ``--workers auto``."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def process_count(workers: int | str) -> int:
    """``--workers N|auto`` as a number of sending processes: ``auto`` one per usable core; 0 (its old meaning
    under Locust: one process) is 1. ScenarioError (exit 2) for anything else."""
    if workers == "auto":
        return usable_cores()
    try:
        n = int(workers)
    except (TypeError, ValueError):
        raise ScenarioError(f"--workers {workers!r}: give a number of processes or auto") from None
    if n < 0 or str(n) != str(workers).strip():
        raise ScenarioError(f"--workers {workers!r}: give a number of processes (1, 2, …) or auto")
    return max(1, n)


def unit_key(req: PlannedRequest) -> int:
    """The arrival a planned request belongs to: its session's, its conversation's, or its own (``seq``)."""
    if req.session is not None:
        return req.session
    if req.conversation is not None:
        return req.conversation
    return req.seq


def share_of(requests: list[PlannedRequest], index: int, workers: int) -> list[PlannedRequest]:
    """Process ``index``'s requests of an open-loop plan: whole arrivals, dealt round-robin, in plan order."""
    return [r for r in requests if unit_key(r) % workers == index]


def split_count(total: int, index: int, workers: int) -> int:
    """``total`` (users, in-flight slots) dealt over ``workers``: the first ``total % workers`` get one more."""
    return total // workers + (1 if index < total % workers else 0)


def processes_for(scenario: Scenario, workers: int) -> int:
    """The processes a run uses: ``workers``, but a closed loop no more than its users."""
    load = scenario.load
    if load.arrival == "concurrency" and load.concurrency:
        return max(1, min(workers, load.concurrency))
    return max(1, workers)


def strided_seqs(index: int, workers: int) -> Iterator[int]:
    """A closed loop's request numbers in process ``index``: ``index, index + workers, …``."""
    return itertools.count(index, workers)


def share_scenario(scenario: Scenario, index: int, workers: int) -> Scenario:
    """The scenario as process ``index`` runs it: its users, in-flight slots and rate ceiling (the plan is built
    from the whole scenario, never from this one)."""
    load = scenario.load
    update: dict[str, object] = {"max_in_flight": max(1, split_count(load.max_in_flight, index, workers))}
    if load.concurrency:
        update["concurrency"] = split_count(load.concurrency, index, workers)
    if load.max_rate_per_s is not None:
        update["max_rate_per_s"] = load.max_rate_per_s / workers
    return scenario.model_copy(update={"load": load.model_copy(update=update)})


class WorkerPlan(Plan):
    """Process ``index`` of ``workers``'s view of ``whole`` (built once, never again): its open-loop requests,
    its closed-loop arrivals; the hard end and the request count are the whole plan's."""

    def __init__(self, whole: Plan, index: int, workers: int) -> None:  # a view: Plan.__init__ is not run again
        self.__dict__.update(whole.__dict__)
        self.whole, self.index, self.workers = whole, index, workers
        if whole.requests is not None:
            self.requests = share_of(whole.requests, index, workers)

    @property
    def size(self) -> int | None:
        """Open loop: this share's requests. Closed loop: the whole plan's count (the engine's seqs are strided)."""
        if self.requests is not None:
            return len(self.requests)
        return self.whole.size

    def request(self, seq: int) -> PlannedRequest:
        return self.whole.request(seq)  # ``seq``: the whole plan's

    def unit(self, index: int) -> list[PlannedRequest]:
        """A closed loop's ``index``-th arrival of this process: the whole plan's ``self.index + index × N``."""
        if self.closed_loop:
            return self.whole.unit(self.index + index * self.workers)
        return self.whole.unit(index)

    def hard_end_s(self, drain_timeout_s: float) -> float | None:
        return self.whole.hard_end_s(drain_timeout_s)  # one hard end for every process
