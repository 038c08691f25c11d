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


def test_the_summary_of_recorded_runs_is_unchanged_but_for_added_keys(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(DATA / "golden_run", run_dir)
    res = run_cli("report", str(run_dir), "--no-png", timeout=120)
    assert res.returncode == 1, res.stderr + res.stdout  # the run failed its stall objective, then as now
    before = json.loads((DATA / "golden_summary.json").read_text())
    after = json.loads((run_dir / "summary.json").read_text())
    assert missing_or_changed(before, after) == []
