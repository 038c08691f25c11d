"""loadgen.api, the Python entry point: its public names are pinned (a change to them is a deliberate edit here),
each resolves, and importing it stays light (no charts, Locust, advisor or dataframe stack until a call needs
them)."""

from __future__ import annotations

import subprocess
import sys

from loadgen import api

PUBLIC = ["Advice", "AdviceError", "CheckResult", "CompareError", "Comparison", "RunResult", "Scenario",
          "ScenarioError", "SettingsError", "SweepResult", "TargetError", "advise", "check", "compare",
          "load_scenario", "report", "run", "sweep", "ui"]


def test_the_public_names_are_pinned_and_sorted() -> None:
    assert api.__all__ == PUBLIC


def test_every_public_name_resolves_to_the_stage_that_defines_it() -> None:
    from loadgen.advise.whatif import AdviceError
    from loadgen.analysis.result import RunResult
    from loadgen.run.comparison import CompareError
    from loadgen.run.target import TargetError

    for name in PUBLIC:
        assert getattr(api, name) is not None, name
        assert name in dir(api), name
    assert (api.RunResult, api.TargetError, api.CompareError, api.AdviceError) == (
        RunResult, TargetError, CompareError, AdviceError)
    assert issubclass(api.ScenarioError, ValueError)


def test_importing_the_api_loads_no_heavy_stack() -> None:
    heavy = {"altair", "locust", "gevent", "vllm", "torch", "polars"}
    code = (f"import loadgen.api, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} "
            "or m.startswith(('loadgen.advise', 'loadgen.report', 'loadgen.run'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
