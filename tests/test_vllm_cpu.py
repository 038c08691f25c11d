"""End to end against a real vLLM (PyPI's CPU build) serving a tiny random-weight model made offline.

`loadgen target tiny-model`, then `loadgen target vllm --device cpu` with chunked prefill off, `loadgen run
scenarios/vllm_cpu.yaml` (victim decodes, 1k-2k-token aggressors) and `loadgen advise` on that run; then vLLM
again with the chunked setting the advice recommends, measured against what the advice predicted, and a
two-step `loadgen sweep` on that same server.
Needs `local_target/vllm/install-cpu.sh .venv` (`.ci/run` does it); skipped without vLLM, except under CI (where only
`.ci/run` finding too little disk, LOADGEN_CI_WITHOUT_VLLM, skips it, saying so).
Selected alone with `pytest -m vllm_cpu` (about 4 minutes on 2 cores: each of its two server starts takes ~70 s).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from contextlib import AbstractContextManager
import os
from pathlib import Path

import polars as pl
import pytest
import yaml

from loadgen import api
from loadgen.analysis.calibrate import with_bursts
from loadgen.analysis.metrics import chunk_gaps, itl_samples
from loadgen.report.advice_report import markdown
from tests.counts import poisson_quantile
from tests.real_targets import assert_check_is_clean, run_scenario, serving, worst_victim_gap_ms
from tests.run_helpers import run_cli, summary

pytestmark = pytest.mark.vllm_cpu

if importlib.util.find_spec("vllm") is None:
    LEFT_OUT = os.environ.get("LOADGEN_CI_WITHOUT_VLLM")  # .ci/run's reason for not installing it (too little disk)
    if os.environ.get("CI") and not LEFT_OUT:
        pytest.fail("vLLM's CPU build is not installed: .ci/run runs local_target/vllm/install-cpu.sh", pytrace=False)
    pytest.skip(f"vLLM is not installed ({LEFT_OUT or 'local_target/vllm/install-cpu.sh .venv'})",
                allow_module_level=True)

PORT = 8331
BASE_URL = f"http://127.0.0.1:{PORT}/v1"
STARTUP_S = 420.0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    res = run_cli("target", "tiny-model", str(out))
    assert res.returncode == 0, res.stderr
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()
    return out


def vllm_serving(model: Path, *flags: str) -> AbstractContextManager[None]:
    return serving(["vllm", "--model", str(model), "--device", "cpu", "--max-model-len", "4096", *flags],
                   "vLLM ready: " + BASE_URL, PORT, STARTUP_S)


def run_vllm_scenario(out: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    return run_scenario("scenarios/vllm_cpu.yaml", BASE_URL, out)


def test_real_vllm_on_cpu_prefill_stalls_off_then_chunked(tiny_model: Path, tmp_path: Path) -> None:
    with vllm_serving(tiny_model, "--no-chunked-prefill"):
        req, chunks, stalls = run_vllm_scenario(tmp_path / "off")
        checked = assert_check_is_clean(BASE_URL)  # loadgen check: a real vLLM can be measured honestly
    assert checked["target"]["engine"] == "vllm"
    off = tmp_path / "off"

    # exact prompt lengths: every prompt built to its asked length, counted by the server's /tokenize
    assert req["error_kind"].is_null().all() and req.height >= 20
    assert (req["prompt_tokens"] == req["prompt_tokens_asked"]).all()
    assert set(req["prompt_tokens_source"]) == {"server"}

    # TTFT rises with prompt length (service time: from the send, on an otherwise light server)
    ttft = req.filter(~pl.col("warmup")).select("class_name", "prompt_tokens",
                                                ttft_ms=(pl.col("t_first_token_ns") - pl.col("t_sent_ns")) / 1e6)
    by_class = dict(ttft.group_by("class_name").agg(pl.col("ttft_ms").median()).iter_rows())
    assert by_class["aggressor"] > 3 * by_class["victim"], by_class
    assert ttft.select(pl.corr("prompt_tokens", "ttft_ms", method="spearman")).item() > 0.5
    assert summary(off)["stalls"]["prefill_fit"]["b_ms_per_token"] > 0

    # whole prefills stall the running decodes, and the long prompt is named as the culprit
    induced = stalls.filter(pl.col("prefill_induced"))
    assert induced.height >= 2, stalls
    aggressors = set(req.filter(pl.col("class_name") == "aggressor")["seq"])
    assert all(set(c) <= aggressors for c in induced["culprits"].to_list())
    worst_off_ms = worst_victim_gap_ms(req, chunks)
    assert worst_off_ms > 500

    # vLLM's own series, scraped while the run went on
    metrics = pl.read_parquet(off / "server_metrics.parquet")
    assert {"running", "waiting", "kv_cache_usage", "preemptions_total", "prompt_tokens_total",
            "generation_tokens_total"} <= set(metrics["name"])
    prompt_counter = metrics.filter(pl.col("name") == "prompt_tokens_total")["value"]
    assert prompt_counter.max() - prompt_counter.min() >= 0.8 * req["prompt_tokens"].sum()  # type: ignore
    generation_counter = metrics.filter(pl.col("name") == "generation_tokens_total")["value"]
    assert generation_counter.max() - generation_counter.min() >= 0.8 * req["output_tokens"].sum()  # type: ignore
    # the gauge is sampled once a scrape: it saw the engine busy (a peak of 2 running fell between two scrapes
    # once in CI, so the peak itself is not held)
    assert metrics.filter(pl.col("name") == "running")["value"].max() >= 1  # type: ignore[operator]

    # loadgen advise: the fitted model replays this run, and names the chunked setting that meets the objectives
    stall_slo = next(o for o in summary(off)["slo"] if o["objective"] == "stalls.max_prefill_induced_per_1k_tokens")
    # whole prefills stall the victims: over the limit, never a pass (a short run's few stall bursts may leave
    # its interval undecided: inconclusive, not fail)
    assert stall_slo["value"] > stall_slo["threshold"] and stall_slo["decision"] in ("fail", "inconclusive"), stall_slo
    advice = api.advise(off, server=["chunked_prefill=false", "max_num_batched_tokens=4096"], png=False)
    print("\n" + markdown(advice))
    # the recommendation, else the closest it names (a short run may not decide a p99 with the margin)
    rec = advice.recommendation or (advice.candidates[advice.closest] if advice.closest is not None else None)
    assert rec is not None and rec.settings["chunked_prefill"] is True, [c.failed for c in advice.candidates]
    budget = str(rec.settings["max_num_batched_tokens"])
    assert rec.flags[:2] == ["--enable-chunked-prefill", f"--max-num-batched-tokens {budget}"]

    with vllm_serving(tiny_model, "--chunked-prefill", "--max-num-batched-tokens", budget):
        req_on, chunks_on, _ = run_vllm_scenario(tmp_path / "on")
        swept = run_sweep(tmp_path)  # on the same server: a fourth start would cost ~70 s of CI
    check_sweep(swept, tmp_path / "sweep")
    worst_on_ms = worst_victim_gap_ms(req_on, chunks_on)
    # The engine's steps, like with like: a held delivery (vLLM's API server starved on 2 cores, then a burst of
    # chunks) is no engine step; CI once measured a 764 ms gap in a chunked-512 run whose steps the replay put
    # at 317 ms, against a 972 ms whole prefill with chunking off.
    engine_off_ms = worst_victim_gap_ms(req, chunks, engine_steps_only=True)
    engine_on_ms = worst_victim_gap_ms(req_on, chunks_on, engine_steps_only=True)
    print(f"worst victim gap: chunked prefill off {worst_off_ms:.0f} ms, on ({budget}) {worst_on_ms:.0f} ms "
          f"(the engine's steps: {engine_off_ms:.0f} and {engine_on_ms:.0f} ms); "
          f"TTFT median victim {by_class['victim']:.0f} / aggressor {by_class['aggressor']:.0f} ms")
    assert req_on["error_kind"].is_null().all() and engine_on_ms < 0.7 * engine_off_ms
    on = summary(tmp_path / "on")
    # The worst gap the engine made: on 2 cores vLLM's API server is sometimes starved and holds a stream's
    # tokens, then hands them over at once (CI measured 618 ms before a burst of 79 chunks, one request in
    # flight); the replay models the engine's steps, not that, so held deliveries are compared apart.
    gaps = chunk_gaps(req_on, with_bursts(chunks_on)).filter(~pl.col("warmup"))
    held = gaps.filter("burst_start").select("seq", "t_ns", "chunk_gap_ms")
    engine_worst_ms = float(gaps.filter(~pl.col("burst_start"))["chunk_gap_ms"].max())  # type: ignore[arg-type]
    print(f"held deliveries: {held['chunk_gap_ms'].round(0).to_list()} ms; "
          f"worst gap {on['metrics']['chunk_gap_ms']['max']:.0f} ms, "
          f"of the engine's steps {engine_worst_ms:.0f} ms")
    # Like with like: the replay models the engine's steps, so the measured side leaves out held deliveries (on
    # 2 cores vLLM's API server is sometimes starved and hands a stream's tokens over at once: 400-680 ms gaps
    # seen in 3 of 8 runs). ITL is judged at p99.9, on the chunk steps' plateau: only ~1-1.6 % of this
    # scenario's gaps are chunk steps (150-290 ms, growing along each long prompt), so its p99 falls on the
    # cliff between them and the ~10 ms decode steps and moves run to run (94-231 ms measured against 144-219
    # predicted); it is printed, not held. The worst engine gap, a maximum, gets 50 %.
    engine_gaps = gaps.filter(~pl.col("burst_start"))
    engine_itl_p999 = float(itl_samples(engine_gaps).quantile(0.999, interpolation="linear"))  # type: ignore
    print(f"ITL p99: predicted {rec.figures['ITL p99']:.1f} ms, measured {on['metrics']['itl_ms']['p99']:.1f} ms")
    for label, value, tolerance in (("TTFT p99", on["metrics"]["ttft_ms"]["p99"], 0.30),
                                    ("ITL p99.9", engine_itl_p999, 0.30),
                                    ("worst gap", engine_worst_ms, 0.50)):
        print(f"{label}: predicted {rec.figures[label]:.1f} ms, measured (engine) {value:.1f} ms")
        assert abs(rec.figures[label] - value) <= tolerance * value, (label, rec.figures[label], value)  # type: ignore
    measured_calls = {o["objective"]: o["passed"] for o in on["slo"]}
    limit = next(o["threshold"] for o in rec.objectives if o["objective"] == STALL_OBJECTIVE)
    # Stalls are a count, judged at the count's resolution: the limit allows ~2 stalls in this run's ~2k tokens,
    # and vLLM-CPU on 2 cores makes stray 400-530 ms steps (CI saw 2 of 455 ms, 1.03 per 1k against 1.0, with
    # the replay's worst step 318 ms). A predicted pass holds when the engine's count is one a server running at
    # exactly the limit would reach in 95 % of runs (Poisson); whole prefills make ~3 per 1k tokens.
    stalls, tokens = engine_stalls(tmp_path / "on", held)
    allowed = poisson_quantile(limit * tokens / 1000, 0.95)
    print(f"engine stalls {stalls} in {tokens} tokens; the limit's 95 % count {allowed}")
    measured_calls[STALL_OBJECTIVE] = stalls <= allowed
    for objective in rec.objectives:  # every objective predicted to pass, passed (stalls: the engine's)
        assert objective["passed"] is not True or measured_calls[objective["objective"]] is True, objective


STALL_OBJECTIVE = "stalls.max_prefill_induced_per_1k_tokens"


def engine_stalls(run_dir: Path, held: pl.DataFrame) -> tuple[int, int]:
    """Prefill-induced stalls and the output tokens they are counted over, held deliveries left out (they are
    not engine steps)."""
    stalls = pl.read_parquet(run_dir / "stalls.parquet").filter(pl.col("prefill_induced"))
    engine = stalls.join(held, left_on=["seq", "t_end_ns"], right_on=["seq", "t_ns"], how="anti")
    tokens = next(o["samples"] for o in summary(run_dir)["slo"] if o["objective"] == STALL_OBJECTIVE)
    print(f"prefill-induced stalls: {stalls.height}, of them held deliveries {stalls.height - engine.height}")
    return engine.height, int(tokens)


SWEEP = {"name": "vllm-cpu-sweep", "target": {"base_url": BASE_URL, "model": "auto", "api": "chat"}, "seed": 2,
         "load": {"arrival": "constant", "rate_per_s": 1, "duration_s": 8, "warmup_s": 1, "max_in_flight": 32},
         "workload": {"classes": [{"name": "chat", "prompt_tokens": {"dist": "uniform", "min": 32, "max": 256},
                                   "output_tokens": {"dist": "fixed", "value": 32}}]},
         "slo": {"ttft_ms": {"p50": 5000}, "error_rate": {"max": 0.01}}}


def run_sweep(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`loadgen sweep --rate 1,3` end to end: two full runs against the server, judged and reported."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    return run_cli("sweep", str(path), "--rate", "1,3", "--out", str(tmp_path / "sweep"), "--no-png",
                   timeout=600)


def check_sweep(res: subprocess.CompletedProcess[str], out: Path) -> None:
    print(res.stdout[-2000:])
    assert res.returncode in (0, 1, 3), res.stderr
    doc = json.loads((out / "sweep.json").read_text())
    steps = {s["load"]: s for s in doc["steps"] if s["attempt"] == 1}
    assert set(steps) == {1.0, 3.0}, doc["steps"]
    for load, step in steps.items():
        run = json.loads((out / step["run_dir"] / "summary.json").read_text())
        assert run["requests"]["failed"] == 0 and step["completed"] >= 0.9 * load * 8
        assert run["target"]["engine"] == "vllm"
    assert steps[3.0]["requests_per_s"] > 1.8 * steps[1.0]["requests_per_s"]
    assert (out / "sweep.html").exists() and (out / "junit.xml").exists()
