"""local_target/kubernetes/loadgen.yaml checked offline: every object against Kubernetes' own OpenAPI schemas
(kubernetes-validate bundles them; strict: an unknown field is an error), the pieces wired to each other (the
workers reach the master's Service, both mount the scenario), each command's flags ones loadgen accepts, and
the scenario in the ConfigMap one loadgen loads."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from tests.run_helpers import ROOT

MANIFEST = ROOT / "local_target" / "kubernetes" / "loadgen.yaml"
K8S_VERSION = "1.31.0"


def _docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def _validate(docs: list[dict]) -> list[str]:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra) is not installed")
    problems = []
    for doc in docs:
        try:
            kv.validate(doc, K8S_VERSION, strict=True)
        except kv.ValidationError as exc:
            problems.append(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message}")
    return problems


def _by_name(docs: list[dict]) -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_every_object_is_valid_kubernetes():
    docs = _docs(MANIFEST.read_text())
    assert {d["kind"] for d in docs} == {"ConfigMap", "Deployment", "Service", "NetworkPolicy"}
    assert _validate(docs) == []


@pytest.mark.parametrize("old,new", [("  replicas: 2", "  replicas: two"),
                                     ("          image: loadgen:local\n          command: [\"loadgen\", \"worker\"",
                                      "          imag: loadgen:local\n          command: [\"loadgen\", \"worker\""),
                                     ("    - {name: locust, port: 5557, targetPort: locust}",
                                      "    - {name: locust, port: \"5557\", targetPort: locust}")])
def test_a_broken_copy_fails_the_same_check(old, new):
    text = MANIFEST.read_text()
    assert old in text
    assert _validate(_docs(text.replace(old, new, 1)))


def test_workers_reach_the_master_and_both_run_the_same_scenario():
    objs = _by_name(_docs(MANIFEST.read_text()))
    master = objs[("Deployment", "loadgen-master")]["spec"]["template"]["spec"]
    worker = objs[("Deployment", "loadgen-worker")]["spec"]["template"]["spec"]
    service = objs[("Service", "loadgen-master")]
    m_cmd, w_cmd = master["containers"][0]["command"], worker["containers"][0]["command"]
    assert m_cmd[:2] == ["loadgen", "ui"] and w_cmd[:2] == ["loadgen", "worker"]
    assert m_cmd[2] == w_cmd[2] == "/scenarios/scenario.yaml"
    assert w_cmd[w_cmd.index("--master-host") + 1] == service["metadata"]["name"]
    assert m_cmd[m_cmd.index("--master-bind-host") + 1] == "0.0.0.0"  # reachable from the worker pods
    assert {p["port"] for p in service["spec"]["ports"]} == {5557, 8089}
    assert service["spec"]["selector"] == objs[("Deployment", "loadgen-master")]["spec"]["selector"]["matchLabels"]
    assert master["containers"][0]["image"] == worker["containers"][0]["image"]
    for spec in (master, worker):
        assert spec["volumes"][0]["configMap"]["name"] == "loadgen-scenario"
    policy = objs[("NetworkPolicy", "loadgen-master")]["spec"]["ingress"][0]
    assert policy["from"][0]["podSelector"]["matchLabels"] == \
        objs[("Deployment", "loadgen-worker")]["spec"]["selector"]["matchLabels"]


def test_the_commands_use_flags_loadgen_accepts():
    import typer.main

    from loadgen.cli.app import app

    cli = typer.main.get_command(app)
    for name in ("loadgen-master", "loadgen-worker"):
        deployment = _by_name(_docs(MANIFEST.read_text()))[("Deployment", name)]
        command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
        sub = cli.commands[command[1]]  # type: ignore[attr-defined]
        known = {opt for p in sub.params for opt in p.opts}
        flags = [a for a in command[2:] if a.startswith("--")]
        assert flags and set(flags) <= known, (shlex.join(command), set(flags) - known)


def test_the_configmap_scenario_loads(tmp_path, monkeypatch):
    from loadgen import api

    objs = _by_name(_docs(MANIFEST.read_text()))
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(objs[("ConfigMap", "loadgen-scenario")]["data"]["scenario.yaml"])
    url = objs[("ConfigMap", "loadgen-env")]["data"]["LOADGEN_TARGET_URL"]
    monkeypatch.setenv("LOADGEN_TARGET_URL", url)
    sc = api.load_scenario(scenario)
    assert sc.target.base_url == url and sc.load.rate_per_s == 20


def test_compose_workers_reach_the_master_too():
    """The compose file's master must listen beyond loopback for its worker containers (a private network)."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["loadgen"]["command"]
    assert "--master-bind-host=0.0.0.0" in command
    assert "--master-host=loadgen" in compose["services"]["worker"]["command"]
    assert "5557" not in str(compose["services"]["loadgen"].get("ports", []))  # not published to the host


def test_manifest_path_is_documented():
    assert Path("local_target/kubernetes/loadgen.yaml").as_posix() in (ROOT / "docs/guides/locust.md").read_text()
