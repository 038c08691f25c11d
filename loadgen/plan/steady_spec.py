"""``load.steady_state``: which requests a run's figures and verdict are taken over (analysis/steady.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

SteadyState = Literal["detect", "declared"]


def steady_state_field() -> Any:
    """The field of ``Load`` (kept here: scenario.py is at its size limit)."""
    return Field("detect", description="the requests every figure and the verdict are taken over. detect: after "
                 "the declared warm-up, the warm-up and drain transients found by MSER-5 on the requests' "
                 "end-to-end latencies are cut too (summary.json's steady_state says where and how many; shaded on "
                 "the report's timelines; docs/verdicts.md, Steady state); declared: every request after "
                 "load.warmup_s, nothing detected")
