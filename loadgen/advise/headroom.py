"""Headroom: a candidate setting is recommended only if it meets every objective *with a margin*, in nearly every
replay, and with evidence. Pure.

- **Seeds.** Each candidate is replayed under ``seeds`` step-noise seeds (the scenario's seed, then the next
  ones): the run's plan is the same, the jitter of every engine step differs, as between two real runs of one
  seeded scenario.
- **Margin** of an objective in one replay: ``(limit − value) / limit`` for ``<=``, ``(value − limit) / limit``
  for ``>=`` (positive: room). A limit of 0 (``error_rate.max: 0``) has no relative margin: it holds when the
  value is 0.
- **Threshold-defined events.** The stall objectives count gaps above a threshold (``max(spike_factor ×
  baseline ITL, floor)``, ``analysis/spikes.py``): a setting whose gaps sit just above or below it flaps while
  its stall *rate* looks far from the limit. So every replay is also judged by the scenario with that threshold
  lowered by the margin (``spike_factor`` and the floor both × (1 − margin)), and the margins are taken from
  that judgment: a stall objective's value is then the rate of gaps that come within the margin of being
  stalls, and it must itself keep the margin. The other objectives do not depend on the threshold.
- **Evidence.** Every objective must also be decided ``pass`` by the scenario's own judgment of the replay (the
  interval-based verdict where summary.json carries ``decision``; else its point verdict ``passed``): what a
  real run of the setting would be judged. A rate with too few tokens, or a percentile whose interval reaches
  the limit, does not hold however good its point value.
- **The rule.** A replay *holds* when every objective keeps the margin and passes; a candidate qualifies when
  at least ``REQUIRED_SHARE`` of its replays hold. Replays stop once too many have failed for it to qualify
  (the figures then cover the replays run; ``Headroom.stopped`` says which way it ended).
- **What the replay cannot move.** The replay models the server's scheduler and nothing else: every request
  completes (no errors, no timeouts, no network; ``replay.py``) and none reasons. An objective of a metric in
  ``ON_RUN_ONLY`` would come out the same under every setting (``error_rate``: 0 of N, a limit it can only
  leave undecided on a short run) or not at all (the answer phase), so it is judged once, on the measured run,
  and never vetoes a setting: the replays judge the others (``replay_judges``).
"""

from __future__ import annotations

import math
from typing import Any

from loadgen.analysis.advice_result import Headroom, ObjectiveHeadroom
from loadgen.analysis.spikes import config_from
from loadgen.core.vocabulary import ObjectiveId
from loadgen.plan.scenario import Scenario

DEFAULT_MARGIN = 0.10
DEFAULT_SEEDS = 20
REQUIRED_SHARE = 0.95
MIN_SPIKE_FACTOR = 1.0001  # the scenario's own lower bound on spike_factor is > 1
NO_REASONING = "the replay has no reasoning phase"
# metric → why the replay cannot move it: judged on the measured run alone
ON_RUN_ONLY = {"error_rate": "the replay does not model errors, timeouts or the network",
               "ttft_answer_ms": NO_REASONING, "tpot_answer_ms": NO_REASONING, "itl_answer_ms": NO_REASONING}
# Headroom.stopped: every replay asked was run, or they stopped once more had failed than the rule allows
ALL_RUN, CANNOT_QUALIFY = "all_replays", "cannot_qualify"


def replay_judges(o: dict[str, Any]) -> bool:
    """The replay can move this objective (its metric is not in ``ON_RUN_ONLY``)."""
    return ObjectiveId.of(o).metric not in ON_RUN_ONLY


def required(seeds: int) -> int:
    """How many of ``seeds`` replays must hold (95 % of them, rounded up)."""
    return math.ceil(REQUIRED_SHARE * seeds - 1e-9)


def relative_margin(o: dict[str, Any]) -> float | None:
    """The objective's margin as a share of its limit (positive: room); None without a value or with a 0 limit."""
    value, limit = o.get("value"), o.get("threshold")
    if value is None or not limit:
        return None
    room = value - limit if o.get("comparison", "<=") == ">=" else limit - value
    return float(room / abs(limit))


def decided_pass(o: dict[str, Any]) -> bool:
    """Passed with evidence: the interval verdict's ``decision`` where there is one, else the point verdict."""
    if o.get("decision") is not None:
        return bool(o["decision"] == "pass")
    return o.get("passed") is True


def keeps_margin(o: dict[str, Any], margin: float) -> bool:
    """The objective's value keeps ``margin`` (a 0 limit: its value is 0)."""
    rel = relative_margin(o)
    if rel is None:
        return o.get("value") is not None and not o.get("threshold") and o["value"] == 0
    return rel >= margin - 1e-12


def holds(nominal: list[dict[str, Any]], judged: list[dict[str, Any]], margin: float) -> bool:
    """One replay holds: every objective decided pass as the scenario judges it (``nominal``), every one keeping
    the margin as judged with the stall threshold lowered by it (``judged``, in the same order)."""
    return bool(nominal) and all(decided_pass(o) for o in nominal) and all(keeps_margin(o, margin) for o in judged)


def stressed(scenario: Scenario, margin: float) -> Scenario:
    """The scenario with its stall threshold lowered by ``margin``: spike_factor and the floor (min_gap_ms, else
    the itl_ms limit it defaults to) both × (1 − margin). Everything else as it was."""
    slo = scenario.slo
    floor = config_from(slo, scenario.load.max_in_flight).min_gap_ms
    stalls = slo.stalls.model_copy(update={
        "spike_factor": max(slo.stalls.spike_factor * (1 - margin), MIN_SPIKE_FACTOR),
        "min_gap_ms": floor * (1 - margin)})
    return scenario.model_copy(update={"slo": slo.model_copy(update={"stalls": stalls})})


def kept_margin(margins: list[float], seeds: int) -> float:
    """The margin kept in ``REQUIRED_SHARE`` of the ``seeds`` replays (of 20: the second worst), from the
    margins of the replays run (all of them, or fewer when the replays stopped early)."""
    ordered = sorted(margins)
    return ordered[min(seeds - required(seeds), len(ordered) - 1)]


def headroom_of(replays: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]], margin: float,
                seeds: int) -> Headroom:
    """Each objective's margins over the replays ((nominal, stressed) judgments of each), and how many held."""
    out = []
    for i, first in enumerate(replays[0][1]):
        pairs = [(nominal[i], judged[i]) for nominal, judged in replays]
        rel = [m for m in (relative_margin(j) for _, j in pairs) if m is not None]
        needed = [n["needed"] for n, _ in pairs if not decided_pass(n) and n.get("needed")]
        out.append(ObjectiveHeadroom(first["objective"], first.get("comparison", "<="), first["threshold"],
                                     kept_margin(rel, seeds) if rel else None, min(rel) if rel else None,
                                     sum(not (decided_pass(n) and keeps_margin(j, margin)) for n, j in pairs),
                                     sum(not decided_pass(n) for n, _ in pairs), replays[0][0][i].get("samples"),
                                     max(needed) if needed else None))
    held = sum(holds(n, j, margin) for n, j in replays)
    return Headroom(margin, seeds, len(replays), held, required(seeds), out,
                    ALL_RUN if len(replays) >= seeds else CANNOT_QUALIFY)
