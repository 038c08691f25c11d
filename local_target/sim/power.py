"""``GET /gpu/metrics``: a synthetic DCGM exporter, so that a test of energy per token has a truth.

The model: ``GPUS`` GPUs, each drawing ``IDLE_W`` all the time, plus ``J_PER_TOKEN`` joules per token an engine
step computes (prefill and decode alike), credited when the step ends. Exposed as the DCGM exporter does
(github.com/NVIDIA/dcgm-exporter, default-counters.csv): ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (counter, mJ
since the simulator started) and ``DCGM_FI_DEV_POWER_USAGE`` (gauge, W: the mean over the last
``GAUGE_WINDOW_NS``), one sample per GPU, the step energy shared equally. The truth over [t0, t1] is
``GPUS × IDLE_W × (t1 − t0) + J_PER_TOKEN × tokens of the steps that ended in it`` (sim_trace.jsonl's steps).
"""

from __future__ import annotations

import time
from collections import deque

GPUS = 2
IDLE_W = 60.0  # per GPU
J_PER_TOKEN = 0.004  # all GPUs together
GAUGE_WINDOW_NS = 250_000_000


class GpuPower:
    def __init__(self, clock_ns: int | None = None) -> None:
        self.t0_ns = time.monotonic_ns() if clock_ns is None else clock_ns
        self.active_j = 0.0  # every step's energy above idle, so far
        self.recent: deque[tuple[int, float]] = deque()  # (step end, its energy): the gauge's window

    def step(self, tokens: int, t_end_ns: int) -> None:
        joules = J_PER_TOKEN * tokens
        self.active_j += joules
        self.recent.append((t_end_ns, joules))
        while self.recent and self.recent[0][0] < t_end_ns - 4 * GAUGE_WINDOW_NS:
            self.recent.popleft()

    def energy_j(self, now_ns: int) -> float:
        return GPUS * IDLE_W * (now_ns - self.t0_ns) / 1e9 + self.active_j

    def power_w(self, now_ns: int) -> float:
        since = now_ns - GAUGE_WINDOW_NS
        active = sum(j for t, j in list(self.recent) if t > since)
        return GPUS * IDLE_W + active / (GAUGE_WINDOW_NS / 1e9)

    def render(self, now_ns: int | None = None) -> bytes:
        """The exposition, in the DCGM exporter's names, labels and units (mJ, W)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        energy_mj, power = self.energy_j(now) * 1e3 / GPUS, self.power_w(now) / GPUS
        lines = ["# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).", "# TYPE DCGM_FI_DEV_POWER_USAGE gauge"]
        lines += [f'DCGM_FI_DEV_POWER_USAGE{{gpu="{i}",UUID="GPU-sim-{i}",device="nvidia{i}",'
                  f'modelName="loadgen-sim"}} {power:.3f}' for i in range(GPUS)]
        lines += ["# HELP DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION Total energy consumption since boot (in mJ).",
                  "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter"]
        lines += [f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="{i}",UUID="GPU-sim-{i}",device="nvidia{i}",'
                  f'modelName="loadgen-sim"}} {energy_mj:.0f}' for i in range(GPUS)]
        return ("\n".join(lines) + "\n").encode()
