"""The session lane: one agentic session's calls on its own time axis, so that a slow agent step is explained.

One row per call, labelled ``agent k · step s · call c`` (a sub-agent's rows indented under the call that
spawned it), with its phases as bars: the tool wait or think time before it (ready → intended), waiting
(intended → sent), to first token (sent → the first generated token of any kind), reasoning (first token →
first answer token), answer (→ done). Lines join a call to the call whose end released it (the records'
``after_call``: the next step, a fan-out to a sub-agent, the join after the last sub-agent). Stalls of the
session's streams are red marks; each prefill-induced one is linked to its culprits: a call of this session,
or an extra row naming the other session's call (or request) whose long context was being prefilled.

The session shown is the slowest (largest ``session_ms``: its last call's end − its first call's intended
send) among the measured sessions, or the one asked for. Pure polars over the records and the stalls table.
"""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import polars as pl

from loadgen.analysis.sessions import session_table, step_table

NS_PER_S = 1e9
INDENT = "\u2013\u00a0"  # "– " per level: a sub-agent under the call that spawned it (an SVG trims leading spaces)
LANE_PHASES = {"tool wait": "#d9d9d9", "think time": "#eeeeee", "waiting": "#a0a0a0", "to first token": "#f58518",
               "reasoning": "#b279a2", "answer": "#4c78a8", "failed": "#e45756", "culprit prefill": "#ff9da6"}
LINK_KINDS = {"next step": "#888888", "fan-out": "#54a24b", "join": "#2e7d32"}


@dataclass
class Lane:
    """The lane of one session: its rows, bars, release links, stall marks and culprit links, and the words."""

    session: int
    class_name: str
    session_ms: float
    rows: pl.DataFrame  # row (label), order, call (null for a culprit's row)
    bars: pl.DataFrame  # row, order, call, phase, start_s, end_s (seconds since the session's first intended send)
    links: pl.DataFrame  # kind, row, row2, x_s, x2_s
    stalls: pl.DataFrame  # row, t_start_s, t_end_s, chunk_gap_ms, cause, culprits (labels)
    culprit_links: pl.DataFrame  # row (victim), culprit_row, t_s
    caption: str


def session_calls(requests: pl.DataFrame) -> pl.DataFrame:
    """The requests that are calls of a session (none in a run without sessions or in older records)."""
    if "session" not in requests.columns:
        return requests.clear()
    return requests.filter(pl.col("session").is_not_null())


def pick_session(calls: pl.DataFrame, asked: int | None = None) -> int | None:
    """The session asked for, else the slowest measured one (largest ``session_ms``; else the slowest of all);
    None: no session."""
    if calls.is_empty():
        return None
    if asked is not None:
        known = calls["session"].unique().sort()
        if asked not in known.to_list():
            raise ValueError(f"--session {asked}: no such session in this run (sessions {known.min()}–{known.max()})")
        return asked
    measured = calls.filter(~pl.col("warmup"))
    pool = measured if measured.height else calls
    table = session_table(pool, step_table(pool))
    return int(table.sort(["session_ms", "session"], descending=[True, False], nulls_last=True)["session"][0])


def _depths(calls: pl.DataFrame) -> dict[int, int]:
    """Per agent: how deep it is nested (0 the main agent; a sub-agent one more than the agent that spawned it,
    read from its first call's ``after_call``)."""
    agent_of = dict(zip(calls["call"].to_list(), calls["agent"].fill_null(0).to_list()))
    roots = calls.sort("step").group_by("agent", maintain_order=True).first()
    spawned_by = {a: agent_of.get(p) for a, p in zip(roots["agent"].fill_null(0).to_list(),
                                                      roots["after_call"].to_list())}
    depths: dict[int, int] = {}
    for agent in spawned_by:
        d, seen, a = 0, {agent}, spawned_by.get(agent)
        while agent != 0 and a is not None and a not in seen:
            d, seen, a = d + 1, seen | {a}, (spawned_by.get(a) if a != 0 else None)
        depths[agent] = d if agent != 0 else 0
    return depths


def _call_rows(calls: pl.DataFrame) -> pl.DataFrame:
    depth = _depths(calls)
    labels = [f"{INDENT * depth.get(a, 0)}agent {a} · step {s} · call {c}"
              for a, s, c in zip(calls["agent"].fill_null(0).to_list(), calls["step"].fill_null(0).to_list(),
                                 calls["call"].to_list())]
    return calls.with_columns(row=pl.Series(labels, dtype=pl.String), order=pl.int_range(pl.len()))


def _rel(col: str, start_ns: int) -> pl.Expr:
    return (pl.col(col) - start_ns) / NS_PER_S


def _bars(calls: pl.DataFrame, start_ns: int) -> pl.DataFrame:
    answer_start = pl.col("t_first_answer_ns").fill_null(pl.col("t_first_token_ns"))
    wait = pl.when(pl.col("wait_kind") == "think").then(pl.lit("think time")).otherwise(pl.lit("tool wait"))
    ok = pl.col("t_first_token_ns").is_not_null()
    spans = [(wait, pl.col("t_ready_ns"), pl.col("t_intended_ns"), pl.lit(True)),
             (pl.lit("waiting"), pl.col("t_intended_ns"), pl.col("t_sent_ns"), pl.lit(True)),
             (pl.lit("to first token"), pl.col("t_sent_ns"), pl.col("t_first_token_ns"), ok),
             (pl.lit("reasoning"), pl.col("t_first_token_ns"), answer_start, ok),
             (pl.lit("answer"), answer_start, pl.col("t_done_ns"), ok),
             (pl.lit("failed"), pl.col("t_sent_ns"), pl.col("t_done_ns"), ~ok)]
    parts = [calls.filter(keep).select("row", "order", "call", "prompt_tokens", "cached_tokens", "error_kind",
                                       phase=name, start_s=(a - start_ns) / NS_PER_S, end_s=(b - start_ns) / NS_PER_S)
             for name, a, b, keep in spans]
    return (pl.concat(parts).drop_nulls(["start_s", "end_s"]).filter(pl.col("end_s") > pl.col("start_s"))
            .with_columns(ms=(pl.col("end_s") - pl.col("start_s")) * 1e3))


def _links(calls: pl.DataFrame, start_ns: int) -> pl.DataFrame:
    """parent (after_call) done → child ready: fan-out when the child is another agent's first call, join when
    the parent is another agent's, else the next step."""
    parent = calls.select(after_call="call", p_row="row", p_agent="agent", p_done_ns="t_done_ns")
    kids = calls.filter(pl.col("after_call").is_not_null()).join(parent, on="after_call", how="inner")
    kind = (pl.when(pl.col("agent") == pl.col("p_agent")).then(pl.lit("next step"))
            .when(pl.col("p_agent") == 0).then(pl.lit("fan-out"))
            .when(pl.col("agent") == 0).then(pl.lit("join"))
            .otherwise(pl.lit("fan-out")))
    return kids.select(kind=kind, row="p_row", row2="row", x_s=_rel("p_done_ns", start_ns),
                       x2_s=_rel("t_ready_ns", start_ns).fill_null(_rel("p_done_ns", start_ns)),
                       parent="after_call", child="call")


def culprit_label(r: dict[str, object]) -> str:
    """'session S call C (P-token context, X cached, class K)', or for a request outside sessions
    '#seq K (P-token prompt, X cached)'."""
    cached = r.get("cached_tokens")
    held = f", {cached} cached" if cached is not None else ""
    if r.get("session") is not None:
        return f"session {r['session']} call {r['call']} ({r['prompt_tokens']}-token context{held}, class " \
               f"{r['class_name']})"
    return f"#{r['seq']} {r['class_name']} ({r['prompt_tokens']}-token prompt{held})"


def _stalls(calls: pl.DataFrame, stalls: pl.DataFrame, requests: pl.DataFrame,
            start_ns: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(stall marks, culprit links, culprit rows, culprit bars) for this session's streams."""
    keys = [k for k in ("worker", "seq") if k in stalls.columns and k in calls.columns]
    mine = stalls.join(calls.select(*keys, "row", "order"), on=keys) if stalls.height else stalls.clear()
    empty = pl.DataFrame(schema={"row": pl.String, "culprit_row": pl.String, "t_s": pl.Float64})
    if mine.is_empty():
        return mine, empty, pl.DataFrame(), pl.DataFrame()
    wanted = {c for cs in mine["culprits"].drop_nulls().to_list() for c in cs}
    cols = [c for c in ("seq", "class_name", "prompt_tokens", "cached_tokens", "session", "call",
                        "t_sent_ns", "t_first_token_ns") if c in requests.columns]
    culprits = requests.filter(pl.col("seq").is_in(list(wanted))).select(cols).unique("seq").sort("t_sent_ns")
    own = dict(zip(calls["seq"].to_list(), calls["row"].to_list()))
    culprits = culprits.with_columns(
        label=pl.Series([culprit_label(r) for r in culprits.iter_rows(named=True)], dtype=pl.String))
    culprits = culprits.with_columns(culprit_row=pl.Series(
        [own.get(s, "culprit: " + lab) for s, lab in zip(culprits["seq"].to_list(), culprits["label"].to_list())],
        dtype=pl.String))
    names = dict(zip(culprits["seq"].to_list(), culprits["label"].to_list()))
    marks = mine.select("row", "order", "seq", t_start_s=_rel("t_start_ns", start_ns),
                        t_end_s=_rel("t_end_ns", start_ns), chunk_gap_ms="chunk_gap_ms", cause="cause",
                        excess_ms="excess_ms", culprits=pl.col("culprits"))
    marks = marks.with_columns(culprit_names=pl.Series(
        ["; ".join(names.get(c, f"#{c}") for c in (cs or [])) or "–" for cs in marks["culprits"].to_list()],
        dtype=pl.String))
    links = (marks.select("row", "t_end_s", culprit="culprits").explode("culprit").drop_nulls("culprit")
             .join(culprits.select(culprit="seq", culprit_row="culprit_row"), on="culprit")
             .select("row", "culprit_row", t_s="t_end_s"))
    foreign = culprits.filter(~pl.col("seq").is_in(list(own)))
    rows = foreign.select(row="culprit_row", call=pl.lit(None, dtype=pl.Int64))
    bars = foreign.select(row="culprit_row", call=pl.lit(None, dtype=pl.Int64), prompt_tokens="prompt_tokens",
                          cached_tokens=pl.col("cached_tokens") if "cached_tokens" in cols else pl.lit(None),
                          error_kind=pl.lit(None, dtype=pl.String), phase=pl.lit("culprit prefill"),
                          start_s=_rel("t_sent_ns", start_ns), end_s=_rel("t_first_token_ns", start_ns))
    return marks.drop("culprits"), links, rows, bars


def _caption(calls: pl.DataFrame, bars: pl.DataFrame, links: pl.DataFrame, marks: pl.DataFrame,
             session_ms: float) -> str:
    """'Session took T s. Slowest step: agent a · step s · call c, X s from its intended send to its result:
    its parts; the largest part; its stalls and their culprits' (the step as analysis/sessions.py times it)."""
    steps = calls.join(step_table(calls).select("call", step_ms="agent_step_ms"), on="call").drop_nulls("step_ms")
    if steps.is_empty():
        return f"Session took {session_ms / 1e3:.2f} s; no call of it completed."
    worst = steps.sort("step_ms", descending=True).row(0, named=True)
    spawned = links.filter((pl.col("parent") == worst["call"]) & (pl.col("kind") == "fan-out")).height
    own = bars.filter(pl.col("call") == worst["call"]).group_by("phase").agg(pl.col("ms").sum())
    parts = {p: ms for p, ms in own.iter_rows()}
    words = [f"{p} {parts[p] / 1e3:.2f} s" for p in ("waiting", "to first token", "reasoning", "answer", "failed")
             if parts.get(p)]
    sub_s = ""
    sub_ms = worst["step_ms"] - sum(parts.get(p, 0.0) for p in ("waiting", "to first token", "reasoning", "answer"))
    if spawned and sub_ms > 0.5:
        words.append(f"then its {spawned} sub-agent{'s' if spawned > 1 else ''} until the join {sub_ms / 1e3:.2f} s")
        parts["its sub-agents"] = sub_ms
        sub_s = f" (it spawned {spawned} sub-agent{'s' if spawned > 1 else ''})"
    largest = max(parts, key=lambda p: parts[p]) if parts else "–"
    text = (f"Session took {session_ms / 1e3:.2f} s. Slowest step: {worst['row'].strip()}{sub_s}, "
            f"{worst['step_ms'] / 1e3:.2f} s from its intended send to its result: {', '.join(words)}; "
            f"the largest part: {largest}.")
    hit = marks.filter(pl.col("seq") == worst["seq"]) if marks.height else marks
    if hit.height:
        names = sorted({n for ns in hit["culprit_names"].to_list() for n in ns.split("; ") if n != "–"})
        text += (f" {hit.height} stall{'s' if hit.height > 1 else ''} during it ({hit['excess_ms'].sum() / 1e3:.2f}"
                 f" s over its usual pace)" + (f", culprits: {', '.join(names)}." if names else
                                               f", cause: {', '.join(sorted(set(hit['cause'].to_list())))}."))
    else:
        text += " No stall interrupted its stream."
    return text


MAX_LANE_ROWS = 80


def build_lane(requests: pl.DataFrame, stalls: pl.DataFrame, asked: int | None = None) -> Lane | None:
    """The lane of the session asked for, else the slowest measured one; None when the run has no sessions."""
    all_calls = session_calls(requests)
    chosen = pick_session(all_calls, asked)
    if chosen is None:
        return None
    whole = all_calls.filter(pl.col("session") == chosen).sort("call")
    first = whole.select(pl.col("t_intended_ns").min()).item()
    start = min(first, whole.select(pl.col("t_ready_ns").min()).item() or first)
    session_ms = float(session_table(whole, step_table(whole))["session_ms"][0])  # as analysis/sessions.py says
    calls = _call_rows(whole.head(MAX_LANE_ROWS))
    bars = _bars(calls, start)
    marks, culprit_links, culprit_rows, culprit_bars = _stalls(calls, stalls, requests, start)
    rows = calls.select("row", "order", "call")
    if culprit_rows.height:
        rows = pl.concat([rows, culprit_rows.with_columns(order=pl.int_range(pl.len()) + rows.height)
                          .select("row", "order", "call")])
        bars = pl.concat([bars, culprit_bars.with_columns(
            order=pl.col("row").replace_strict(dict(zip(rows["row"], rows["order"])), return_dtype=pl.Int64),
            ms=(pl.col("end_s") - pl.col("start_s")) * 1e3).select(bars.columns)], how="vertical_relaxed")
    links = _links(calls, start)
    caption = _caption(calls, bars, links, marks, session_ms)
    if whole.height > calls.height:
        caption += f" Only its first {MAX_LANE_ROWS} of {whole.height} calls are drawn."
    return Lane(chosen, str(calls["class_name"][0]), session_ms, rows, bars, links, marks,
                culprit_links, caption)


STALL_COLOR = "#d62728"
LANE_WIDTH = 760


def lane_chart(lane: Lane) -> alt.TopLevelMixin:
    """The lane as a layered altair chart: phase bars, release links, stall marks and culprit links."""
    labels = lane.rows.sort("order")["row"].to_list()
    pad = min(420, 8 + int(5.2 * max(len(r) for r in labels)))  # labels left-aligned: a sub-agent's indent shows
    y = alt.Y("row:N", sort=alt.EncodingSortField("order", op="min"), title=None, scale=alt.Scale(domain=labels),
              axis=alt.Axis(labelLimit=pad, labelAlign="left", labelPadding=pad))
    x = alt.X("start_s:Q", title="seconds since the session's first intended send")
    bars = alt.Chart(lane.bars).mark_bar(height=10).encode(
        x=x, x2="end_s:Q", y=y,
        color=alt.Color("phase:N", title="phase", legend=alt.Legend(orient="top"),
                        scale=alt.Scale(domain=list(LANE_PHASES), range=list(LANE_PHASES.values()))),
        tooltip=["row:N", "phase:N", alt.Tooltip("ms:Q", format=".1f", title="ms"), "prompt_tokens:Q",
                 "cached_tokens:Q", alt.Tooltip("start_s:Q", format=".3f"), alt.Tooltip("end_s:Q", format=".3f"),
                 "error_kind:N"])
    layers: list[alt.Chart] = [bars]
    if lane.links.height:
        layers.append(alt.Chart(lane.links).mark_rule(strokeWidth=1.2, opacity=0.8).encode(
            x="x_s:Q", x2="x2_s:Q", y=y, y2="row2:N",
            color=alt.Color("kind:N", title="released by", legend=alt.Legend(orient="top"),
                            scale=alt.Scale(domain=list(LINK_KINDS), range=list(LINK_KINDS.values()))),
            tooltip=["kind:N", alt.Tooltip("parent:Q", title="call"), alt.Tooltip("child:Q", title="released call"),
                     alt.Tooltip("x_s:Q", format=".3f", title="at (s)")]))
    if lane.stalls.height:
        layers.append(alt.Chart(lane.stalls).mark_bar(height=4, color=STALL_COLOR, stroke="white",
                                                      strokeWidth=0.6).encode(
            x="t_start_s:Q", x2="t_end_s:Q", y=y,
            tooltip=["row:N", alt.Tooltip("chunk_gap_ms:Q", format=".1f", title="gap (ms)"), "cause:N",
                     alt.Tooltip("culprit_names:N", title="culprits")]))
    if lane.culprit_links.height:
        layers.append(alt.Chart(lane.culprit_links).mark_rule(color=STALL_COLOR, strokeDash=[3, 2]).encode(
            x="t_s:Q", y=y, y2="culprit_row:N",
            tooltip=[alt.Tooltip("row:N", title="stalled"), alt.Tooltip("culprit_row:N", title="culprit")]))
    height = max(120, 18 * lane.rows.height)
    return alt.layer(*layers).resolve_scale(color="independent").properties(width=LANE_WIDTH, height=height)
