"""A slow client on purpose: ``target.simulator.faults.client_block_ms`` every ``client_block_every_s``.

loadgen keeps its own event loop busy (a busy-wait on the loop's thread: a CPU hog in loadgen's process) for
``client_block_ms``, first ``client_block_every_s`` after sending starts and then at that period, until the run
ends. Tokens the server writes meanwhile are read only when the block ends, and sends due meanwhile go late:
the SLO-miss ledger's ``client_lag`` (docs/causes.md), produced on purpose so a user can check it on their own
machine. Each block's real window (``time.monotonic_ns()``, the clock of the simulator's trace) is appended to
the embedded simulator's trace once it has stopped, as ``{"type": "client_block", "t_start_ns", "t_end_ns"}``
(the ground truth ``local_target.sim.truth_causes`` takes as ``hogs_ns``), and noted in run.json.

Only with the embedded simulator and the asyncio engine (``refuse_client_blocks``): against a URL it would only
spoil the measurement of a real server, and Locust's users do not run on this loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from loadgen.errors import ScenarioError
from loadgen.plan.scenario import Scenario


def refuse_client_blocks(scenario: Scenario, engine: str) -> None:
    """ScenarioError (one line, exit 2, before anything starts) when the scenario's client blocks cannot run:
    a target other than the embedded simulator, or an engine other than asyncio."""
    spec = scenario.target.simulator
    why = spec.client_blocks_refusal(scenario.target.embedded)
    if why is None and engine != "asyncio" and spec.faults is not None and spec.faults.client_blocks:
        why = (f"target.simulator.faults.client_block_ms blocks the asyncio engine's loop (not {engine}'s): "
               f"drop --engine {engine}, or the fault")
    if why is not None:
        raise ScenarioError(why)


@dataclass
class ClientBlocks:
    """The blocks of one run: scheduled on its loop while ``running``; ``windows_ns`` as they really were."""

    block_ms: float
    every_s: float
    windows_ns: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def of(cls, scenario: Scenario) -> ClientBlocks | None:
        faults = scenario.target.simulator.faults
        blocks = faults.client_blocks if faults is not None else None
        return cls(*blocks) if blocks is not None else None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Blocks at every_s, 2 × every_s, … from now (loop time: no drift) until the ``with`` ends."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        handle: list[asyncio.TimerHandle] = []

        def block(k: int) -> None:
            self.block_now()
            handle[0] = loop.call_at(start + (k + 1) * self.every_s, block, k + 1)

        handle.append(loop.call_at(start + self.every_s, block, 1))
        try:
            yield
        finally:
            handle[0].cancel()

    def block_now(self) -> None:
        """Busy-wait block_ms on this thread; its window is kept."""
        t0 = time.monotonic_ns()
        end = t0 + int(self.block_ms * 1e6)
        while time.monotonic_ns() < end:
            pass
        self.windows_ns.append((t0, time.monotonic_ns()))

    def note(self) -> str:
        took = ", ".join(f"{(b - a) / 1e6:.0f}" for a, b in self.windows_ns)
        return (f"loadgen blocked its own event loop {len(self.windows_ns)} time(s) on purpose "
                f"(target.simulator.faults.client_block_ms {self.block_ms:g} every {self.every_s:g} s; ms: "
                f"{took or 'none'}): misses in flight across a block are the client's (client_lag)")

    def add_to_trace(self, trace_path: Path | None) -> None:
        """Append each window to the simulator's trace (after it stopped: the file is closed, and complete)."""
        if trace_path is None or not self.windows_ns or not trace_path.exists():
            return
        with open(trace_path, "a", encoding="utf-8") as fh:
            for a, b in self.windows_ns:
                fh.write(json.dumps({"type": "client_block", "t_start_ns": a, "t_end_ns": b},
                                    separators=(",", ":")) + "\n")


@contextlib.contextmanager
def client_blocks(blocks: ClientBlocks | None, notes: list[str]) -> Iterator[None]:
    """``blocks`` on the running loop while the ``with`` runs (none: nothing), then their note in ``notes``."""
    if blocks is None:
        yield
        return
    try:
        with blocks.running():
            yield
    finally:
        notes.append(blocks.note())


def trace_windows(trace_events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The client blocks' windows in a trace read back (``local_target.sim.read_trace``), in time order."""
    return sorted((int(e["t_start_ns"]), int(e["t_end_ns"])) for e in trace_events if e.get("type") == "client_block")
