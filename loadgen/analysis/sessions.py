"""Agentic sessions' figures (issue 38) from the records: one row per session (→ ``sessions.parquet``), one per
agent step (→ ``session_steps.parquet``), and the run's job-level figures (summary.json ``sessions``).

A session's call records carry ``session``, ``call``, ``agent``, ``step``, ``after_call`` (the parent whose end
released it, the last to end; null for a root), ``t_ready_ns`` (that end) and ``wait_ns`` (the tool wait or
think time after it): ``t_intended_ns = t_ready_ns + wait_ns``.

- ``session_ms`` = the last call's ``t_done`` − the first root call's ``t_intended``. Following ``after_call``
  back from the last call to end gives the critical path; along it the session's time is the sum of each call's
  ``t_done − t_intended`` and each non-root call's wait (``critical_path``).
- ``agent_step_ms`` = a step's intended send → its result usable: its ``t_done``, or for a step that spawned
  sub-agents (a call of another agent was released by it), the ``t_ready`` of its agent's next step (the join,
  ready when the last sub-agent ended); a spawning step with no next step (background sub-agents) ends at its own
  ``t_done``.
- ``jobs_per_hour``: sessions whose every call succeeded, per hour of the measured window.
- ``cache_hit_ratio`` per session: Σ cached_tokens / Σ prompt_tokens over its calls whose server reported cached
  tokens (inference-perf's per-session KV-cache hit rate); null where none did.
- a session is good (``attainment``) when every call succeeded and it met every limit of ``slo.sessions.good``.
- ``tool_calls_missing``: calls answered without a tool call whose agent's next step was planned as its tool
  result (``wait_kind`` tool): the server answered text instead (plan.md §2.3), counted, never a failure.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from loadgen.analysis.metrics import describe

SESSION_KEY = ["worker", "session"]
STEP_COLUMNS = ("worker", "session", "agent", "step", "call", "agent_step_ms", "wait_ns", "wait_kind", "ok")


def session_calls(measured: pl.DataFrame) -> pl.DataFrame:
    """The measured requests that are session calls (none: an empty frame; records before issue 38: none)."""
    if "session" not in measured.columns:
        return measured.head(0)
    return measured.filter(pl.col("session").is_not_null())


def step_table(calls: pl.DataFrame) -> pl.DataFrame:
    """One row per call (an agent's step): ``agent_step_ms`` as defined above, the wait before it."""
    spawners = (calls.select(*SESSION_KEY, pl.col("after_call").alias("call"), pl.col("agent").alias("child"))
                .join(calls.select(*SESSION_KEY, "call", "agent"), on=[*SESSION_KEY, "call"])
                .filter(pl.col("child") != pl.col("agent")).select(*SESSION_KEY, "call").unique()
                .with_columns(spawned=pl.lit(True)))
    nexts = calls.select(*SESSION_KEY, "agent", (pl.col("step") - 1).alias("step"),
                         pl.col("t_ready_ns").alias("join_ready_ns"))
    end = (pl.when(pl.col("spawned").fill_null(False) & pl.col("join_ready_ns").is_not_null())
           .then(pl.col("join_ready_ns")).otherwise(pl.col("t_done_ns")))
    return (calls.join(spawners, on=[*SESSION_KEY, "call"], how="left")
            .join(nexts, on=[*SESSION_KEY, "agent", "step"], how="left")
            .with_columns(agent_step_ms=(end - pl.col("t_intended_ns")) / 1e6)
            .select(STEP_COLUMNS).sort(*SESSION_KEY, "call"))


def critical_path(calls: list[int], after: list[int | None], done: list[int]) -> list[int]:
    """The calls from the session's root to its last call to end, following each call's releasing parent."""
    parent = dict(zip(calls, after))
    node: int | None = calls[max(range(len(calls)), key=lambda k: done[k])]
    path: list[int] = []
    while node is not None and node not in path:
        path.append(node)
        node = parent.get(node)
    return path[::-1]


def session_table(calls: pl.DataFrame, steps: pl.DataFrame, good: dict[str, float] | None = None) -> pl.DataFrame:
    """One row per session: session, class_name, worker, calls, agents, ok, session_ms, critical_path (calls),
    cached_tokens, prompt_tokens, cache_hit_ratio, slowest_step (its call), slowest_step_ms, good."""
    reported = pl.col("cached_tokens").is_not_null()
    root = pl.col("after_call").is_null()
    per = (calls.group_by(SESSION_KEY, maintain_order=True).agg(
        pl.col("class_name").first(), calls=pl.len(), agents=pl.col("agent").n_unique(), ok=pl.col("ok").all(),
        t_start_ns=pl.col("t_intended_ns").filter(root).min().fill_null(pl.col("t_intended_ns").min()),
        t_end_ns=pl.col("t_done_ns").max(),
        cached_tokens=pl.col("cached_tokens").sum(), prompt_tokens=pl.col("prompt_tokens").sum(),
        reported_prompt=pl.col("prompt_tokens").filter(reported).sum(), reported=reported.any(),
        path_calls=pl.col("call"), path_after=pl.col("after_call"), path_done=pl.col("t_done_ns"),
        worst_answer_ms=(pl.col("ttft_answer_ms").max() if "ttft_answer_ms" in calls.columns else pl.lit(None))))
    paths = [critical_path(c, a, d) for c, a, d in per.select("path_calls", "path_after", "path_done").iter_rows()]
    slowest = (steps.sort("agent_step_ms", "call", descending=[True, False], nulls_last=True).group_by(SESSION_KEY)
               .agg(slowest_step=pl.col("call").first(), slowest_step_ms=pl.col("agent_step_ms").first(),
                    worst_step_ms=pl.col("agent_step_ms").max()))
    table = (per.with_columns(session_ms=(pl.col("t_end_ns") - pl.col("t_start_ns")) / 1e6,
                              critical_path=pl.Series(paths, dtype=pl.List(pl.Int64)),
                              cache_hit_ratio=pl.when(pl.col("reported") & (pl.col("reported_prompt") > 0))
                              .then(pl.col("cached_tokens") / pl.col("reported_prompt")))
             .join(slowest, on=SESSION_KEY, how="left", maintain_order="left"))
    return table.with_columns(good=_good(good or {})).select(
        "session", "class_name", "worker", "calls", "agents", "ok", "session_ms", "critical_path", "cached_tokens",
        "prompt_tokens", "cache_hit_ratio", "slowest_step", "slowest_step_ms", "good")


def _good(limits: dict[str, float]) -> pl.Expr:
    """A session is good: every call succeeded, and within each limit given (session_ms: its own; agent_step_ms:
    its slowest step; ttft_answer_ms: its slowest call's)."""
    cond = pl.col("ok")
    for name, column in (("session_ms", "session_ms"), ("agent_step_ms", "worst_step_ms"),
                         ("ttft_answer_ms", "worst_answer_ms")):
        if limits.get(name) is not None:
            cond = cond & (pl.col(column).fill_null(0.0) <= limits[name])
    return cond


def tool_calls_missing(calls: pl.DataFrame) -> int:
    """Calls answered without a tool call whose agent's next step was planned as its tool result (wait_kind
    tool). The agent's previous step, not ``after_call``: a join's releasing parent is a sub-agent's last call."""
    if "tool_calls" not in calls.columns:
        return 0
    tool_next = (calls.filter((pl.col("wait_kind") == "tool") & (pl.col("step") > 0))
                 .select(*SESSION_KEY, "agent", pl.col("step") - 1).unique())
    answered = calls.join(tool_next, on=[*SESSION_KEY, "agent", "step"], how="semi")
    return int((answered["tool_calls"].fill_null(0) == 0).sum())


def session_stats(sessions: pl.DataFrame, steps: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """The session family's metric rows: ``session_ms`` over sessions whose calls all succeeded, and
    ``agent_step_ms`` over their successful steps."""
    done = sessions.filter(pl.col("ok"))
    ok_steps = steps.filter(pl.col("ok")).join(done.select(SESSION_KEY), on=SESSION_KEY, how="semi")
    return {"session_ms": describe(done["session_ms"]), "agent_step_ms": describe(ok_steps["agent_step_ms"])}


def session_figures(sessions: pl.DataFrame, steps: pl.DataFrame, calls: pl.DataFrame,
                    window_s: float) -> dict[str, Any]:
    """summary.json's ``sessions``: count, completed, failed, calls_mean, agents_mean, session_ms and
    agent_step_ms (statistics), jobs_per_hour, good, attainment, cache_hit_ratio (statistics over sessions),
    tool_calls, tool_calls_missing, tool_waits (count, wait_ms statistics), window_s."""
    completed = int(sessions["ok"].sum())
    good = int(sessions["good"].sum())
    waits = calls.filter(pl.col("wait_kind") == "tool")["wait_ns"].cast(pl.Float64) / 1e6
    stats = session_stats(sessions, steps)
    return {"count": sessions.height, "completed": completed, "failed": sessions.height - completed,
            "calls_mean": float(sessions["calls"].mean() or 0.0),  # type: ignore[arg-type]
            "agents_mean": float(sessions["agents"].mean() or 0.0),  # type: ignore[arg-type]
            **stats, "jobs_per_hour": completed / window_s * 3600 if window_s > 0 else None,
            "good": good, "attainment": good / sessions.height if sessions.height else None,
            "cache_hit_ratio": describe(sessions["cache_hit_ratio"]),
            "tool_calls": int(calls["tool_calls"].fill_null(0).sum()) if "tool_calls" in calls.columns else 0,
            "tool_calls_missing": tool_calls_missing(calls),
            "tool_waits": {"count": len(waits), "wait_ms": describe(waits)}, "window_s": window_s}


class SessionFrames:
    """A run's session frames, made once: ``calls`` (the measured session calls), ``steps``, ``sessions``
    (``good`` by ``slo.sessions.good``'s limits), and the window the jobs per hour are over. ``not_finished``:
    sessions the run's end cut short with no call failed (run.json ``sessions_not_finished``: the driver sent
    some of their calls, then stopped sending): not judged — neither a completed job nor a failed one, left out
    of every session figure (``cut_at_end`` counts them); their calls are still the run's requests."""

    def __init__(self, measured: pl.DataFrame, window_s: float, good: dict[str, float] | None = None,
                 not_finished: list[int] | None = None) -> None:
        self.calls = session_calls(measured)
        self.window_s = window_s
        self.steps = step_table(self.calls)
        table = session_table(self.calls, self.steps, good)
        cut = pl.col("session").is_in(not_finished or [])
        self.cut_at_end = int(table.filter(cut).height)
        self.sessions = table.filter(~cut)
        self.steps = self.steps.filter(~cut)

    @property
    def present(self) -> bool:
        return self.calls.height > 0

    def stats(self) -> dict[str, dict[str, Any]]:
        return session_stats(self.sessions, self.steps)

    def figures(self) -> dict[str, Any]:
        return {**session_figures(self.sessions, self.steps, self.calls, self.window_s),
                "cut_at_end": self.cut_at_end}

    def tables(self) -> dict[str, pl.DataFrame]:
        """The tables written beside summary.json (``sessions.parquet``, ``session_steps.parquet``)."""
        return {"sessions": self.sessions, "session_steps": self.steps.drop("ok")}
