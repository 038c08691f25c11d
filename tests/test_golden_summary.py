"""Behaviour kept across refactors: the records of a seeded simulator run (aggressor/victim, 6 s, taken before
the code was regrouped by stage) give the summary.json they gave then, except for keys added since."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.run_helpers import run_cli

DATA = Path(__file__).parent / "data"


def missing_or_changed(before: Any, after: Any, path: str = "") -> list[str]:
    """Where ``after`` lost or changed a value of ``before`` (keys only in ``after`` are additions)."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [d for k, v in before.items()
                for d in (missing_or_changed(v, after[k], f"{path}.{k}") if k in after else [f"{path}.{k}: gone"])]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [d for i, (b, a) in enumerate(zip(before, after)) for d in missing_or_changed(b, a, f"{path}[{i}]")]
    return [] if before == after else [f"{path}: {before!r} → {after!r}"]


def _reported(tmp_path: Path, decision: str) -> tuple[int, dict[str, Any]]:
    """The golden records reported again, their scenario's objectives decided by ``decision``."""
    run_dir = tmp_path / decision
    shutil.copytree(DATA / "golden_run", run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    run["scenario"]["slo"]["decision"] = decision
    (run_dir / "run.json").write_text(json.dumps(run))
    res = run_cli("report", str(run_dir), "--no-png", timeout=120)
    return res.returncode, json.loads((run_dir / "summary.json").read_text())


def test_the_summary_of_recorded_runs_is_unchanged_but_for_added_keys(tmp_path: Path) -> None:
    """Decided on point values, as when the golden summary was taken: every figure and call as then."""
    code, after = _reported(tmp_path, "point")
    assert code == 1  # the run failed its stall objective, then as now
    before = json.loads((DATA / "golden_summary.json").read_text())
    assert missing_or_changed(before, after) == []


def test_on_intervals_the_same_short_run_is_too_short_to_decide(tmp_path: Path) -> None:
    """6 s, 30 requests, 3 spike events: on intervals (the default) nothing but the medians is decided, and
    each undecided objective says how many samples would decide it; the figures are the same."""
    code, after = _reported(tmp_path, "interval")
    assert code == 3 and after["verdict"] == "inconclusive"
    calls = {o["objective"]: o["decision"] for o in after["slo"]}
    assert calls == {"itl_ms.p50": "pass", "itl_ms.p99": "inconclusive", "error_rate.max": "inconclusive",
                     "stalls.max_prefill_induced_per_1k_tokens": "inconclusive"}
    assert all("needs >= " in r for r in after["reasons"]), after["reasons"]
    before = json.loads((DATA / "golden_summary.json").read_text())
    assert after["metrics"] == before["metrics"] and after["stalls"]["count"] == before["stalls"]["count"]
