"""What ``loadgen compare`` judges against: the verdict change between the two runs (said first, always), and the
change thresholds of the absolute metrics derived from the scenario's own limits.

Verdict change
--------------
Each run's verdict and its objectives' decisions are read from what the run wrote (summary.json's ``verdict`` and
``slo`` entries; a repeat's repeat.json): nothing is analysed again. An objective's decision is its ``decision``
("pass" | "fail" | "inconclusive") where the summary has one, else its ``passed`` (True / False / None). The
verdicts are ordered pass < inconclusive < fail: the new run got *worse* when its verdict is later in that order
(pass → inconclusive, pass → fail, inconclusive → fail), and a worse verdict fails the comparison (exit 1).

Thresholds from the limits
--------------------------
A change of an absolute metric matters relative to the limit it is judged against, so the default threshold of
each is half the scenario's own limit: the stall rate ``stalls_per_1k_tokens`` half of
``slo.stalls.max_per_1k_tokens``, the prefill-induced stall rate half of
``slo.stalls.max_prefill_induced_per_1k_tokens`` (0.1 → 0.05), the error rate half of ``slo.error_rate.max``.
Where both runs state a limit the stricter (smaller) one is used. Where neither does, the fixed fallback applies
(``FALLBACK``: 0.5 stalls per 1k tokens, 1 percentage point of errors) — a run without ``slo.error_rate`` is
judged by the default ``max: 0``, and half of 0 would call any noise a change. A flag given on the command line
overrides all of this.
"""

from __future__ import annotations

from typing import Any

RANK = {"pass": 0, "inconclusive": 1, "fail": 2}
FALLBACK = {"error_rate": 0.01, "stalls_per_1k_tokens": 0.5, "prefill_stalls_per_1k_tokens": 0.5}
LIMIT_SOURCES = {  # compared metric → (slo section, limit key)
    "error_rate": ("error_rate", "max"),
    "stalls_per_1k_tokens": ("stalls", "max_per_1k_tokens"),
    "prefill_stalls_per_1k_tokens": ("stalls", "max_prefill_induced_per_1k_tokens"),
}


def decision(objective: dict[str, Any]) -> str:
    """An objective's decision: its ``decision`` where stated, else read from ``passed``."""
    stated = objective.get("decision")
    if stated in RANK:
        return str(stated)
    return {True: "pass", False: "fail"}.get(objective.get("passed"), "inconclusive")  # type: ignore[arg-type]


def _by_name(slo: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(o["objective"]): o for o in slo}


def verdict_change(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``base`` → ``new`` verdict (each a summary.json, or a repeat's summary-like dict): whether it changed and
    got worse, and every objective of either run with both decisions and values (``changed`` marks those whose
    decision changed; an objective one run lacks is "absent" there)."""
    b_verdict, n_verdict = str(base.get("verdict")), str(new.get("verdict"))
    b_slo, n_slo = _by_name(base.get("slo") or []), _by_name(new.get("slo") or [])
    objectives = []
    for name in list(b_slo) + [n for n in n_slo if n not in b_slo]:
        b, n = b_slo.get(name), n_slo.get(name)
        row = {"objective": name, "base": decision(b) if b else "absent", "new": decision(n) if n else "absent",
               "base_value": b.get("value") if b else None, "new_value": n.get("value") if n else None,
               "comparison": (n or b or {}).get("comparison", "<="),
               "base_threshold": b.get("threshold") if b else None, "new_threshold": n.get("threshold") if n else None}
        row["changed"] = row["base"] != row["new"]
        objectives.append(row)
    worse = RANK.get(n_verdict, 1) > RANK.get(b_verdict, 1)
    return {"base": b_verdict, "new": n_verdict, "changed": b_verdict != n_verdict, "worse": worse,
            "objectives_changed": [o["objective"] for o in objectives if o["changed"]], "objectives": objectives}


def change_line(change: dict[str, Any]) -> str:
    """One line, verdict first: ``verdict PASS → FAIL (worse): itl_ms.p99 pass → fail``."""
    head = f"verdict {change['base'].upper()} → {change['new'].upper()}"
    head += " (worse)" if change["worse"] else " (changed)" if change["changed"] else " (unchanged)"
    moved = [f"{o['objective']} {o['base']} → {o['new']}" for o in change["objectives"] if o["changed"]]
    return head + (": " + "; ".join(moved) if moved else "")


def scenario_limit(scenario: dict[str, Any], metric: str) -> float | None:
    """The limit the scenario (run.json's ``scenario``) states for a compared absolute metric, if any."""
    section, key = LIMIT_SOURCES[metric]
    value = ((scenario.get("slo") or {}).get(section) or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def derived_thresholds(scenarios: list[dict[str, Any]], given: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    """Per absolute metric, its change threshold and where it came from: ``given`` (a flag's value, None = not
    given), else half the stricter of the runs' scenario limits, else the fallback."""
    out: dict[str, dict[str, Any]] = {}
    for metric, (section, key) in LIMIT_SOURCES.items():
        if given.get(metric) is not None:
            out[metric] = {"value": float(given[metric]), "source": "flag"}  # type: ignore[arg-type]
            continue
        limits = [x for x in (scenario_limit(sc, metric) for sc in scenarios) if x is not None]
        if limits:
            out[metric] = {"value": min(limits) / 2, "source": f"half of slo.{section}.{key} ({min(limits):g})"}
        else:
            out[metric] = {"value": FALLBACK[metric], "source": f"fallback: no slo.{section}.{key} in either run"}
    return out


MISS_FIGURES = ("requests", "share", "goodput_lost")  # per cause, from each run's summary["misses"]["by_cause"]


def miss_change(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Per cause, the misses of ``base`` → ``new`` (each a summary.json's dict) from their ledgers
    (``summary["misses"]``, docs/causes.md): requests missed, share of misses and goodput lost on each side and
    the change (new − base; a cause one run lacks counts 0 there). ``ledger`` says which runs have one: a run
    written before the ledger has none, and then no cause is compared."""
    b, n = base.get("misses"), new.get("misses")
    ledger = {"base": isinstance(b, dict), "new": isinstance(n, dict)}
    if not (isinstance(b, dict) and isinstance(n, dict)):
        return {"ledger": ledger, "causes": []}
    b_by, n_by = b.get("by_cause") or {}, n.get("by_cause") or {}
    rows = []
    for cause in {*b_by, *n_by}:
        x, y = b_by.get(cause) or {}, n_by.get(cause) or {}
        row: dict[str, Any] = {"cause": cause}
        for fig in MISS_FIGURES:
            row[f"base_{fig}"], row[f"new_{fig}"] = x.get(fig, 0), y.get(fig, 0)
            row[f"delta_{fig}"] = row[f"new_{fig}"] - row[f"base_{fig}"]
        rows.append(row)
    rows.sort(key=lambda r: (-max(r["base_requests"], r["new_requests"]), r["cause"]))
    totals = {side: {"requests": s.get("requests", 0), "of": s.get("of", 0), "share": s.get("share")}
              for side, s in (("base", b), ("new", n))}
    return {"ledger": ledger, **totals, "delta_requests": totals["new"]["requests"] - totals["base"]["requests"],
            "causes": rows}
