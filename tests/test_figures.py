"""The figures people quote (analysis/figures.py, docs/figures.md): cost per million tokens from a declared price,
energy per token from the GPUs' power metrics (the counter's delta and the power's integral agree), the MLPerf
Endpoints convention (tokens/s per user = 1000 / TPOT p90), a sweep's Pareto front, and absent inputs giving
absent figures with their reason, never 0. Pure tests first (milliseconds); then one short embedded-simulator
run whose energy per token is checked against the simulator's own energy (local_target/sim/power.py)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import polars as pl
import pytest
import yaml

from local_target.sim import power
from loadgen import api

from loadgen.analysis import figures as fig
from loadgen.drivers.scrape import Scraper, parse_power
from loadgen.plan.scenario import Scenario
from loadgen.report.llmd_export import benchmark_report

NS = 1_000_000_000


def test_cost_per_million_tokens_is_the_price_of_the_measured_hours_over_the_tokens() -> None:
    # 3.60 per hour for 100 s is 0.10; over 100,000 tokens that is 1.00 per million
    assert fig.cost_per_1m_tokens(3.6, 100.0, 100_000) == pytest.approx(1.0)
    out = fig.cost_figures(SimpleNamespace(price_per_hour=3.6, currency="EUR"), 100.0, 100_000, 400_000)
    assert out["cost_per_1m_output_tokens"] == pytest.approx(1.0)
    assert out["cost_per_1m_total_tokens"] == pytest.approx(0.25)
    assert out["currency"] == "EUR" and out["absent"] == {}


def test_without_a_price_or_tokens_the_cost_is_absent_and_says_why() -> None:
    out = fig.cost_figures(None, 100.0, 1000, 2000)
    assert "cost_per_1m_output_tokens" not in out
    assert out["absent"]["cost_per_1m_output_tokens"] == "no cost.price_per_hour declared in the scenario"
    none = fig.cost_figures(SimpleNamespace(price_per_hour=2.0, currency="USD"), 10.0, 0, 0)
    assert none["cost_per_1m_output_tokens"] is None and none["absent"]["cost_per_1m_total_tokens"]


def _power_w(t_s: float) -> float:
    return 300.0 + 100.0 * math.sin(t_s / 3.0)


def _energy_j(t_s: float) -> float:  # ∫ of _power_w from 0, plus what the GPUs used before
    return 5_000.0 + 300.0 * t_s + 300.0 * (1.0 - math.cos(t_s / 3.0))


def _scrapes(names: tuple[str, ...] = (fig.POWER_W, fig.ENERGY_J)) -> pl.DataFrame:
    rows = []
    for i in range(61):  # every 0.5 s for 30 s
        t = i * 0.5
        rows += [(int(t * NS), name, _power_w(t) if name == fig.POWER_W else _energy_j(t)) for name in names]
    return pl.DataFrame(rows, schema={"t_ns": pl.Int64, "name": pl.String, "value": pl.Float64}, orient="row")


def test_the_energy_counter_and_the_integral_of_power_agree_over_a_window_between_scrapes() -> None:
    t0, t1 = int(2.3 * NS), int(27.9 * NS)
    truth = _energy_j(27.9) - _energy_j(2.3)
    counter, how = fig.window_energy(_scrapes(), t0, t1)
    integral, how2 = fig.window_energy(_scrapes((fig.POWER_W,)), t0, t1)
    assert (how, how2) == ("counter", "integral")
    assert counter == pytest.approx(truth, rel=1e-3)
    assert integral == pytest.approx(truth, rel=1e-3)
    assert integral == pytest.approx(counter, rel=2e-3)


def test_energy_figures_divide_the_window_energy_by_tokens_and_the_window() -> None:
    t0, t1 = 2 * NS, 12 * NS
    out = fig.energy_figures(_scrapes(), (t0, t1), True, output_tokens=1000, total_tokens=5000)
    energy = _energy_j(12) - _energy_j(2)
    assert out["energy_j_per_output_token"] == pytest.approx(energy / 1000, rel=1e-3)
    assert out["energy_j_per_total_token"] == pytest.approx(energy / 5000, rel=1e-3)
    assert out["power_w_mean"] == pytest.approx(energy / 10, rel=1e-3)
    assert out["energy_source"] == "counter" and out["absent"] == {}


@pytest.mark.parametrize(("server", "declared", "window", "why"), [
    (None, False, (0, NS), "no target.power_metrics declared"),
    (None, True, (0, NS), "no power metrics were scraped"),
    (_scrapes(), True, None, "no measured requests"),
    (_scrapes(), True, (40 * NS, 50 * NS), "the power scrapes do not cover the measured window"),
])
def test_missing_power_inputs_leave_the_energy_figures_absent_with_the_reason(
        server: pl.DataFrame | None, declared: bool, window: tuple[int, int] | None, why: str) -> None:
    out = fig.energy_figures(server, window, declared, 100, 200)
    assert out == {"absent": dict.fromkeys(("energy_j_per_output_token", "energy_j_per_total_token",
                                            "power_w_mean"), why)}


def test_tokens_per_second_per_user_is_1000_over_tpot_p90() -> None:
    metrics = {"ttft_ms": {"p90": 120.0, "p99": 300.0}, "tpot_ms": {"p90": 20.0, "p50": 10.0}}
    assert fig.mlperf(metrics) == {"ttft_p90_ms": 120.0, "tpot_p90_ms": 20.0, "tokens_per_s_per_user": 50.0,
                                   "absent": {}}
    one_token = fig.mlperf({"ttft_ms": {"p90": 5.0}, "tpot_ms": {"p90": None}})
    assert one_token["tokens_per_s_per_user"] is None
    assert one_token["absent"] == dict.fromkeys(("tpot_p90_ms", "tokens_per_s_per_user"),
                                                "no request had more than one output token")
    burst = fig.mlperf({"ttft_ms": {"p90": 5.0}, "tpot_ms": {"p90": 0.0}})  # every token in one chunk
    assert burst["tokens_per_s_per_user"] is None and "is 0" in burst["absent"]["tokens_per_s_per_user"]
    assert fig.console_line({"mlperf": burst}) == ("figures: MLPerf TTFT p90 5 ms · tok/s/user: TPOT p90 is 0 "
                                                    "(the tokens came at once)")


def test_the_pareto_front_keeps_the_steps_no_other_beats_on_both_axes() -> None:
    # (tokens/s per user, output tokens/s) of five concurrency steps: 1, 2, 4, 8, 16 users
    points = [(90.0, 90.0), (85.0, 170.0), (60.0, 160.0), (70.0, 560.0), (40.0, 540.0)]
    assert fig.pareto(points) == [0, 1, 3]  # 4 users is beaten by 2 users, 16 by 8
    assert fig.pareto([(1.0, 1.0), (None, 5.0), (1.0, 1.0)]) == [0, 2]  # ties both stay; a missing value: none


def test_a_sweeps_pareto_takes_each_loads_last_attempt_and_keeps_the_undominated_steps() -> None:
    def step(load: float, tpot_p90: float | None, out_per_s: float | None) -> SimpleNamespace:
        return SimpleNamespace(load=load, metrics={"tpot_ms": {"p90": tpot_p90}}, output_tokens_per_s=out_per_s,
                               run_dir=f"steps/{load:g}")
    steps = [step(1, 10.0, 100.0), step(2, 12.5, 150.0), step(4, 25.0, 140.0), step(8, 20.0, 500.0),
             step(8, 16.0, 520.0), step(16, None, 900.0)]  # 8 users ran again; 16 has no TPOT: on no front
    front = fig.pareto_steps(steps)
    assert [(p["load"], p["tokens_per_s_per_user"], p["output_tokens_per_s"]) for p in front] == [
        (1, 100.0, 100.0), (2, 80.0, 150.0), (8, 62.5, 520.0)]
    assert front[2]["run_dir"] == "steps/8"


def test_power_exporters_are_read_in_watts_and_joules_summed_over_gpus() -> None:
    dcgm = ('# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n'
            'DCGM_FI_DEV_POWER_USAGE{gpu="0",UUID="GPU-a",Hostname="h"} 250.5\n'
            'DCGM_FI_DEV_POWER_USAGE{gpu="1",UUID="GPU-b",Hostname="h"} 249.5\n'
            'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="0"} 1.5e+06\n'
            'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{gpu="1"} 500000\n'
            'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 60\n')
    assert parse_power(dcgm) == {"gpu_power_w": 500.0, "gpu_energy_j": 2000.0}  # mJ → J
    smi = 'nvidia_smi_power_draw_watts{uuid="x",name="NVIDIA H100"} 412.25\n'
    assert parse_power(smi) == {"gpu_power_w": 412.25}
    assert parse_power('DCGM_FI_DEV_POWER_USAGE{gpu="0"} NaNx\n') is None


def test_power_urls_are_summed_at_one_instant_and_only_the_targets_own_host_gets_its_headers() -> None:
    scraper = Scraper("http://gw:8000/metrics", {"authorization": "Bearer sk-secret"},
                      power=["/gpu/metrics", "http://dcgm:9400/metrics"])
    power = scraper.power_scraper()
    assert power is not None
    seen: dict[str, str | None] = {}
    stop = asyncio.Event()

    def answer(request: httpx.Request) -> httpx.Response:
        seen[str(request.url)] = request.headers.get("authorization")
        if len(seen) == 2:
            stop.set()  # both answered: this is the last scrape
        watts = 100.0 if request.url.host == "gw" else 300.0
        return httpx.Response(200, text=f'DCGM_FI_DEV_POWER_USAGE{{gpu="0"}} {watts}\n'
                                        f'DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{gpu="0"}} {watts * 1000}\n')

    async def one_scrape() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            await asyncio.wait_for(power.run(client, stop), 10)  # a regression fails, never hangs

    asyncio.run(one_scrape())
    assert seen == {"http://gw:8000/gpu/metrics": "Bearer sk-secret", "http://dcgm:9400/metrics": None}
    assert len(power.rows) == 2 and power.rows[0][0] == power.rows[1][0]  # one instant
    assert {(name, value) for _, name, value in power.rows} == {
        ("gpu_power_w", 400.0), ("gpu_energy_j", 400.0)}
    assert power.warning is None


def test_a_power_url_that_fails_ends_the_power_scrape_with_one_warning_and_no_rows() -> None:
    power = Scraper("http://gw:8000/metrics", {}, power=["/gpu/metrics", "http://dcgm:9400/metrics"]).power_scraper()
    assert power is not None

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "dcgm":
            return httpx.Response(404)
        return httpx.Response(200, text='DCGM_FI_DEV_POWER_USAGE{gpu="0"} 100\n')

    async def scrape() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            await asyncio.wait_for(power.run(client, asyncio.Event()), 10)  # the 404 ends it

    asyncio.run(scrape())
    assert power.rows == []
    assert power.warning == "power metrics: http://dcgm:9400/metrics answered HTTP 404; no energy figures"


def test_the_scenario_refuses_a_power_url_or_price_it_cannot_use() -> None:
    base = {"name": "s", "load": {"arrival": "poisson", "rate_per_s": 1, "duration_s": 1},
            "workload": {"classes": [{"name": "c", "prompt_tokens": {"dist": "fixed", "value": 8},
                                      "output_tokens": {"dist": "fixed", "value": 8}}]}}
    ok = Scenario.model_validate({**base, "target": {"power_metrics": ["/gpu/metrics", "https://d:9400/metrics"]},
                                  "cost": {"price_per_hour": 2.5}})
    assert ok.cost is not None and ok.cost.currency == "USD"
    with pytest.raises(ValueError, match="must be http"):
        Scenario.model_validate({**base, "target": {"power_metrics": ["dcgm:9400/metrics"]}})
    with pytest.raises(ValueError, match="price_per_hour"):
        Scenario.model_validate({**base, "cost": {"price_per_hour": 0}})


def test_a_power_urls_token_is_a_secret_like_the_base_urls() -> None:
    from loadgen.run.target import scenario_secrets
    sc = Scenario.model_validate({"name": "s", "load": {"arrival": "poisson", "rate_per_s": 1, "duration_s": 1},
                                  "target": {"power_metrics": ["https://u:pw-1@dcgm:9400/metrics?api_key=tok-2"]},
                                  "workload": {"classes": [{"name": "c", "prompt_tokens": {"dist": "fixed", "value": 8},
                                                            "output_tokens": {"dist": "fixed", "value": 8}}]}})
    assert {"pw-1", "tok-2"} <= set(scenario_secrets(sc))  # registered before the run: masked in every output


def test_the_console_line_shows_each_figure_and_says_why_one_is_absent() -> None:
    summary = {"figures": {"currency": "USD", "cost_per_1m_output_tokens": 0.4213, "cost_per_1m_total_tokens": 0.1,
                           "absent": {"energy_j_per_output_token": "no target.power_metrics declared"}},
               "mlperf": {"ttft_p90_ms": 123.4, "tpot_p90_ms": 21.0, "tokens_per_s_per_user": 47.62}}
    line = fig.console_line(summary)
    assert line == ("figures: 0.4213 USD / 1M output tok · 0.1 USD / 1M tok · energy: no target.power_metrics "
                    "declared · MLPerf TTFT p90 123 ms · TPOT p90 21.0 ms · 47.6 tok/s/user")
    assert fig.console_line({}) is None
    one_token = {"mlperf": fig.mlperf({"ttft_ms": {"p90": 80.0}, "tpot_ms": {"p90": None}})}
    assert fig.console_line(one_token) == ("figures: MLPerf TTFT p90 80 ms · tok/s/user: no request had more than "
                                           "one output token")


# --- llm-d Benchmark Report v0.2 (report/llmd_export.py), validated against a hand-written JSON Schema -------------

SCHEMA_V0_2 = Path(__file__).parent / "data" / "llmd_benchmark_report_v0_2.schema.json"


def _validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(SCHEMA_V0_2.read_text(encoding="utf-8")))


def _summary() -> dict[str, Any]:
    row = {"count": 10, "mean": 50.0, "p50": 45.0, "p90": 80.0, "p95": 90.0, "p99": 99.0, "p999": None, "max": 120.0}
    return {"requests": {"completed": 9, "failed": 1, "cancelled": 0},
            "metrics": {"ttft_ms": row, "tpot_ms": {**row, "mean": 10.0}, "itl_ms": row, "e2e_ms": row,
                        "queue_delay_ms": row},
            "throughput": {"requests_per_s": 2.0, "output_tokens_per_s": 256.0, "prompt_tokens_per_s": 1024.0,
                           "total_tokens_per_s": 1280.0, "goodput_requests_per_s": 2.0},
            "window_s": 4.5, "started_at": "2026-11-27T05:00:00+0000", "loadgen_version": "0.1.0",
            "figures": {"power_w_mean": 400.0, "absent": {}}, "mlperf": {"tpot_p90_ms": 80.0}}


def _scenario_json(**cls: Any) -> dict[str, Any]:
    return Scenario.model_validate({"name": "s", "load": {"arrival": "concurrency", "concurrency": 4,
                                                           "duration_s": 5},
                                    "workload": {"classes": [{"name": "c", **cls}]}}).model_dump(mode="json")


def test_the_llmd_export_is_a_valid_v0_2_report_with_our_figures_mapped_and_units_allowed() -> None:
    normal = {"prompt_tokens": {"dist": "normal", "mean": 500, "std": 50, "min": 100},
              "output_tokens": {"dist": "lognormal", "median": 120, "sigma": 0.5}}
    doc = benchmark_report(_summary(), _scenario_json(**normal), "2026-run")
    assert list(_validator().iter_errors(doc)) == []
    load = doc["scenario"]["load"]["standardized"]
    assert load["input_seq_len"] == {"distribution": "gaussian", "value": 500, "std_dev": 50, "min": 100}
    assert load["output_seq_len"] == {"distribution": "other", "value": 128.0}  # measured: 256 tok/s / 2 req/s
    assert load["concurrency"] == 4 and "rate_qps" not in load
    agg = doc["results"]["request_performance"]["aggregate"]
    assert agg["latency"]["time_per_output_token"] == {"units": "ms/token", "mean": 10.0, "p50": 45.0,
                                                       "p90": 80.0, "p95": 90.0, "p99": 99.0, "max": 120.0}
    assert agg["throughput"]["total_token_rate"] == {"units": "tokens/s", "mean": 1280.0}
    assert agg["requests"] == {"total": 10, "failures": 1, "incomplete": 0,
                               "input_length": {"units": "count", "mean": 512.0},
                               "output_length": {"units": "count", "mean": 128.0}}
    assert doc["run"]["time"] == {"start": "2026-11-27T05:00:00+00:00", "duration": "PT4.500S"}
    assert doc["results"]["profiling"]["loadgen"]["figures"]["power_w_mean"] == 400.0


def test_the_hand_written_schema_refuses_what_v0_2_forbids() -> None:
    doc = benchmark_report(_summary(), _scenario_json(prompt_tokens={"dist": "fixed", "value": 64},
                                                      output_tokens={"dist": "fixed", "value": 8}), "r")
    assert list(_validator().iter_errors(doc)) == []
    bad_units = json.loads(json.dumps(doc))
    bad_units["results"]["request_performance"]["aggregate"]["latency"]["time_per_output_token"]["units"] = "ms"
    extra = json.loads(json.dumps(doc))
    extra["results"]["request_performance"]["aggregate"]["throughput"]["energy"] = {"units": "J", "mean": 1.0}
    for wrong in (bad_units, extra):
        assert list(_validator().iter_errors(wrong)) != []


# --- one short embedded-simulator run: the figures against the simulator's own energy ------------------------------

@pytest.fixture(scope="module")
def energy_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    sc = Scenario.model_validate({
        "name": "energy", "seed": 1, "cost": {"price_per_hour": 3.6, "currency": "EUR"},
        "target": {"power_metrics": ["/gpu/metrics"], "simulator": {"trace": True}},
        "load": {"arrival": "poisson", "rate_per_s": 8, "duration_s": 4, "steady_state": "declared"},
        "workload": {"classes": [{"name": "c", "prompt_tokens": {"dist": "fixed", "value": 256},
                                  "output_tokens": {"dist": "fixed", "value": 32}}]}})
    return api.run(sc, out=tmp_path_factory.mktemp("energy") / "run", server_metrics_period_s=0.25)


def _sim_energy_j(trace: Path, t0_ns: int, t1_ns: int) -> float:
    """The simulator's own energy over [t0, t1] (local_target/sim/power.py's model over its traced steps)."""
    tokens = 0
    for line in trace.read_text(encoding="utf-8").splitlines():
        event = json.loads(line)
        if event.get("type") == "step" and t0_ns <= event["t_end_ns"] <= t1_ns:
            tokens += sum(chunk[1] for chunk in event["prefill"]) + len(event["decode"])
    return power.GPUS * power.IDLE_W * (t1_ns - t0_ns) / NS + power.J_PER_TOKEN * tokens


@pytest.mark.slow
def test_energy_per_token_matches_the_simulators_own_energy_within_5_percent(energy_run: Any) -> None:
    run_dir = energy_run.run_dir
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    req = pl.read_parquet(run_dir / "requests.parquet")
    t0, t1 = int(req["t_intended_ns"].min()), int(req["t_done_ns"].max())  # declared steady state, no warm-up
    ok = req.filter(pl.col("error_kind").is_null())  # as analysis/metrics.py reads a request ok
    truth = _sim_energy_j(run_dir / "sim_trace.jsonl", t0, t1)
    figures = summary["figures"]
    assert figures["absent"] == {} and figures["energy_source"] == "counter"
    assert figures["energy_j_per_output_token"] == pytest.approx(truth / ok["output_tokens"].sum(), rel=0.05)
    total = ok["output_tokens"].sum() + ok["prompt_tokens"].sum()
    assert figures["energy_j_per_total_token"] == pytest.approx(truth / total, rel=0.05)
    assert figures["power_w_mean"] == pytest.approx(truth / ((t1 - t0) / NS), rel=0.05)
    # cost: 3.60 EUR per hour over the measured window, per million output tokens
    assert figures["cost_per_1m_output_tokens"] == pytest.approx(
        3.6 * (t1 - t0) / NS / 3600 / ok["output_tokens"].sum() * 1e6, rel=1e-6)
    assert summary["mlperf"]["tokens_per_s_per_user"] == pytest.approx(1000 / summary["metrics"]["tpot_ms"]["p90"])
    assert summary["throughput"]["total_tokens_per_s"] == pytest.approx(total / ((t1 - t0) / NS))


@pytest.mark.slow
def test_the_run_writes_a_valid_benchmark_report_beside_its_summary(energy_run: Any) -> None:
    doc = yaml.safe_load((energy_run.run_dir / "benchmark_report.yaml").read_text(encoding="utf-8"))
    assert list(_validator().iter_errors(doc)) == []
    assert doc["scenario"]["load"]["standardized"]["rate_qps"] == 8.0
    assert doc["results"]["profiling"]["loadgen"]["figures"]["currency"] == "EUR"
