"""Sessions run on the asyncio engine only (drivers/sessions.py): Locust's users would send a session's calls as
unrelated requests. So each Locust entry point — ``run --engine locust``, the web UI (``loadgen ui``) and a worker
(``loadgen worker``) — refuses a scenario with a session class in one line naming the class (exit 2), before
Locust is loaded or anything sent: one rule, ``api.refuse_locust_sessions``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from loadgen import api
from loadgen.plan.scenario import Scenario, ScenarioError
from tests.conftest import scenario_file
from tests.run_helpers import ROOT, run_cli

PLAIN = {"name": "plain", "prompt_tokens": {"dist": "fixed", "value": 50}, "output_tokens": {"dist": "fixed", "value": 5}}
LINE = r"^sessions run on the asyncio engine, not Locust \(class 'agent' has a session\): [^\n]*$"
# a target no Locust path could use (its key's variable unset: TargetError before serving or sending), so that
# an entry point that forgot the refusal fails fast with another error rather than serving or waiting
DOC: dict[str, Any] = {
    "name": "refused", "target": {"base_url": "http://127.0.0.1:9/v1", "model": "m",
                                  "api_key_env": "LOADGEN_TEST_NO_SUCH_KEY"},
    "load": {"arrival": "constant", "rate_per_s": 1, "requests": 1},
    "workload": {"classes": [PLAIN, {"name": "agent", "session": {"trace": {
        "path": str(ROOT / "tests" / "data" / "agent_traces" / "loadgen_sessions.jsonl"), "format": "loadgen"}}}]}}


@pytest.fixture
def no_locust_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Locust and loadgen's Locust modules out of ``sys.modules`` for the test (put back after it): whether an
    entry point loads them is then seen whatever ran before in this process (pytest-xdist's order, or a Locust
    test of the same session)."""
    for name in [n for n in sys.modules if n == "locust" or n.startswith(("locust.", "loadgen.run.locust_"))]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.usefixtures("no_locust_loaded")
def test_run_on_the_locust_engine_refuses_a_session_class(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=LINE):  # the CLI: exit 2
        api.run(Scenario.model_validate(DOC), engine="locust", out=tmp_path / "run")
    assert not (tmp_path / "run").exists() and "locust" not in sys.modules  # refused before Locust is loaded


@pytest.mark.usefixtures("no_locust_loaded")
def test_the_web_ui_refuses_a_session_class_before_it_serves() -> None:
    with pytest.raises(ScenarioError, match=LINE):
        api.ui(Scenario.model_validate(DOC))
    assert "locust" not in sys.modules


def test_the_refusal_names_every_session_class_and_passes_a_scenario_without_one() -> None:
    plain = Scenario.model_validate({**DOC, "workload": {"classes": [PLAIN]}})
    api.refuse_locust_sessions(plain, "unused")  # no error
    two = {**DOC, "workload": {"classes": [DOC["workload"]["classes"][1], {**DOC["workload"]["classes"][1],
                                                                            "name": "helper"}]}}
    with pytest.raises(ScenarioError, match=r"\(classes 'agent', 'helper' have a session\): drop it$"):
        api.refuse_locust_sessions(Scenario.model_validate(two), "drop it")


@pytest.mark.parametrize("command", ["ui", "worker"])
def test_the_cli_ui_and_worker_exit_2_with_the_one_line(tmp_path: Path, command: str) -> None:
    res = run_cli(command, str(scenario_file(tmp_path, json.dumps(DOC))), timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "sessions run on the asyncio engine, not Locust (class 'agent' has a session)" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
