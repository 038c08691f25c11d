"""`loadgen compare`: the bootstrap's statistics, and the verdict on a planted regression vs an identical rerun."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loadgen.analysis.compare import RunSamples, poisson_weights, status_of, weighted_quantile
from tests.run_helpers import run_cli

SHORT = ["--no-progress", "--no-png", "--set", "load.duration_s=6", "--set", "load.rate_per_s=8",
         "--set", "load.warmup_s=1"]


def test_weighted_quantile_with_unit_weights_is_the_plain_quantile():
    rng = np.random.default_rng(1)
    values = rng.lognormal(size=500)
    owner = rng.integers(0, 50, size=500)
    for q in (0.5, 0.9, 0.99):
        got = weighted_quantile(values, owner, np.ones((1, 50)), q)[0]
        assert got == np.quantile(values, q, method="inverted_cdf")


def test_weighted_quantile_follows_the_weights():
    values, owner = np.array([1.0, 2.0, 3.0, 4.0]), np.array([0, 1, 2, 3])
    w = np.array([[1, 1, 1, 1], [0, 0, 0, 5], [3, 0, 0, 1], [0, 0, 0, 0]], dtype=float)
    got = weighted_quantile(values, owner, w, 0.5)
    assert list(got[:3]) == [2.0, 4.0, 1.0] and np.isnan(got[3])


def test_status_needs_the_whole_interval_beyond_the_threshold():
    assert status_of(0.12, 0.30, 0.10) == "regressed"
    assert status_of(0.05, 0.30, 0.10) == "uncertain"
    assert status_of(-0.05, 0.08, 0.10) == "unchanged"
    assert status_of(-0.40, -0.15, 0.10) == "improved"


def _samples(seqs: list[int]) -> RunSamples:
    n = len(seqs)
    z = np.zeros(n)
    return RunSamples(z, z, z, np.ones(n, bool), np.zeros(n, bool), np.ones(n, bool), z, z, np.array([]),
                      np.array([], dtype=np.int64), 1.0, np.array(seqs))


def test_paired_weights_follow_the_plan_sequence_number():
    base, new = _samples([1, 2, 3, 5]), _samples([5, 3, 2, 1, 9])
    wb, wn = poisson_weights(base, new, 200, True, np.random.default_rng(0))
    for i, seq in enumerate([1, 2, 3, 5]):
        assert (wb[:, i] == wn[:, [5, 3, 2, 1, 9].index(seq)]).all()
    wb, wn = poisson_weights(base, new, 200, False, np.random.default_rng(0))
    assert not (wb[:, 0] == wn[:, 3]).all()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same seeded plan three times: a baseline, an identical rerun, and the simulator slowed by 20%."""
    root = tmp_path_factory.mktemp("compare")
    out = {}
    for name, scale in (("base", 1.0), ("same", 1.0), ("slow", 1.2)):
        out[name] = root / name
        res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out[name]), *SHORT,
                      "--set", f"target.simulator.time_scale={scale}")
        assert res.returncode == 0, res.stderr
    return out


@pytest.mark.slow
def test_planted_20_percent_slowdown_is_a_regression(runs):
    res = run_cli("compare", str(runs["base"]), str(runs["slow"]))
    assert res.returncode == 1, res.stdout + res.stderr
    doc = json.loads((runs["slow"] / "compare.json").read_text())
    by = {m["metric"]: m for m in doc["metrics"]}
    assert doc["verdict"] == "regressed" and doc["paired"]
    for metric in ("itl_ms.p50", "tpot_ms.p50", "e2e_ms.p99"):
        assert by[metric]["status"] == "regressed", by[metric]
        assert 0.10 < by[metric]["ci_low"] and by[metric]["ci_high"] < 0.30  # the planted +20%, give or take
        assert 0.17 < by[metric]["worsening"] < 0.25
    assert "REGRESSED" in res.stdout and "itl_ms.p50" in (runs["slow"] / "compare.md").read_text()


@pytest.mark.slow
def test_identical_rerun_passes(runs):
    out = runs["base"].parent / "cmp-same"
    res = run_cli("compare", str(runs["base"]), str(runs["same"]), "--out", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads((out / "compare.json").read_text())
    assert doc["verdict"] == "ok" and not doc["regressed"]
    itl = next(m for m in doc["metrics"] if m["metric"] == "itl_ms.p50")
    assert itl["status"] == "unchanged" and abs(itl["worsening"]) < 0.02
    assert "no regression" in res.stdout


@pytest.mark.slow
def test_bad_input_exits_2(runs, tmp_path):
    res = run_cli("compare", str(runs["base"]), str(tmp_path))
    assert res.returncode == 2 and "no run.json" in res.stderr
    res = run_cli("compare", str(runs["base"]), str(runs["same"]), "--metric", "ttft_ms.p42")
    assert res.returncode == 2 and "unknown metric" in res.stderr
    res = run_cli("compare", str(runs["base"]), str(runs["same"]), "--confidence", "1.5")
    assert res.returncode == 2 and "--confidence" in res.stderr
