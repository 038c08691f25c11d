"""End to end against a real llama.cpp ``llama-server`` (CPU), built from PyPI's llama-cpp-python sdist.

`loadgen target llamacpp --build-only` (the build is cached under the user's cache directory; `.ci/run` makes it
before the tests, about 6 minutes on a fresh 2-core machine), then `loadgen target llamacpp` with 4 slots and
2048-token slices, `loadgen run scenarios/llamacpp_cpu.yaml` (victim decodes among 1.8k-2.3k-token prompts),
and again with 256-token slices. Skipped where cmake or the compiler is missing, except under CI.
Selected alone with `pytest -m llamacpp` (about 2 minutes once built).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import polars as pl
import pytest

from local_target.llamacpp.build import cached_binary, missing_tools
from local_target.server_process import port_free
from tests.run_helpers import ROOT, read_until, records, run_cli, summary

pytestmark = pytest.mark.llamacpp

if cached_binary() is None and missing_tools():
    why = f"building llama-server needs {', '.join(missing_tools())}"
    if os.environ.get("CI"):
        pytest.fail(f"{why}: .ci/run installs cmake", pytrace=False)
    pytest.skip(why, allow_module_level=True)

PORT = 8332
BASE_URL = f"http://127.0.0.1:{PORT}/v1"


@pytest.fixture(scope="module")
def built() -> None:
    res = run_cli("target", "llamacpp", "--build-only", timeout=1800)
    assert res.returncode == 0, res.stderr + res.stdout
    assert "llama-server: " in res.stdout


@contextlib.contextmanager
def llama_serving(*flags: str) -> Iterator[None]:
    """`loadgen target llamacpp` until it prints that llama-server is ready; Ctrl-C at the end, as a user would."""
    assert port_free("127.0.0.1", PORT), f"port {PORT} is taken before the test"
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", "target", "llamacpp", "--port", str(PORT), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        read_until(proc, "llama-server ready: " + BASE_URL, 180)
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0 and port_free("127.0.0.1", PORT), "llama-server did not stop on Ctrl-C"


def run_scenario(out: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    res = run_cli("run", "scenarios/llamacpp_cpu.yaml", "--base-url", BASE_URL, "--out", str(out), "--no-progress",
                  "--no-png", timeout=300)
    assert res.returncode in (0, 1, 3), res.stderr + res.stdout
    requests, chunks = records(out)
    return requests, chunks, pl.read_parquet(out / "stalls.parquet")


def worst_victim_gap_ms(requests: pl.DataFrame, chunks: pl.DataFrame) -> float:
    victims = requests.filter((pl.col("class_name") == "victim") & ~pl.col("warmup")).select("seq")
    gaps = (chunks.join(victims, on="seq").sort("seq", "t_ns")
            .select(gap_ms=pl.col("t_ns").diff().over("seq") / 1e6)["gap_ms"].drop_nulls())
    return float(gaps.max())  # type: ignore[arg-type]


def test_real_llamacpp_slices_stall_the_running_decodes_and_are_named(built: None, tmp_path: Path) -> None:
    out = tmp_path / "n2048"
    with llama_serving():
        req, chunks, stalls = run_scenario(out)
    s = summary(out)

    # the engine is recognised, and prompt lengths are exact (apply-template + /tokenize)
    assert s["target"]["engine"] == "llamacpp" and s["target"]["tokenize_endpoint"] == "llamacpp"
    assert req["error_kind"].is_null().all() and req.height >= 20
    assert (req["prompt_tokens"] == req["prompt_tokens_asked"]).all()
    assert set(req["prompt_tokens_source"]) == {"server"}

    # most stalls are the long prompts' slices, and only long prompts are named
    induced = stalls.filter(pl.col("prefill_induced"))
    share = induced.height / max(stalls.height, 1)
    aggressors = set(req.filter(pl.col("class_name") == "aggressor")["seq"])
    print(f"llama.cpp n_batch 2048: {stalls.height} stalls, {induced.height} prefill-induced ({share:.0%}); "
          f"fit {s['stalls']['prefill_fit']}")
    assert stalls.height >= 4 and share >= 0.8, stalls
    assert all(set(c) <= aggressors for c in induced["culprits"].to_list())
    # the prefill estimate is the server's (a 2k-token prompt takes seconds here), not a decode step
    fit = s["stalls"]["prefill_fit"]
    est_2k_ms = fit["a_ms"] + 2000 * fit["b_ms_per_token"] + 2000 ** 2 * fit["c_ms_per_token2"]
    assert est_2k_ms > 0.5 * worst_victim_gap_ms(req, chunks)

    # llama.cpp's own series, mapped to the common vocabulary
    metrics = pl.read_parquet(out / "server_metrics.parquet")
    assert {"running", "waiting", "prompt_tokens_total", "generation_tokens_total", "steps_total"} <= \
        set(metrics["name"])
    assert metrics.filter(pl.col("name") == "running")["value"].max() >= 2  # type: ignore[operator]

    with llama_serving("--n-batch", "256"):
        req_small, chunks_small, _ = run_scenario(tmp_path / "n256")
    worst_ms, worst_small_ms = worst_victim_gap_ms(req, chunks), worst_victim_gap_ms(req_small, chunks_small)
    print(f"worst victim gap: n_batch 2048 {worst_ms:.0f} ms, n_batch 256 {worst_small_ms:.0f} ms")
    assert req_small["error_kind"].is_null().all() and worst_small_ms < 0.7 * worst_ms
