"""``loadgen size``: the sizing arithmetic (analysis/sizing.py) and the command over a recorded run (the golden
run's records: no load is sent). The Done-when simulation is tests/test_sizing_simulation.py."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from loadgen.analysis import intervals as iv
from loadgen.analysis import sizing
from loadgen.analysis.size_result import planned_deff, weighted_deff
from tests.run_helpers import run_cli

DATA = Path(__file__).parent / "data"


def test_smallest_n_is_the_first_size_with_the_power() -> None:
    assert sizing.smallest_n(lambda n: 1.0 if n >= 137 else 0.0, 0.9, 1) == 137
    assert sizing.smallest_n(lambda n: 1.0 if n >= 137 else 0.0, 0.9, 5000) == 137
    assert sizing.smallest_n(lambda n: 0.0, 0.9, 1) is None  # past MAX_SAMPLES: not practical


def test_a_p99_with_every_pilot_sample_below_the_limit_needs_the_order_statistics_minimum() -> None:
    """At the pilot's estimate (assurance 0.5) a p99 whose samples are all below the limit needs just enough
    samples for the interval's upper end to exist (n >= 367 at 95 %). At the default assurance, 126 such samples
    cannot say the share above the limit is under 1 % (its 80 % bound is 1.3 %): sized at the estimate and
    flagged; 1,000 can, and the size is then larger than the minimum."""
    first = next(n for n in range(100, 1000) if iv.order_ranks(n, 0.99, 0.95)[1] is not None)
    at_estimate = sizing.quantile_needed(1.0, 126, 0.99, 0.95, 0.8, assurance=0.5)
    assert at_estimate.direction == "pass" and at_estimate.reliable and first <= (at_estimate.n or 0) <= first + 10
    short = sizing.quantile_needed(1.0, 126, 0.99, 0.95, 0.8)
    assert not short.reliable and short.n == at_estimate.n
    assured = sizing.quantile_needed(1.0, 1000, 0.99, 0.95, 0.8)
    assert assured.reliable and (assured.n or 0) > first + 10


def test_the_size_grows_with_the_design_effect_and_the_power() -> None:
    """n_eff is sized, then multiplied by the design effect; with the pilot's noise counted its own n_eff is
    smaller too, so more than that."""
    one = sizing.quantile_needed(0.995, 5000, 0.99, 0.95, 0.8, assurance=0.5).n or 0
    three = sizing.quantile_needed(0.995, 5000, 0.99, 0.95, 0.8, deff=3.0, assurance=0.5).n or 0
    assert three == pytest.approx(3 * one, rel=0.01)
    assured = sizing.quantile_needed(0.995, 5000, 0.99, 0.95, 0.8).n or 0
    assert (sizing.quantile_needed(0.995, 5000, 0.99, 0.95, 0.8, deff=3.0).n or 0) > 3 * assured
    assert (sizing.quantile_needed(0.995, 5000, 0.99, 0.95, 0.95).n or 0) > assured


def test_each_kind_is_certified_the_way_its_estimate_points() -> None:
    assert sizing.quantile_needed(0.97, 3000, 0.99, 0.95, 0.8).direction == "fail"
    assert sizing.proportion_needed(0, 126, 0.01, "<=", 0.95, 0.8).direction == "pass"
    assert sizing.proportion_needed(50, 1000, 0.95, ">=", 0.95, 0.8).direction == "fail"
    assert sizing.rate_needed(30, 100.0, 0.1, "<=", 0.95, 0.8).direction == "fail"
    assert sizing.rate_needed(3, 100.0, 0.1, "<=", 0.95, 0.8).direction == "pass"
    assert sizing.mean_needed(40.0, 5.0, 200, 50.0, "<=", 0.95, 0.8).direction == "pass"


def test_an_estimate_on_the_limit_cannot_be_decided() -> None:
    for need in (sizing.quantile_needed(0.99, 1000, 0.99, 0.95, 0.8),
                 sizing.proportion_needed(10, 1000, 0.01, "<=", 0.95, 0.8),
                 sizing.rate_needed(10, 100.0, 0.1, "<=", 0.95, 0.8)):
        assert need.n is None and need.direction is None and need.note == sizing.ON_LIMIT


def test_a_pilot_within_its_own_noise_of_the_limit_is_flagged() -> None:
    """3 stalls where the limit allows 5 in that exposure: the pilot cannot tell at 80 %: sized at the estimate,
    flagged, with the advice; a long pilot with the same rate can."""
    short = sizing.rate_needed(3, 50.0, 0.1, "<=", 0.95, 0.8)
    assert not short.reliable and short.n is not None and short.note == sizing.UNRELIABLE
    assert sizing.rate_needed(300, 5000.0, 0.1, "<=", 0.95, 0.8).reliable


def test_the_rate_power_counts_the_dispersion_the_verdict_will_measure() -> None:
    """Over-dispersed stalls (bursts) need more exposure: about D times the Poisson one."""
    poisson = sizing.rate_needed(500, 10_000.0, 0.1, "<=", 0.95, 0.8).n or 0
    bursty = sizing.rate_needed(500, 10_000.0, 0.1, "<=", 0.95, 0.8, dispersion=3.0).n or 0
    assert 2.0 * poisson <= bursty <= 4.0 * poisson


def test_the_power_functions_agree_with_their_decision_rules() -> None:
    """The proportion's power at a size is the share of binomial draws the mid-p interval decides (exactly)."""
    n, p = 800, 0.004
    power = sizing.proportion_power(n, p, 0.01, "<=", 0.95, "pass")
    ks = np.arange(0, 40)
    decided = np.array([iv.decide("<=", 0.01, iv.binomial_interval(int(k), n, 0.95)) == "pass" for k in ks])
    assert power == pytest.approx(float(iv.stats.binom.pmf(ks[decided], n, p).sum()), abs=1e-9)


def test_regression_sizes_follow_the_textbook_formula() -> None:
    """n = 2 (z₁₋α/₂ + z₁₋β)² V / Δ²: a quarter of the change needs 16 times the samples."""
    za, zb = iv.stats.norm.ppf(0.975), iv.stats.norm.ppf(0.8)
    assert sizing.regression_n(1.0, 0.1, 0.95, 0.8) == pytest.approx(2 * (za + zb) ** 2 / 0.01)
    assert sizing.regression_n(1.0, 0.025, 0.95, 0.8) == pytest.approx(16 * sizing.regression_n(1.0, 0.1, 0.95, 0.8))
    assert sizing.regression_n(1.0, 0.0, 0.95, 0.8) is None
    # an exponential's p90: f ξ = 0.1 × ln 10, so V = 0.09 / (0.1 ln 10)² ≈ 1.70 (the secant over 0.875-0.925
    # puts f 2 % low: V 4 % high, on the safe side)
    x = np.random.default_rng(1).exponential(1.0, 200_000)
    v = sizing.quantile_unit_variance(x, 0.9)
    assert 1.0 <= v / (0.09 / (0.1 * math.log(10)) ** 2) <= 1.08


def test_the_design_effect_of_clustered_samples_is_measured_and_bounded() -> None:
    rng = np.random.default_rng(2)
    request = np.repeat(np.arange(400), 30)
    iid = rng.lognormal(0, 0.5, len(request))
    clustered = np.repeat(rng.lognormal(0, 0.5, 400), 30) * rng.lognormal(0, 0.2, len(request))
    w = np.ones(len(request))
    limit = float(np.quantile(iid, 0.9))
    assert weighted_deff((iid <= limit).astype(float), [request], w) < 1.5
    assert weighted_deff((clustered <= float(np.quantile(clustered, 0.9))).astype(float), [request], w) > 5
    assert planned_deff(clustered, w, [request], 0.9, limit) >= weighted_deff(
        (clustered <= float(np.quantile(clustered, 0.9))).astype(float), [request], w)


# ---- the command --------------------------------------------------------------------------------------------
@pytest.fixture
def golden(tmp_path: Path) -> Path:
    run_dir = tmp_path / "golden"
    shutil.copytree(DATA / "golden_run", run_dir)
    return run_dir


def test_size_from_a_recorded_run_prints_json_for_machines(golden: Path) -> None:
    res = run_cli("size", "--from", str(golden), "--json", "--power", "90%", timeout=120)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rows = {r["objective"]: r for r in doc["objectives"]}
    assert set(rows) >= {"itl_ms.p50", "itl_ms.p99", "error_rate.max", "stalls.max_prefill_induced_per_1k_tokens"}
    assert rows["itl_ms.p99"]["kind"] == "token quantile" and rows["itl_ms.p99"]["unit"] == "tokens"
    assert rows["stalls.max_prefill_induced_per_1k_tokens"]["kind"] == "rate"
    assert doc["options"]["power"] == 0.9
    sized = [r for r in doc["objectives"] if r["duration_s"] is not None]
    assert sized and doc["recommended"]["load.duration_s"] == math.ceil(max(r["duration_s"] for r in sized))


def test_size_prints_a_table_and_the_recommendation(golden: Path) -> None:
    res = run_cli("size", "--from", str(golden), "--regression", "20%", timeout=120)
    assert res.returncode == 0, res.stderr
    assert "recommended: load.duration_s:" in res.stdout and "compare 20%" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--power", "150%"], "--power 150%"), (["--confidence", "20%"], "--confidence 20%"),
    (["--regression", "ten"], "--regression 'ten'"), (["--regression", "5%", "--threshold", "10%"],
                                                       "--regression 5%"), ([], None)])
def test_bad_input_is_one_line_and_exit_2(golden: Path, tmp_path: Path, args: list[str],
                                          message: str | None) -> None:
    target = golden if message else tmp_path / "not-a-run"
    res = run_cli("size", "--from", str(target), *args, timeout=60)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1
    assert (message or "no run.json") in res.stderr


@pytest.mark.slow
def test_size_runs_a_pilot_of_the_scenario_on_its_target(tmp_path: Path) -> None:
    """Without --from: --pilot-duration seconds of the scenario (its 60 s and until: decided set aside) against the
    embedded simulator, kept under reports/, then sized."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps({
        "name": "pilot", "seed": 2, "target": {"base_url": "embedded", "model": "auto", "api": "chat",
                                               "simulator": {"preset": "a100-llama-7b"}},
        "load": {"arrival": "poisson", "rate_per_s": 15, "duration_s": 60, "until": "decided",
                 "max_duration_s": 600},
        "workload": {"classes": [{"name": "c", "prompt_tokens": {"dist": "fixed", "value": 200},
                                  "output_tokens": {"dist": "fixed", "value": 20}}]},
        "slo": {"ttft_ms": {"p50": 5000, "p99": 5000}}}))
    res = run_cli("size", str(scenario), "--pilot-duration", "3", "--json", timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    pilot = Path(doc["pilot"]) if Path(doc["pilot"]).is_absolute() else tmp_path / doc["pilot"]
    run = json.loads((pilot / "run.json").read_text())
    assert run["scenario"]["load"]["duration_s"] == 3 and run["scenario"]["load"]["until"] == "duration"
    rows = {r["objective"]: r for r in doc["objectives"]}
    assert rows["ttft_ms.p50"]["decision"] == "pass" and rows["ttft_ms.p99"]["requests"] >= 367
    assert doc["recommended"]["load.duration_s"] >= 367 / doc["request_rate_per_s"] - 1
