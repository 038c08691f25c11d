"""loadgen.api, the Python entry point: its public names are pinned (a change to them is a deliberate edit here),
each resolves, and importing it stays light (no charts, Locust, advisor or dataframe stack until a call needs
them)."""

from __future__ import annotations

import subprocess
import sys

from loadgen import api

PUBLIC = ["Advice", "AdviceError", "CheckResult", "CompareError", "Comparison", "InputError", "LoadgenError",
          "RepeatResult", "RunDirError", "RunResult", "Scenario", "ScenarioError", "ServerFault", "SettingsError",
          "SizeResult", "SweepResult", "TargetError", "advise", "check", "compare", "load_scenario", "repeat",
          "report", "run", "size", "sweep", "ui"]


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


def test_every_error_is_one_tree_a_caller_can_catch_by_decision() -> None:
    """Bad input (exit 2, nothing sent) under InputError, a ValueError; the server's faults under ServerFault;
    all of them under LoadgenError; the old import paths name the same classes."""
    from loadgen.advise.settings import SettingsError
    from loadgen.plan.scenario import ScenarioError
    from loadgen.plan.workload import ServerFault
    from loadgen.run.reporting import RunDirError

    for name in ("ScenarioError", "SettingsError", "AdviceError", "CompareError", "RunDirError"):
        assert issubclass(getattr(api, name), api.InputError) and issubclass(getattr(api, name), ValueError), name
    assert issubclass(api.TargetError, api.ServerFault) and issubclass(api.ServerFault, RuntimeError)
    assert issubclass(api.InputError, api.LoadgenError) and issubclass(api.ServerFault, api.LoadgenError)
    assert (ScenarioError, SettingsError, ServerFault, RunDirError) == (
        api.ScenarioError, api.SettingsError, api.ServerFault, api.RunDirError)


def test_importing_the_api_loads_no_heavy_stack() -> None:
    heavy = {"altair", "locust", "gevent", "vllm", "torch", "polars"}
    code = (f"import loadgen.api, sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r} "
            "or m.startswith(('loadgen.advise', 'loadgen.report', 'loadgen.run'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
