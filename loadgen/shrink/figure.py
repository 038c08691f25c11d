"""The before/after figure (figure.png, and its Vega-Lite spec figure.vl.json): the chunk gaps of the final set's
streams over time (each gap a segment from its start to its end, at its height), in the original run (left) and
in the reproduction (right: the first confirmation on the target, or the virtual-time replay when none ran); the
victim, the culprits and the other requests told apart, the reproduction threshold drawn. Times are from the
set's first send."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import altair as alt
import polars as pl

from loadgen.shrink.event import Event, Item
from loadgen.shrink.writers import role_of

NS_PER_MS = 1e6
Streams = dict[int, list[int]]  # trace row → chunk times (ns from the set's first send)


def original_streams(chunks: pl.DataFrame, items: Sequence[Item]) -> Streams:
    t0 = min(i.t_intended_ns for i in items)
    out: Streams = {}
    for row, item in enumerate(items):
        times = chunks.filter((pl.col("worker") == item.worker) & (pl.col("seq") == item.seq))["t_ns"].sort()
        out[row] = [int(t) - t0 for t in times]
    return out


def _rows(panel: str, streams: Streams, items: Sequence[Item], event: Event) -> list[dict[str, Any]]:
    out = []
    for row, item in enumerate(items):
        times = streams.get(row, [])
        out += [{"run": panel, "request": f"row {row} (seq {item.seq})", "role": role_of(item, event),
                 "t0_s": a / 1e9, "t_s": b / 1e9, "gap_ms": (b - a) / NS_PER_MS} for a, b in zip(times, times[1:])]
    return out


def figure_spec(items: Sequence[Item], event: Event, before: Streams, after: Streams, after_label: str,
                threshold_ms: float) -> dict[str, Any]:
    rows = _rows("original run", before, items, event) + _rows(after_label, after, items, event)
    data = alt.Data(values=rows)  # type: ignore[no-untyped-call]
    points = alt.Chart().mark_rule(strokeWidth=3).encode(
        x=alt.X("t0_s:Q", title="time from the set's first send (s)"), x2="t_s:Q",
        y=alt.Y("gap_ms:Q", title="chunk gap (ms): a segment spans the gap"),
        color=alt.Color("role:N", scale=alt.Scale(domain=["victim", "culprit", "in flight"],
                                                  range=["#c62828", "#1565c0", "#9e9e9e"])),
        tooltip=["request:N", "role:N", "t0_s:Q", "t_s:Q", "gap_ms:Q"])
    rule = alt.Chart().mark_rule(strokeDash=[4, 3], color="#c62828").encode(y=alt.datum(threshold_ms))
    chart = alt.layer(points, rule, data=data).properties(width=380, height=220).facet(
        column=alt.Column("run:N", sort=["original run", after_label], title=None)).properties(
        title=f"{event.label}: {event.gap_ms:.0f} ms {'TTFT' if event.metric == 'ttft_ms' else 'gap'}; "
              f"{len(items)} requests; dashed: the reproduction "
              f"threshold ({threshold_ms:.0f} ms)")
    return chart.to_dict()


def write_figure(out: Path, png: bool, spec: dict[str, Any]) -> list[Path]:
    """figure.vl.json always; figure.png when asked and vl-convert is installed (the report's PNG dependency)."""
    paths = [out / "figure.vl.json"]
    paths[0].write_text(json.dumps(spec) + "\n", encoding="utf-8")
    if not png:
        return paths
    try:
        import vl_convert
    except ImportError:
        return paths
    (out / "figure.png").write_bytes(vl_convert.vegalite_to_png(spec, scale=1.5))
    return paths + [out / "figure.png"]
