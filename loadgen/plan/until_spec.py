"""``load.until`` and ``load.max_duration_s``: a run that goes on until its verdict is decided (run/until.py).

With ``until: decided`` the run lasts at least ``duration_s`` (measured, after the warm-up), then until every
objective is decided (its interval wholly on one side of its limit: docs/verdicts.md), at most ``max_duration_s``.
The plan is made for the maximum (``horizon``); a run that ends because it decided stops sending and lets what is
in flight end (within ``drain_timeout_s``): a normal end, recorded in run.json as ``ended: "decided"``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

Until = Literal["duration", "decided"]
OPEN_OR_CLOSED = ("constant", "poisson", "gamma", "concurrency")  # arrivals whose plan can be stretched


def until_field() -> Any:
    """``Load.until`` (kept here: scenario.py is at its size limit)."""
    return Field("duration", description="duration: the run lasts load.duration_s (or load.requests); decided: "
                 "at least load.duration_s, then until every objective is decided (PASS or FAIL by its "
                 "interval), at most load.max_duration_s; checked on the records flushed so far, first at "
                 "duration_s, then at gaps doubling from 5 s (at most 60 s, and at least 10x the last check's "
                 "analysis time); constant, poisson, gamma and concurrency arrivals, asyncio engine")


def max_duration_field() -> Any:
    return Field(None, gt=0, le=7 * 24 * 3600.0, description="seconds of measured load after the warm-up at "
                 "most, with until: decided (required with it): the plan is made for this long")


class UntilRule(BaseModel):
    """The rule that ties ``until`` to ``max_duration_s`` (a base of ``Load``: its validator runs with Load's)."""

    @model_validator(mode="after")
    def _until_rule(self) -> Any:
        check_until(self)
        return self


def check_until(load: Any) -> None:
    """ValueError naming what is wrong with ``load.until`` / ``load.max_duration_s``."""
    until, top = getattr(load, "until", "duration"), getattr(load, "max_duration_s", None)
    if until != "decided":
        if top is not None:
            raise ValueError("load.max_duration_s caps a run with load.until: decided")
        return
    if top is None:
        raise ValueError("load.until: decided needs load.max_duration_s (the hard maximum)")
    if load.arrival not in OPEN_OR_CLOSED:
        raise ValueError(f"load.until: decided needs arrival constant, poisson, gamma or concurrency (not "
                         f"{load.arrival}: its plan has its own length)")
    if load.requests is not None:
        raise ValueError("load.until: decided is bounded by load.max_duration_s, not load.requests")
    if load.duration_s is not None and load.duration_s > top:
        raise ValueError(f"load.duration_s ({load.duration_s:g}) is the least a run with until: decided lasts: "
                         f"it cannot exceed load.max_duration_s ({top:g})")
    if load.duration_s is None:
        return
    try:  # the plan is made for the maximum: that load must hold too (its plan's size above all)
        type(load).model_validate({**load.model_dump(), "duration_s": top, "until": "duration",
                                   "max_duration_s": None})
    except ValueError as exc:
        errors = getattr(exc, "errors", lambda: [{"msg": str(exc)}])()
        raise ValueError(f"at load.max_duration_s: {errors[0]['msg'].removeprefix('Value error, ')}") from None


def horizon(scenario: Any) -> Any:
    """The scenario the plan and the engine are made for: with until: decided, lasting load.max_duration_s."""
    load = scenario.load
    if load.until != "decided":
        return scenario
    return scenario.model_copy(update={"load": load.model_copy(update={"duration_s": load.max_duration_s})})
