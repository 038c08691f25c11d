"""One process's share of a plan (Locust: the single process, or one worker of N), as pure arithmetic: which
arrivals are its own, when it must stop sending, and when it stops waiting. The clock is the caller's
(``now_ns``: monotonic), so the rules are tested without one.

Open loop: arrival ``i`` (a request, or a conversation's turns together) belongs to the process with
``i % workers == index``; a closed loop's process takes arrivals ``index, index + workers, …`` as its users
become free. Deadlines (plan/deadlines.py), from the slice's ``t0``: sending ends at warm-up + duration (closed
loop) or the last planned send (open loop); the hard end cancels what is in flight; the give-up point (the hard
end and the grace) is where the process stops waiting for anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.plan.deadlines import give_up_s
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import Plan


@dataclass
class PlanSlice:
    plan: Plan
    scenario: Scenario
    index: int = 0
    workers: int = 1
    t0_ns: int | None = None  # monotonic: the plan's start in this process; None until the slice is given
    next_position: int = 0  # how many of the slice's arrivals were taken

    def start(self, index: int, workers: int, t0_ns: int) -> None:
        self.index, self.workers, self.t0_ns, self.next_position = index, workers, t0_ns, 0

    def reset(self) -> None:
        self.t0_ns, self.next_position = None, 0

    def take_position(self) -> int:
        """The next arrival index of this slice (``index, index + workers, …``), claimed."""
        position = self.index + self.next_position * self.workers
        self.next_position += 1
        return position

    def _at(self, offset_s: float | None) -> int | None:
        if offset_s is None or self.t0_ns is None:
            return None
        return self.t0_ns + int(offset_s * 1e9)

    def hard_end_ns(self) -> int | None:
        """When what is still in flight is cancelled (None: a closed loop bounded by its count only)."""
        return self._at(self.plan.hard_end_s(self.scenario.load.drain_timeout_s))

    def give_up_ns(self) -> int | None:
        """When this process stops waiting for anything of its slice (None: no slice yet)."""
        return self._at(give_up_s(self.plan, self.scenario))

    def sending_over(self, now_ns: int) -> bool:
        """A closed loop's sending time (warm-up + duration) is over: no new arrival leaves."""
        load = self.scenario.load
        if not self.plan.closed_loop or load.duration_s is None:
            return False
        end = self._at(load.warmup_s + load.duration_s)
        return end is not None and now_ns >= end

    def turn_too_late(self, t_ns: int) -> bool:
        """Whether a conversation's turn due at ``t_ns`` comes after the run stops sending it (closed loop: the
        end of the duration; open loop: the hard end)."""
        if self.plan.closed_loop:
            return self.sending_over(t_ns)
        end = self.hard_end_ns()
        return end is not None and t_ns >= end

    def past_give_up(self, now_ns: int) -> bool:
        end = self.give_up_ns()
        return end is not None and now_ns >= end
