"""The figures people quote (docs/figures.md; names declared in core/vocabulary.py ``QUOTED_FIGURES``): cost per
million tokens from a declared price per hour, energy per token and mean power from the GPUs' scraped power
metrics, the MLPerf Endpoints convention's figures, and the Pareto front of a sweep's steps. Pure: numbers and
frames in, numbers out. A figure whose input is missing is absent (None) and its reason is said, never 0.

MLPerf Endpoints v1.0 (mlcommons/endpoints-submission-docs, docs/reference/metrics-and-regions.md, citing the
rules §4.1-4.2): the latency figures are P90 (not P95 as in v0.7); the primary chart plots system tokens/s
against tokens/s per user, higher being better on both axes; tokens/s per user = 1000 / TPOT p90 (ms).
"""

from __future__ import annotations

from typing import Any, Sequence

import polars as pl

from loadgen.analysis.sweep_result import final_steps

POWER_W, ENERGY_J = "gpu_power_w", "gpu_energy_j"  # server_metrics.parquet names (drivers/scrape.py)
EDGE_SLACK_NS = 1_000_000_000  # a window edge this close outside the scrapes is extrapolated from the nearest two


def cost_per_1m_tokens(price_per_hour: float, window_s: float, tokens: float) -> float | None:
    """The whole deployment's price for the measured hours, per million tokens; None without tokens."""
    if tokens <= 0 or window_s <= 0:
        return None
    return price_per_hour * (window_s / 3600.0) / tokens * 1e6


def value_at(t_ns: Sequence[int], values: Sequence[float], at_ns: int) -> float | None:
    """The piecewise-linear series at ``at_ns`` (sorted ``t_ns``): interpolated between samples, extrapolated
    from the nearest two up to ``EDGE_SLACK_NS`` outside them; None further out or with fewer than two."""
    n = len(t_ns)
    if n < 2 or at_ns < t_ns[0] - EDGE_SLACK_NS or at_ns > t_ns[-1] + EDGE_SLACK_NS:
        return None
    i = 1
    while i < n - 1 and t_ns[i] < at_ns:
        i += 1
    t_a, t_b, v_a, v_b = t_ns[i - 1], t_ns[i], values[i - 1], values[i]
    if t_b == t_a:
        return v_b
    return v_a + (v_b - v_a) * (at_ns - t_a) / (t_b - t_a)


def integral_j(t_ns: Sequence[int], power_w: Sequence[float], t0_ns: int, t1_ns: int) -> float | None:
    """∫P dt over [t0, t1] (J) of the piecewise-linear power series (trapezoids; the edges interpolated)."""
    p0, p1 = value_at(t_ns, power_w, t0_ns), value_at(t_ns, power_w, t1_ns)
    if p0 is None or p1 is None:
        return None
    points = [(t0_ns, p0)] + [(t, p) for t, p in zip(t_ns, power_w) if t0_ns < t < t1_ns] + [(t1_ns, p1)]
    return sum((b[0] - a[0]) / 1e9 * (a[1] + b[1]) / 2 for a, b in zip(points, points[1:]))


def counter_delta_j(t_ns: Sequence[int], energy_j: Sequence[float], t0_ns: int, t1_ns: int) -> float | None:
    """The energy counter's increase over [t0, t1] (J), each edge interpolated between scrapes."""
    e0, e1 = value_at(t_ns, energy_j, t0_ns), value_at(t_ns, energy_j, t1_ns)
    return None if e0 is None or e1 is None or e1 < e0 else e1 - e0  # a reset (e1 < e0): no figure


def window_energy(server: pl.DataFrame | None, t0_ns: int, t1_ns: int) -> tuple[float | None, str]:
    """(the GPUs' energy over the window in J, how it was had: ``counter`` / ``integral``) or (None, why)."""
    if server is None or server.is_empty():
        return None, "no power metrics were scraped"
    for name, how in ((ENERGY_J, counter_delta_j), (POWER_W, integral_j)):
        rows = server.filter(pl.col("name") == name).sort("t_ns")
        if rows.height >= 2:
            energy = how(rows["t_ns"].to_list(), rows["value"].to_list(), t0_ns, t1_ns)
            if energy is not None:
                return energy, "counter" if name == ENERGY_J else "integral"
    if server.filter(pl.col("name").is_in([ENERGY_J, POWER_W])).is_empty():
        return None, "the power metrics had no GPU power or energy series"
    return None, "the power scrapes do not cover the measured window"


def mlperf(metrics: dict[str, Any]) -> dict[str, Any]:
    """TTFT p90, TPOT p90 and tokens/s per user = 1000 / TPOT p90 (MLPerf Endpoints v1.0, rules §4.1); a figure
    without samples is None and ``absent`` says why."""
    ttft = (metrics.get("ttft_ms") or {}).get("p90")
    tpot = (metrics.get("tpot_ms") or {}).get("p90")
    out = {"ttft_p90_ms": ttft, "tpot_p90_ms": tpot, "tokens_per_s_per_user": 1000.0 / tpot if tpot else None}
    why = {"ttft_p90_ms": "no request had a first token",
           "tpot_p90_ms": "no request had more than one output token"}
    why["tokens_per_s_per_user"] = why["tpot_p90_ms"] if tpot is None else "TPOT p90 is 0 (the tokens came at once)"
    return {**out, "absent": {k: why[k] for k, v in out.items() if v is None}}


NO_PRICE = "no cost.price_per_hour declared in the scenario"
NO_POWER = "no target.power_metrics declared"
UNASKED = frozenset({NO_PRICE, NO_POWER})  # reasons that mean "not asked for": the console leaves them unsaid


def cost_figures(cost: Any, window_s: float, output_tokens: float, total_tokens: float) -> dict[str, Any]:
    """cost_per_1m_output_tokens and cost_per_1m_total_tokens, or their reason for being absent."""
    names = ("cost_per_1m_output_tokens", "cost_per_1m_total_tokens")
    if cost is None:
        return {"absent": dict.fromkeys(names, NO_PRICE)}
    out: dict[str, Any] = {"currency": cost.currency, "absent": {}}
    for name, tokens in zip(names, (output_tokens, total_tokens)):
        value = cost_per_1m_tokens(cost.price_per_hour, window_s, tokens)
        out[name] = value
        if value is None:
            out["absent"][name] = "no tokens were measured"
    return out


def energy_figures(server: pl.DataFrame | None, window: tuple[int, int] | None, declared: bool,
                   output_tokens: float, total_tokens: float) -> dict[str, Any]:
    """energy_j_per_output_token, energy_j_per_total_token, power_w_mean (and ``energy_source``), or why not."""
    names = ("energy_j_per_output_token", "energy_j_per_total_token", "power_w_mean")
    if not declared:
        return {"absent": dict.fromkeys(names, NO_POWER)}
    if window is None:
        return {"absent": dict.fromkeys(names, "no measured requests")}
    energy, how = window_energy(server, *window)
    if energy is None:
        return {"absent": dict.fromkeys(names, how)}
    out: dict[str, Any] = {"energy_j": energy, "energy_source": how, "absent": {},
                           "power_w_mean": energy / max(1e-9, (window[1] - window[0]) / 1e9)}
    for name, tokens in zip(names, (output_tokens, total_tokens)):
        out[name] = energy / tokens if tokens > 0 else None
        if tokens <= 0:
            out["absent"][name] = "no tokens were measured"
    return out


def pareto(points: Sequence[tuple[float | None, float | None]]) -> list[int]:
    """The indexes of the points no other point dominates (at least as high on both axes, higher on one);
    a point missing either value is on no front. MLPerf Endpoints' chart: tokens/s per user vs tokens/s."""
    valid = [(i, x, y) for i, (x, y) in enumerate(points) if x is not None and y is not None]
    return [i for i, x, y in valid
            if not any(x2 >= x and y2 >= y and (x2 > x or y2 > y) for _, x2, y2 in valid)]


def console_line(summary: dict[str, Any]) -> str | None:
    """The one line of the quoted figures (console, summary.md, report.html), absent parts said once; None when the
    summary has neither cost, energy nor MLPerf figures."""
    fig, ml = summary.get("figures") or {}, summary.get("mlperf") or {}
    parts, unit = [], fig.get("currency", "")
    for name, label in (("cost_per_1m_output_tokens", "/ 1M output tok"), ("cost_per_1m_total_tokens", "/ 1M tok")):
        if fig.get(name) is not None:
            parts.append(f"{fig[name]:,.4g} {unit} {label}")
    for name, text in (("energy_j_per_output_token", "{:.3g} J / output tok"), ("power_w_mean", "{:,.0f} W mean")):
        if fig.get(name) is not None:
            parts.append(text.format(fig[name]))
    reasons = (fig.get("absent") or {})
    for name, label in (("cost_per_1m_output_tokens", "cost"), ("energy_j_per_output_token", "energy")):
        if name in reasons:
            parts.append(f"{label}: {reasons[name]}")
    if ml.get("ttft_p90_ms") is not None and ml.get("tokens_per_s_per_user") is not None:
        parts.append(f"MLPerf TTFT p90 {ml['ttft_p90_ms']:,.0f} ms · TPOT p90 {ml['tpot_p90_ms']:.1f} ms · "
                     f"{ml['tokens_per_s_per_user']:,.1f} tok/s/user")
    elif ml.get("ttft_p90_ms") is not None:
        why = (ml.get("absent") or {}).get("tokens_per_s_per_user", "no TPOT")
        parts.append(f"MLPerf TTFT p90 {ml['ttft_p90_ms']:,.0f} ms · tok/s/user: {why}")
    return "figures: " + " · ".join(parts) if parts else None


def pareto_steps(steps: Sequence[Any]) -> list[dict[str, Any]]:
    """sweep.json's ``pareto``: the steps (one per load, a re-run replacing its first) that no other step beats
    on both tokens/s per user (1000 / TPOT p90) and output tokens/s, by load; a step without either: on none."""
    final = final_steps(list(steps))
    points = [(mlperf(s.metrics)["tokens_per_s_per_user"], s.output_tokens_per_s) for s in final]
    return [{"load": final[i].load, "tokens_per_s_per_user": points[i][0], "output_tokens_per_s": points[i][1],
             "run_dir": final[i].run_dir} for i in pareto(points)]


def result_line(result: Any, asked_only: bool = False) -> str | None:
    """``console_line`` of a RunResult (summary.md, report.html and the console show the same words; the console,
    ``asked_only``, leaves out a figure's absence where its input was never declared: cost, energy)."""
    fig = dict(getattr(result, "figures", None) or {})
    if asked_only:
        fig["absent"] = {k: why for k, why in (fig.get("absent") or {}).items() if why not in UNASKED}
    return console_line({"figures": fig, "mlperf": getattr(result, "mlperf", None)})
