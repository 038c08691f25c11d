"""The run's figures in words: numbers (`fmt`), the stall headline and the lift (console, summary.md, report.html and
summary.json's ``stall_headline`` all say it the same way)."""

from __future__ import annotations

from typing import Any, Callable

from loadgen.core.vocabulary import METRICS, QUANTILES, ObjectiveId


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:.0f}"
    return str(value)


def lift_words(figures_: dict[str, Any]) -> str:
    if figures_.get("lift_infinite"):
        return "lift ×∞: no stall outside long prefills"
    if figures_.get("lift") is None:
        return "lift n/a: no stall overlapped a long prefill"
    return f"lift ×{figures_['lift']:.1f}"


def headline(stalls_summary: dict[str, Any]) -> str:
    """'N stalls, M of them prefill-induced (lift ×K), worst gap X ms caused by request R (P prompt tokens)'."""
    n, m, worst = stalls_summary["count"], stalls_summary["prefill_induced"], stalls_summary.get("worst")
    if n == 0 or not worst:
        return "no stalls"
    text = f"{n} stalls, {m} of them prefill-induced ({lift_words(stalls_summary)}), worst gap " \
           f"{worst['gap_ms']:.0f} ms"
    if worst["culprit"] is not None:
        prompt = worst["culprit_prompt_tokens"]
        tokens = prompt if prompt is not None else "?"
        return text + f" caused by request {worst['culprit']} ({tokens} prompt tokens)"
    return text + f" (cause: {worst['cause']})"


def with_headline(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with ``stall_headline`` right after ``stalls``."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key != "stall_headline":
            out[key] = value
        if key == "stalls":
            out["stall_headline"] = headline(value)
    return out


def interval_words(o: dict[str, Any]) -> str:
    """An objective's interval as a table cell: '[15.2, 98.6]', '[15.2, ∞)' where it has no upper end, '[∞, ∞)'
    where even its lower end is a miss counted as +inf, '–' where it has none (decided on its value)."""
    if o.get("basis") != "interval" or o.get("confidence") is None:
        return "–"
    infinite = o.get("infinite") or ()
    low = "[∞" if "ci_low" in infinite else "(−∞" if o.get("ci_low") is None else f"[{fmt(o['ci_low'], 3)}"
    return f"{low}, ∞)" if o.get("ci_high") is None else f"{low}, {fmt(o['ci_high'], 3)}]"


def value_words(o: dict[str, Any], compact: Callable[[Any], str] | None = None) -> str:
    """An objective's value as a table cell: '∞' where misses counted as +inf reached the statistic (summary.json
    writes it null and names it in ``infinite``), else the number (``compact``: the console's format)."""
    if "value" in (o.get("infinite") or ()):
        return "∞"
    return compact(o["value"]) if compact is not None else fmt(o["value"])


def margin_words(o: dict[str, Any]) -> str:
    """The room left to the limit as a share of it: '+38%' (room), '−12%' (missed by)."""
    pct = o.get("margin_pct")
    return "–" if pct is None else f"{pct:+.0f}%".replace("-", "−")


def decision_words(result: Any, short: bool = False) -> str:
    """How the objectives were decided: 'decided on 95% intervals (docs/verdicts.md)' or on point values."""
    rule = (getattr(result, "decision", None) or {}).get("rule")
    confidence = (getattr(result, "decision", None) or {}).get("confidence")
    if rule == "point":
        if short:
            return "point values"
        return "decided on point values (slo.decision: point: flaky near a limit by design)"
    if confidence is None:
        return ""
    if short:
        return f"{100 * confidence:g}% intervals"
    return (f"decided on {100 * confidence:g}% confidence intervals: pass or fail only when the whole interval "
            "is on one side of the limit (docs/verdicts.md)")


def throughput_words(result: Any) -> str:
    """'12.00 req/s · tokens/s in 6,144 · out 1,536 · total 7,680 · goodput 11.80 req/s' (goodput said as equal to
    the completed rate where no slo.goodput limits it)."""
    tput = result.throughput
    prompt, output = tput.get("prompt_tokens_per_s") or 0.0, tput.get("output_tokens_per_s") or 0.0
    total = tput.get("total_tokens_per_s", prompt + output)
    good, done = tput["goodput_requests_per_s"], tput["requests_per_s"]
    declared = tput.get("goodput_declared", any(str(o["objective"]).startswith("goodput") for o in result.slo))
    goodput = (f"goodput {good:.2f} req/s" if declared or good != done
               else "goodput = completed (no slo.goodput declared)")
    return (f"{done:.2f} req/s · tokens/s in {prompt:,.0f} · out {output:,.0f} · total {total:,.0f} · {goodput}")


LIFT_WORDS = "lift = stalls per output token while a long prompt prefilled ÷ stalls per token elsewhere"


HELD = "every objective held; no request missed"


def stall_lines(result: Any, most: int = 5) -> list[str]:
    """Where nothing missed: that first, then the stalls in one sentence (``stall_sentence``). Else the stall
    headline, what its lift means (once), and the culprits: up to ``most`` long prefills behind the
    prefill-induced stalls, longest first."""
    if not result.stall_headline:
        return []
    if nothing_missed(result):
        return [HELD, stall_sentence(result.stalls or {})]
    lines = [result.stall_headline]
    if "lift ×" in result.stall_headline:
        lines.append(f"  {LIFT_WORDS} (loadgen explain lift)")
    culprits = (result.stalls or {}).get("top_culprits") or []
    if culprits:
        lines.append("culprits (the long prefills behind stalls, longest first):")
    for c in culprits[:most]:
        who = f"#{c['seq']}" + (f" {c['label']}" if c.get("label") else "")
        tokens = fmt(c.get("prompt_tokens"))
        lines.append(f"  {who}: {tokens} prompt tokens, {c.get('stalls', 0)} stalls, "
                     f"{c.get('stalled_ms') or 0:,.0f} ms stalled")
    return lines


def nothing_missed(result: Any) -> bool:
    """A PASS where every objective held, no request failed and the miss ledger (where there is one) is empty."""
    misses = getattr(result, "misses", None)
    return (result.verdict == "pass" and not (result.requests or {}).get("failed")
            and all(o.get("passed") is True for o in result.slo)
            and not (isinstance(misses, dict) and misses.get("requests")))


def stall_sentence(stalls: dict[str, Any]) -> str:
    """'3 gaps ≥ 31 ms (4× the median) were prefill stalls (report.html › Tail spikes)'."""
    n, m = int(stalls.get("count") or 0), int(stalls.get("prefill_induced") or 0)
    if n == 0:
        return "no stalls"
    were = "was" if n == 1 else "were"
    what = (f"prefill stall{'s' if n > 1 else ''}" if m == n else f"stall{'s' if n > 1 else ''}" if m == 0
            else f"stalls, {m:,} of them during a long prompt's prefill")
    return f"{n:,} gap{'s' if n > 1 else ''} {threshold_words(stalls)} {were} {what} (report.html › Tail spikes)"


def threshold_words(stalls: dict[str, Any]) -> str:
    """'≥ 31 ms (4× the median)' (one class), 'above 4× their class's median' (several), or the floor where it is
    the higher (analysis/spikes.py: a stall's excess over its tokens' pace is above max(factor × median, floor))."""
    factor, floor_ms = stalls.get("spike_factor"), float(stalls.get("min_gap_ms") or 0.0)
    medians = list((stalls.get("baseline_itl_ms") or {}).values())
    if factor is None or not medians:
        return "far above the stream's usual pace"
    if len(medians) > 1:
        return f"above {factor:g}× their class's median" + (f" (and ≥ {floor_ms:g} ms)" if floor_ms else "")
    if floor_ms > factor * medians[0]:
        return f"≥ {floor_ms:g} ms"
    return f"≥ {factor * medians[0]:.0f} ms ({factor:g}× the median)"


TOKEN_SAMPLED = ("stalls", "fluidity")  # objectives whose samples are output tokens (rates per 1k tokens, shares)


def samples_words(o: dict[str, Any] | Any) -> str:
    """An objective's samples with what they count where they are not requests: '6,930 tokens' (a stall rate's,
    fluidity's, a per-token metric's), else the bare count."""
    n, objective = o.get("samples"), ObjectiveId.of(o)
    tokens = objective.metric in TOKEN_SAMPLED or (objective.metric in METRICS and objective.stat in QUANTILES
                                                   and METRICS[objective.metric].basis == "token")
    return f"{n:,} tokens" if tokens and isinstance(n, int) else fmt(n)
