"""The sentences of an ``Advice``: one per candidate (how many replays it ran, why they stopped, what held it
back), the recommendation in at most three lines (the setting and what it kept; its flags; the objectives it
covers and those judged on the measured run alone) and the measured run's judgment of the objectives the
replay cannot move. Text only; the console, advice.md and report.html print the same words.
"""

from __future__ import annotations

from typing import Any, Optional

from loadgen.analysis.advice_result import Advice, CandidateResult, Headroom, ObjectiveHeadroom

MOST_NAMED = 2  # objectives named in a candidate's line; the rest counted


def num(value: Optional[float], digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}" if abs(value) < 100 else f"{value:,.0f}"


def margin_pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def least(h: Headroom) -> str:
    """The objective that limits the candidate: its margin kept in 95 % of the replays."""
    o = h.least
    return "–" if o is None else f"{o.objective} {margin_pct(o.kept)}"


def needs(needed: Optional[float], samples: Optional[float]) -> str:
    """How many samples would decide an undecided objective, and the run length that takes."""
    if not needed or not samples:
        return ""
    return f"needs {needed:,.0f} samples, has {samples:,.0f}: a run ~{needed / samples:.1f}× as long"


def undecided(h: Headroom) -> str:
    """The objectives not passed with evidence (the scenario's own judgment) in more replays than the rule
    allows, and how much longer a run would have to be for the verdict to decide them."""
    out = []
    for o in h.failing:
        if o.undecided > h.allowed:
            more = needs(o.needed, o.samples)
            out.append(f"{o.objective} in {o.undecided} of {h.replays}" + (f" ({more})" if more else ""))
    return "; not passed with evidence: " + ", ".join(out) if out else ""


def required_of(a: Advice) -> int:
    """Replays of ``a.seeds`` that must hold (every candidate's headroom has the same rule)."""
    h = next((c.headroom for c in a.candidates if c.headroom is not None), None)
    return h.required if h is not None else a.seeds


def rule(a: Advice) -> str:
    return (f"a {a.margin * 100:g} % margin on every objective it covers in {required_of(a)} of {a.seeds} "
            f"replays")


def stopped_early(h: Headroom) -> bool:
    """The replays stopped once more had failed than the rule allows (``Headroom.stopped``)."""
    return h.stopped == "cannot_qualify"


def replays_run(h: Headroom) -> str:
    """How many replays ran and why they stopped."""
    if stopped_early(h):
        return (f"decided after {plural(h.replays, 'replay')}: {h.replays - h.held} missed, more than the "
                f"{h.allowed} of {h.seeds} allowed")
    return f"ran all {plural(h.seeds, 'replay')}, held in {h.held} ({h.required} needed)"


def _short(o: ObjectiveHeadroom) -> str:
    """Why an objective did not hold: undecided (and the samples that would decide it), missed (a value beyond
    the limit: its worst margin), not decided pass, or short of the margin."""
    more = needs(o.needed, o.samples) if o.undecided else ""
    if more:
        return f"{o.objective} undecided in {o.undecided} ({more})"
    if o.worst is not None and o.worst < 0:
        return f"{o.objective} missed in {o.short} (worst margin {margin_pct(o.worst)})"
    if o.undecided:
        return f"{o.objective} not decided pass in {o.undecided}"
    return f"{o.objective} short of the margin in {o.short} (worst {margin_pct(o.worst)})"


def candidate_line(c: CandidateResult) -> str:
    """One plain sentence: whether the candidate holds, its replays, and what held it back (or its least margin)."""
    h = c.headroom
    if h is None:
        return f"{c.label}: one replay, " + ("within every limit" if c.meets_all else
                                             "over the limit on " + ", ".join(c.failed))
    if h.qualifies:
        return f"{c.label}: holds — {replays_run(h)}; least margin kept: {least(h)}"
    named = shortfalls(h)
    return f"{c.label}: fails — {replays_run(h)}" + (f"; {named}" if named else "")


def shortfalls(h: Headroom) -> str:
    """What held a candidate back: the objectives short in the most replays, each why (``_short``); the rest
    counted ("" when none was short)."""
    short = sorted((o for o in h.objectives if o.short), key=lambda o: -o.short)
    named = "; ".join(_short(o) for o in short[:MOST_NAMED])
    return named + (f"; {len(short) - MOST_NAMED} more" if len(short) > MOST_NAMED else "")


def headline(a: Advice) -> str:
    """The recommendation's first line: the setting and what it kept, or that none keeps it and the closest."""
    rec = a.recommendation
    if rec is None:
        near = a.candidates[a.closest] if a.closest is not None else None
        if near is None or near.headroom is None:
            return f"no candidate setting keeps {rule(a)}"
        h = near.headroom
        short = f", {h.shortfall * 100:.1f} points short" if h.shortfall > 0 else ""
        return (f"no candidate setting keeps {rule(a)}; the closest: {near.label} (held in {h.held} of "
                f"{h.replays}; least margin kept {least(h)}{short}{undecided(h)})")
    if rec.headroom is None:
        kept = "meets every objective it covers in its replay"
    else:
        kept = (f"kept a {a.margin * 100:g} % margin on every objective it covers in {rec.headroom.held} of "
                f"{rec.headroom.replays} replays (least margin kept: {least(rec.headroom)})")
    if a.recommended == 0:
        return f"keep the current setting ({rec.label.removesuffix(' (current)')}): it {kept}"
    return f"recommended: {rec.label} — {kept}"


def scope_line(a: Advice) -> str:
    """Which objectives the advice covers, and those judged on the measured run alone (with their decision)."""
    covers = "covers " + (", ".join(a.covers) if a.covers else "no objective (the replay moves none of them)")
    alone = ", ".join(f"{o['objective']} ({o.get('decision') or 'inconclusive'})" for o in a.on_run)
    return covers + (f"; judged on the measured run alone: {alone}" if alone else "")


def recommendation_lines(a: Advice) -> list[str]:
    """The recommendation (else the closest) in at most three lines: what, its flags, what it covers."""
    chosen = a.recommendation or (a.candidates[a.closest] if a.closest is not None else None)
    flags = " ".join(chosen.flags) if chosen is not None and chosen.flags and a.recommended != 0 else ""
    return [headline(a)] + ([f"flags: {flags}"] if flags else []) + [scope_line(a)]


def on_run_line(o: dict[str, Any]) -> str:
    """One objective the replay cannot move, as the measured run judged it, and why."""
    more = needs(o.get("needed"), o.get("samples")) if o.get("decision") == "inconclusive" else ""
    value = "no value" if o.get("value") is None else num(o["value"], 3)
    return (f"{o['objective']} {o.get('comparison', '<=')} {num(o.get('threshold'), 3)}: {value} on the run, "
            f"{o.get('decision') or 'inconclusive'}" + (f" ({more})" if more else "") + f"; {o.get('why', '')}")


def on_run_lines(a: Advice) -> list[str]:
    if not a.on_run:
        return []
    return ["judged on the measured run alone (the replay cannot move them; they rule no setting out):"] + \
        [f"  {on_run_line(o)}" for o in a.on_run]
