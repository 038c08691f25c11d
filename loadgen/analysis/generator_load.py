"""Whether loadgen's own sending processes could keep up: the CPU-saturation rule beside the generator-lag rule
(analysis/slo.py). A sending process whose CPU over the run reached ``max_cpu`` of one core (summary.json's
``generator``: ``per_process`` under ``--workers N``, else the one process's ``cpu_utilization``) may have
stamped late and sent late: its latencies include its own queueing, so the verdict is INCONCLUSIVE, naming the
process (docs/verdicts.md). Pure: reads the generator figures only."""

from __future__ import annotations

from typing import Any

MAX_CPU_UTILIZATION = 0.95  # of one core: the default of the rule's limit


def saturated_processes(generator: dict[str, Any] | None, max_cpu: float = MAX_CPU_UTILIZATION) -> list[str]:
    """One reason per sending process at or above ``max_cpu`` of a core (none: the rule holds)."""
    generator = generator or {}
    rows = generator.get("per_process")
    if not rows and generator.get("cpu_utilization") is not None:
        rows = [{"process": None, "cpu_utilization": generator["cpu_utilization"]}]
    reasons = []
    for row in rows or []:
        used = row.get("cpu_utilization")
        if used is not None and used >= max_cpu:
            who = "loadgen's sending process" if row.get("process") is None else \
                f"sending process {row['process']}" + (f" (pid {row['pid']})" if row.get("pid") else "")
            reasons.append(f"the generator was CPU-bound: {who} used {used:.2f} of a core (limit {max_cpu:g}, "
                           "slo.max_generator_cpu): its timings include its own queueing; use more --workers, "
                           "or lower the load")
    return reasons
