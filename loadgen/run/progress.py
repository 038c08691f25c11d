"""The run's progress on stderr (issue 40): a bar by time, not by count, with the ETA to the plan's last send
(closed loop: warm-up + duration) in m:ss, then "draining"; live req/s, output tokens/s and the TTFT median over
the last few seconds; failed and in-flight counts. Where stderr is no terminal (CI logs, pipes, tests) a plain line
with the same figures every ``PLAIN_PERIOD_S`` instead, so a log shows the run moving."""

from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any

from rich.console import Console
from rich.table import Column
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from loadgen.drivers.engine_config import EngineStats

WINDOW_S = 5.0  # the live figures' window
PLAIN_PERIOD_S = 5.0  # a non-terminal's plain line, this often


def bar(enabled: bool) -> Progress:
    """A count bar on stderr (preparing prompts)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=Console(stderr=True), disable=not enabled, transient=False)


def sending_end_s(plan: Any) -> float | None:
    """Seconds after the start at which the plan's last request is sent (None: a closed loop bounded by count)."""
    if plan.offsets_s is not None:
        return plan.offsets_s[-1] if plan.offsets_s else 0.0
    load = plan.scenario.load
    return load.warmup_s + load.duration_s if load.duration_s is not None else None


def clock(seconds: float) -> str:
    """m:ss (h:mm:ss from an hour)."""
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Live:
    """The live figures over the last ``WINDOW_S``: kept from the engine's running counts at each update."""

    def __init__(self) -> None:
        self.marks: deque[tuple[int, int, int]] = deque()  # (t_ns, completed, output tokens)

    def figures(self, st: EngineStats, now_ns: int) -> dict[str, float | None]:
        self.marks.append((now_ns, st.completed, st.output_tokens))
        while len(self.marks) > 2 and now_ns - self.marks[1][0] >= WINDOW_S * 1e9:
            self.marks.popleft()
        t0, done0, tokens0 = self.marks[0]
        span_s = (now_ns - t0) / 1e9
        recent = [ttft for t, ttft in st.recent_ttft_ms if now_ns - t <= WINDOW_S * 1e9]
        return {"req_per_s": (st.completed - done0) / span_s if span_s > 0 else None,
                "out_tok_per_s": (st.output_tokens - tokens0) / span_s if span_s > 0 else None,
                "ttft_p50_ms": statistics.median(recent) if recent else None}


def eta_words(elapsed_s: float, end_s: float | None, st: EngineStats, rate: float | None, size: int | None) -> str:
    """'ETA 0:12' to the last send, 'draining' after it; a count-bounded plan's from the completion rate."""
    if end_s is not None:
        return f"ETA {clock(end_s - elapsed_s)}" if elapsed_s < end_s else "ETA 0:00 (draining)"
    done = st.completed + st.failed + st.cancelled
    if size and rate:
        return f"ETA {clock((size - done) / rate)}"
    return "ETA ?"


def figures_words(live: dict[str, float | None], st: EngineStats) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)
    return (f"{num(live['req_per_s'], '.1f')} req/s · out {num(live['out_tok_per_s'], ',.0f')} tok/s · "
            f"TTFT p50 {num(live['ttft_p50_ms'], ',.0f')} ms · failed {st.failed} · in flight {len(st.in_flight)}")


class RunProgress:
    """The running phase's progress: ``update`` at each tick of the runner; a context manager."""

    def __init__(self, plan: Any, enabled: bool, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.end_s, self.size = sending_end_s(plan), plan.size
        self.enabled, self.live = enabled, Live()
        self.plain = enabled and not self.console.is_terminal
        self.progress = Progress(TextColumn("running"), BarColumn(bar_width=24), TimeElapsedColumn(),
                                 TextColumn("{task.description}", table_column=Column(ratio=1, overflow="fold")),
                                 console=self.console, disable=not enabled or self.plain, transient=False)
        self.task: TaskID | None = None
        self.printed_at_s = -PLAIN_PERIOD_S  # the first line at the start: the plan's ETA in the log at once

    def __enter__(self) -> RunProgress:
        self.progress.__enter__()
        total = self.end_s if self.end_s else self.size
        self.task = self.progress.add_task("", total=total or None)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.progress.__exit__(*exc)

    def line(self, st: EngineStats, now_ns: int) -> str:
        elapsed_s = (now_ns - st.t0_ns) / 1e9 if st.t0_ns else 0.0
        live = self.live.figures(st, now_ns)
        return f"{eta_words(elapsed_s, self.end_s, st, live['req_per_s'], self.size)} · {figures_words(live, st)}"

    def update(self, st: EngineStats, now_ns: int | None = None) -> None:
        if not self.enabled:
            return
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        text = self.line(st, now_ns)
        elapsed_s = max(0.0, (now_ns - st.t0_ns) / 1e9) if st.t0_ns else 0.0
        if self.plain:
            if elapsed_s - self.printed_at_s >= PLAIN_PERIOD_S:
                self.printed_at_s = elapsed_s
                self.console.print(f"running {clock(elapsed_s)} · {text}", highlight=False, markup=False,
                                   soft_wrap=True)
            return
        done = elapsed_s if self.end_s else st.completed + st.failed + st.cancelled
        assert self.task is not None
        self.progress.update(self.task, completed=done, description=text)  # wraps below 80 columns, never cut
