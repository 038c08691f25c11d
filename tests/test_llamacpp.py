"""End to end against a real llama.cpp ``llama-server`` (CPU), built from PyPI's llama-cpp-python sdist.

`loadgen target llamacpp --build-only` (the build is cached under the user's cache directory; `.ci/run` makes it
before the tests, about 6 minutes on a fresh 2-core machine), then `loadgen target llamacpp` with 4 slots and
2048-token slices, `loadgen run scenarios/llamacpp_cpu.yaml` (victim decodes among 1.8k-2.3k-token prompts),
and again with 256-token slices; between the two, a 12-s victims-only run with loadgen's own loop blocked (a
client-side CPU hog), whose misses the ledger must blame on the client. Skipped where cmake or the compiler is
missing, except under CI. Selected alone with `pytest -m llamacpp` (about 2.5 minutes once built).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path

import polars as pl
import pytest

from local_target.llamacpp.build import cached_binary, missing_tools
from tests.real_targets import assert_check_is_clean, run_scenario, serving, worst_victim_gap_ms
from tests.run_helpers import run_cli, summary, with_loop_blocks

pytestmark = pytest.mark.llamacpp

LEFT_OUT = os.environ.get("LOADGEN_CI_WITHOUT_LLAMACPP")  # .ci/run's reason for not building it (too little disk)
if cached_binary() is None and LEFT_OUT:
    pytest.skip(f"llama-server was not built: {LEFT_OUT}", allow_module_level=True)
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


def llama_serving(*flags: str) -> AbstractContextManager[None]:
    return serving(["llamacpp", *flags], "llama-server ready: " + BASE_URL, PORT, 180, stop_s=60)


def run_llama_scenario(out: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    return run_scenario("scenarios/llamacpp_cpu.yaml", BASE_URL, out)


def test_real_llamacpp_slices_stall_the_running_decodes_and_are_named(built: None, tmp_path: Path) -> None:
    out = tmp_path / "n2048"
    with llama_serving():
        req, chunks, stalls = run_llama_scenario(out)
        checked = assert_check_is_clean(BASE_URL)  # loadgen check: a real llama.cpp can be measured honestly
        hogged = run_with_loop_blocks(tmp_path / "hogged")
    assert checked["target"]["engine"] == "llamacpp"
    s = summary(out)

    # the engine is recognised, and prompt lengths are exact (apply-template + /tokenize)
    assert s["target"]["engine"] == "llamacpp" and s["target"]["tokenize_endpoint"] == "llamacpp"
    assert req["error_kind"].is_null().all() and req.height >= 20
    assert (req["prompt_tokens"] == req["prompt_tokens_asked"]).all()
    assert set(req["prompt_tokens_source"]) == {"server"}

    # the tiny model never emits part of a character, so llama-server sends each token when it is made
    assert (chunks["tokens"] == 1).mean() >= 0.99, chunks["tokens"].value_counts()  # type: ignore[operator]

    # most stalls are the long prompts' slices, and only long prompts are named
    induced = stalls.filter(pl.col("prefill_induced"))
    share = induced.height / max(stalls.height, 1)
    aggressors = set(req.filter(pl.col("class_name") == "aggressor")["seq"])
    print(f"llama.cpp n_batch 2048: {stalls.height} stalls, {induced.height} prefill-induced ({share:.0%}); "
          f"fit {s['stalls']['prefill_fit']}")
    print(timeline(req, stalls))  # shown by pytest when an assertion below fails
    assert stalls.height >= 4 and share >= 0.8
    assert all(set(c) <= aggressors for c in induced["culprits"].to_list())
    # the SLO-miss ledger (docs/causes.md): the victims' ITL misses are prefill interference, named by culprit
    misses = pl.read_parquet(out / "misses.parquet")
    print(f"ledger: {s['misses']['by_cause']}")
    assert misses.height >= 4 and s["misses"]["top"][0] == "prefill"
    named = misses.filter(pl.col("cause") == "prefill")
    assert named.height >= 0.8 * misses.height
    assert all(c and set(c) <= aggressors for c in named["culprits"].to_list())
    # the prefill estimate is the server's (a 2k-token prompt takes seconds here), not a decode step
    fit = s["stalls"]["prefill_fit"]
    est_2k_ms = fit["a_ms"] + 2000 * fit["b_ms_per_token"] + 2000 ** 2 * fit["c_ms_per_token2"]
    assert est_2k_ms > 0.5 * worst_victim_gap_ms(req, chunks)

    # llama.cpp's own series, mapped to the common vocabulary
    metrics = pl.read_parquet(out / "server_metrics.parquet")
    assert {"running", "waiting", "prompt_tokens_total", "generation_tokens_total", "steps_total"} <= \
        set(metrics["name"])
    assert metrics.filter(pl.col("name") == "running")["value"].max() >= 2  # type: ignore[operator]

    assert_client_blamed(*hogged)

    with llama_serving("--n-batch", "256"):
        req_small, chunks_small, _ = run_llama_scenario(tmp_path / "n256")
    worst_ms, worst_small_ms = worst_victim_gap_ms(req, chunks), worst_victim_gap_ms(req_small, chunks_small)
    print(f"worst victim gap: n_batch 2048 {worst_ms:.0f} ms, n_batch 256 {worst_small_ms:.0f} ms")
    # a 256-token slice is one short step (~0.3 s at 2k of context here) where 2,048 tokens took ~1.8 s
    assert req_small["error_kind"].is_null().all() and worst_small_ms < 0.5 * worst_ms


def timeline(requests: pl.DataFrame, stalls: pl.DataFrame) -> str:
    """The long prompts (sent, first token) and every stall, in seconds from the first send: what a failed
    attribution needs to be understood."""
    t0 = requests["t_sent_ns"].min()
    s_ = (pl.col("t_sent_ns") - t0) / 1e9
    longs = requests.filter(pl.col("class_name") == "aggressor").select(
        "seq", "prompt_tokens", sent_s=s_, first_s=(pl.col("t_first_token_ns") - t0) / 1e9).sort("sent_s")
    gaps = stalls.select("seq", start_s=(pl.col("t_start_ns") - t0) / 1e9, end_s=(pl.col("t_end_ns") - t0) / 1e9,
                         gap_ms="chunk_gap_ms", tokens="tokens", culprits="culprits", cause="cause")
    with pl.Config(tbl_rows=100, tbl_cols=20, tbl_width_chars=200):
        return f"long prompts:\n{longs}\nstalls:\n{gaps}"


# ---- a client-side CPU hog: loadgen's own loop blocked --------------------------------------------------------
HOG_AT_S, HOG_MS = (4.0, 7.0, 10.0), 600.0  # seconds after the run's loop started; each blocks it 600 ms


def run_with_loop_blocks(out: Path) -> tuple[Path, list[tuple[int, int]]]:
    """tests/data/llamacpp_victims.yaml (no long prompt) run in this process against llama-server, with a
    callback that busy-waits HOG_MS on loadgen's event loop at each of HOG_AT_S: a CPU hog in the client."""
    from loadgen import api
    from loadgen.run import runner

    windows: list[tuple[int, int]] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "event_loop_run", with_loop_blocks(runner.event_loop_run, HOG_AT_S, HOG_MS, windows))
        api.run(Path(__file__).parent / "data" / "llamacpp_victims.yaml", base_url=BASE_URL, out=out)
    return out, windows


def assert_client_blamed(out: Path, windows: list[tuple[int, int]]) -> None:
    """Every miss of the hogged run is the client's (client_lag), and each was in flight across a block."""
    assert len(windows) == len(HOG_AT_S)
    misses = pl.read_parquet(out / "misses.parquet").join(
        pl.read_parquet(out / "requests.parquet").select("worker", "seq", "t_sent_ns", "t_done_ns"),
        on=["worker", "seq"])
    print(f"llama.cpp, loadgen's loop blocked {len(windows)} × {HOG_MS:g} ms: {misses.height} misses, "
          f"{dict(misses.group_by('cause').len().iter_rows())}")
    assert misses.height >= 2  # the blocks stalled the streams in flight (ITL over 400 ms; measured: 4)
    assert (misses["cause"] == "client_lag").all(), misses.select("seq", "cause", "evidence")
    across = pl.any_horizontal([(pl.col("t_sent_ns") < b) & (pl.col("t_done_ns") > a) for a, b in windows])
    assert misses.select(across.all()).item()

