"""loadgen advise: the calibration against the simulator's truth (runs of presets it is not told about), the
recommended setting measured, the replay's rules, the candidate grid and flags, and the command's behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from local_target.sim.config import EngineConfig
from local_target.sim.costmodel import prefill_alone_ms
from loadgen import api
from loadgen.advise.replay import ReplayLoad, ReplayRequest, replay
from loadgen.advise.settings import SettingsError, candidates, engine_flags, parse_items
from loadgen.analysis.advice_result import Advice, CandidateResult, recommend
from loadgen.analysis.calibrate import nonnegative_lstsq
from loadgen.analysis.metrics import chunk_gaps, itl_samples, measured, with_request_metrics
from tests.run_helpers import run_cli, summary

SCENARIO = "tests/data/advise_sim.yaml"
# (preset, engine, rate): cost models the calibration is not told about (run.json holds only the scheduler's
# settings), under two schedulers (an H100 under vLLM's was a third case, dropped for CI's 45 minutes: 40 s; the
# T4 case keeps vLLM's scheduler)
CASES = [("t4-phi3-mini", "vllm", 1), ("a100-llama-7b", "sglang", 3)]
MEDIANS = ("TTFT p50", "ITL p50")
TAILS = ("TTFT p99", "ITL p99", "worst gap")


def _run(out: Path, *sets: str) -> Path:
    args = [a for s in sets for a in ("--set", s)]
    res = run_cli("run", SCENARIO, *args, "--out", str(out), "--no-progress", "--no-png")
    assert res.returncode in (0, 1, 3), res.stderr + res.stdout
    return out


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def advised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Advice:
    preset, engine, rate = request.param
    # at 3 req/s 20 s instead of the scenario's 30 (CI's time): two runs' medians within 2.7 % and tails within
    # 3.8 % of the replay (10 and 25 % allowed); at 1 req/s the 30 s stay (~27 requests: the fit needs 20)
    run_dir = _run(tmp_path_factory.mktemp("advise") / preset, f"target.simulator.preset={preset}",
                   f"target.simulator.engine={engine}", f"load.rate_per_s={rate}",
                   *(["load.duration_s=20"] if rate > 1 else []))
    assert "compute_ms_per_token" not in json.loads((run_dir / "run.json").read_text())["target"]["simulator"]
    return api.advise(run_dir, png=False)


def median_band(run_dir: Path, figure: str) -> tuple[float, float]:
    """The measured sample's p40 and p60 of a median figure: the resolution a median of this run has.

    TTFT p50 is a median of ~35 requests whose order statistics near the middle lie 15-20 % apart (victims that
    waited behind an aggressor's prefill or not), so real-time jitter moves the measured p50 by a rank from run
    to run (374, 466 and 474 ms measured for one seeded plan, the replay 488-500). ITL p50 is a median of
    thousands of tokens, its band narrow; the 10 % tolerance governs it."""
    requests = with_request_metrics(measured(pl.read_parquet(run_dir / "requests.parquet"))).filter("ok")
    if figure == "TTFT p50":
        values = requests["ttft_ms"]
    else:
        chunks = pl.read_parquet(run_dir / "chunks.parquet")
        values = itl_samples(chunk_gaps(requests, chunks).filter(pl.col("warmup").not_()))
    return (float(values.quantile(0.4, interpolation="linear")),  # type: ignore[arg-type]
            float(values.quantile(0.6, interpolation="linear")))  # type: ignore[arg-type]


@pytest.mark.timing
def test_the_fitted_model_replays_a_run_of_an_unknown_preset(advised: Advice) -> None:
    errors = {r.figure: r.error for r in advised.fit}
    predicted = {r.figure: r.predicted for r in advised.fit}
    print("\n" + "\n".join(f"{r.figure}: measured {r.measured} replayed {r.predicted} error {r.error}"
                           for r in advised.fit))
    for figure in MEDIANS:  # within 10 %, or within the measured median's own resolution: the sample's middle fifth
        low, high = median_band(Path(advised.run_dir), figure)
        within_band = low <= predicted[figure] <= high  # type: ignore[operator]
        assert abs(errors[figure]) <= 0.10 or within_band, (figure, errors, (low, high))  # type: ignore[arg-type]
    for figure in TAILS:
        assert abs(errors[figure]) <= 0.25, (figure, errors)  # type: ignore[arg-type]


@pytest.mark.slow
def test_advice_files_and_the_report_section(advised: Advice) -> None:
    run_dir = Path(advised.run_dir)
    doc = json.loads((run_dir / "advice.json").read_text())
    assert doc == json.loads(json.dumps(advised.to_dict()))
    assert Advice.from_dict(doc).to_dict() == doc
    assert doc["candidates"][0]["label"].endswith("(current)") and len(doc["candidates"]) >= 5
    md = (run_dir / "advice.md").read_text()
    assert "## Every candidate, replayed" in md and "## How well the fitted model replays the run" in md
    first = advised.candidates[0].objectives[0]
    assert f"| {first['objective']} " in md.split("## Every objective per candidate")[1].splitlines()[2]
    assert 'id="advice"' in (run_dir / "report.html").read_text()
    api.report(run_dir, png=False)  # a rebuilt report keeps the section
    assert 'id="advice"' in (run_dir / "report.html").read_text()


@pytest.mark.timing
def test_the_advised_setting_measured_is_what_was_predicted(tmp_path: Path) -> None:
    """The main job's traffic, shortened: chunked prefill off fails the stall objective; the advice's setting (the
    recommendation, else the closest it names: a shortened run may leave no setting its headroom), run for real
    on the simulator, has the predicted figures (±30 %), and passes where the advice recommended it."""
    # 30 s (CI's time; 45 s before): measured on a quiet host, predicted vs measured TTFT p99 0.1 %, ITL p99 1.3 %,
    # ITL p99.9 2.1 % apart (45 s: 0.1, 0.1, 1.1 %); on a host loaded by other jobs (load average 5-7) the off
    # run's generator lagged at 25 and 30 s (p99 queue delay > 10 ms: inconclusive, exit 3, not 1)
    short = ["load.duration_s=30", "load.warmup_s=5"]
    off = tmp_path / "off"
    res = run_cli("run", "scenarios/long_context.yaml", *[a for s in short for a in ("--set", s)], "--out",
                  str(off), "--no-progress", "--no-png")
    assert res.returncode == 1 and "hint: a stall objective failed: `loadgen advise" in res.stdout, res.stdout
    adv = run_cli("advise", str(off), "--no-png", "--replays", "5")
    advice = Advice.from_dict(json.loads((off / "advice.json").read_text()))
    assert adv.returncode == advice.exit_code, adv.stdout + adv.stderr
    index = advice.recommended if advice.recommended is not None else advice.closest
    assert index not in (None, 0)
    rec = advice.candidates[index]  # type: ignore[index]
    assert rec.settings["chunked_prefill"] is True and " ".join(rec.flags) in " ".join(adv.stdout.split())
    on = tmp_path / "on"
    flags = [a for f in rec.flags for a in f.split(" ", 1)]
    res = run_cli("run", "scenarios/long_context.yaml", *[a for s in short for a in ("--set", s)], *flags,
                  "--out", str(on), "--no-progress", "--no-png")
    measured = summary(on)
    print(f"\n{adv.stdout}\npredicted {rec.figures}\nmeasured {measured['metrics']['ttft_ms']['p99']} "
          f"{measured['metrics']['itl_ms']['p99']} {measured['metrics']['itl_ms']['p999']} "
          f"{measured['metrics']['chunk_gap_ms']['max']}")
    if advice.recommended is not None:
        assert res.returncode == 0, res.stdout
    # not the worst gap: one sample, which on a shared host is the host's worst hiccup (a 256 budget's chunk
    # steps replay at 58 ms; one run measured a 133 ms gap); p99.9 is the chunk steps' plateau
    for label, metric, stat in (("TTFT p99", "ttft_ms", "p99"), ("ITL p99", "itl_ms", "p99"),
                                ("ITL p99.9", "itl_ms", "p999")):
        value = measured["metrics"][metric][stat]
        assert abs(rec.figures[label] - value) <= 0.30 * value, (label, rec.figures[label], value)  # type: ignore


# ---- the replay --------------------------------------------------------------------------------------------
def _cfg(**kw: object) -> EngineConfig:
    return EngineConfig(**{"max_num_seqs": 8, "kv_cache_tokens": 10**9, **kw})  # type: ignore[arg-type]


def test_an_idle_engine_answers_in_the_modelled_prefill_plus_the_delay() -> None:
    cfg = _cfg()
    reqs = [ReplayRequest(1, 0, "c", False, 0, 1000, 4), ReplayRequest(2, 0, "c", False, 5_000_000_000, 300, 4)]
    records, chunks = replay(cfg, reqs, ReplayLoad(None, 16, 2.0, 30.0), t0_ns=10**9)
    for rec in records:
        ttft_ms = (rec.t_first_token_ns - rec.t_sent_ns) / 1e6  # type: ignore[operator]
        assert ttft_ms == pytest.approx(prefill_alone_ms(cfg, rec.prompt_tokens) + 2.0, abs=0.01)
        assert rec.output_tokens == 4 and rec.finish_reason == "length"
    assert len(chunks) == 8 and records[1].t_sent_ns == 10**9 + 5_000_000_000


def test_a_long_prefill_stalls_the_running_decodes_unless_chunked() -> None:
    reqs = [ReplayRequest(i, 0, "v", False, i * 1_000_000, 100, 200) for i in range(4)]
    reqs.append(ReplayRequest(9, 0, "a", False, 500_000_000, 12_000, 4))

    def worst_gap_ms(cfg: EngineConfig) -> float:
        _, chunks = replay(cfg, reqs, ReplayLoad(None, 16, 0.0, 30.0))
        times: dict[int, list[int]] = {}
        for c in chunks:
            times.setdefault(c.seq, []).append(c.t_ns)
        return max((b - a) / 1e6 for seq, t in times.items() if seq != 9 for a, b in zip(t, t[1:]))

    whole, chunked = worst_gap_ms(_cfg()), worst_gap_ms(_cfg(chunked_prefill=True, max_num_batched_tokens=512))
    assert whole >= prefill_alone_ms(_cfg(), 12_000) and chunked < whole / 5


def test_closed_loop_users_and_the_drain_bound() -> None:
    reqs = [ReplayRequest(i, 0, "c", False, 0, 50, 10) for i in range(6)]
    records, _ = replay(_cfg(), reqs, ReplayLoad(2, 256, 0.0, 30.0))
    sends = sorted(r.t_sent_ns for r in records)
    assert sends[:2] == [0, 0] and all(s > 0 for s in sends[2:])  # two users, each waits for its answer
    stuck = [ReplayRequest(0, 0, "c", False, 0, 50, 10**6)]
    records, _ = replay(_cfg(), stuck, ReplayLoad(None, 16, 0.0, 1.0))
    assert records[0].error_kind == "cancelled" and records[0].t_done_ns <= 1.1e9


def test_step_noise_is_seeded() -> None:
    reqs = [ReplayRequest(i, 0, "c", False, i * 10**7, 64, 32) for i in range(8)]
    load = ReplayLoad(None, 16, 0.0, 30.0, (0.0, 5.0, 20.0), seed=3)
    a, b = replay(_cfg(), reqs, load), replay(_cfg(), reqs, load)
    assert [c.t_ns for c in a[1]] == [c.t_ns for c in b[1]] != [c.t_ns for c in replay(_cfg(), reqs, ReplayLoad(
        None, 16, 0.0, 30.0))[1]]


# ---- candidates, flags, the choice -------------------------------------------------------------------------
CURRENT = {"chunked_prefill": False, "max_num_batched_tokens": 8192, "max_num_seqs": 256}


def test_the_default_grid_and_tries() -> None:
    labels = [c.label for c in candidates(CURRENT, "vllm", {})]
    assert labels == ["chunked off (current)", "chunked 256", "chunked 512", "chunked 1024", "chunked 2048",
                      "chunked 4096", "chunked 8192"]
    tried = candidates(CURRENT, "vllm", parse_items(["max_num_batched_tokens=512,1024",
                                                     "max_num_seqs=64,128", "chunked_prefill=on"], many=True))
    assert [c.label for c in tried][1:] == ["chunked 512, max_num_seqs 64", "chunked 512, max_num_seqs 128",
                                            "chunked 1024, max_num_seqs 64", "chunked 1024, max_num_seqs 128"]
    llama = candidates({"max_num_batched_tokens": 2048, "max_num_seqs": 4}, "llamacpp", {})
    assert llama[0].label == "n_batch 2048 (current)" and len(llama) == 6


@pytest.mark.parametrize("engine,flags", [
    ("vllm", ["--enable-chunked-prefill", "--max-num-batched-tokens 512", "--max-num-seqs 256"]),
    ("sglang", ["--chunked-prefill-size 512", "--max-running-requests 256"]),
    ("llamacpp", ["--batch-size 512", "--parallel 256"]),
])
def test_each_engine_gets_its_own_flags(engine: str, flags: list[str]) -> None:
    assert engine_flags(engine, {**CURRENT, "chunked_prefill": True, "max_num_batched_tokens": 512}) == flags
    assert engine_flags("vllm", CURRENT)[0] == "--no-enable-chunked-prefill"


def _cand(label: str, passed: list[bool], goodput: float, ttft_p99: float) -> CandidateResult:
    return CandidateResult(label, {}, [], "pass", [{"objective": f"o{i}", "passed": p} for i, p in enumerate(passed)],
                           {"TTFT p99": ttft_p99}, goodput, {})


def test_the_choice_meets_every_objective_with_the_most_goodput_then_current_then_the_lowest_ttft() -> None:
    cands = [_cand("current", [True, False], 9.0, 100), _cand("a", [True, True], 5.0, 50),
             _cand("b", [True, True], 8.0, 900), _cand("c", [True, True], 7.99, 300)]
    assert recommend(cands) == 3  # b and c tie on goodput (within 1 %); c has the lower TTFT p99
    assert recommend(cands[:1]) is None
    cands[0] = _cand("current", [True, True], 7.95, 400)
    assert recommend(cands) == 0  # the current setting meets them all as well as any: no change


def test_nonnegative_least_squares() -> None:
    import numpy as np

    x = np.column_stack([np.ones(5), np.arange(5.0)])
    assert nonnegative_lstsq(x, 2 + 3 * np.arange(5.0), np.ones(5)) == pytest.approx([2, 3])
    assert nonnegative_lstsq(x, 10 - np.arange(5.0), np.ones(5))[1] == 0.0  # a falling line: slope held at 0


# ---- the command -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["--try", "max_num_seqs=many"], "max_num_seqs='many': expected int"),
    (["--try", "temperature=1"], "unknown server setting 'temperature'"),
    (["--server", "max_num_seqs"], "expected KEY=VALUE"),
    (["--try", "max_num_batched_tokens=0"], "must be positive"),
])
def test_bad_flags_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    res = run_cli("advise", str(tmp_path), "--no-png", *args)
    assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.slow
def test_too_few_completed_requests_to_fit_is_exit_2(tmp_path: Path) -> None:
    res = run_cli("run", "scenarios/smoke.yaml", "--duration", "2", "--out", str(tmp_path / "run"), "--no-progress",
                  "--no-png")
    assert res.returncode in (0, 3), res.stderr
    res = run_cli("advise", str(tmp_path / "run"))
    assert res.returncode == 2 and "the fit needs at least 20" in res.stderr
    assert not (tmp_path / "run" / "advice.json").exists()


def test_not_a_run_directory_is_exit_2(tmp_path: Path) -> None:
    res = run_cli("advise", str(tmp_path))
    assert res.returncode == 2 and "no run.json" in res.stderr
    with pytest.raises(SettingsError):
        parse_items(["chunked_prefill=maybe"], many=True)


# ---- --capacity ----------------------------------------------------------------------------------------------
def test_tiling_multiplies_the_rate_over_the_same_duration() -> None:
    from loadgen.advise.capacity import plan_span_ns, tiled

    reqs = [ReplayRequest(i, 0, "c", i < 2, i * 100_000_000, 10, 10) for i in range(10)]  # 10 req/s for 1 s
    assert plan_span_ns(reqs) == 1_000_000_000
    for factor in (0.5, 1.0, 2.5):
        plan = tiled(reqs, factor)
        assert len(plan) == round(10 * factor) and max(r.t_intended_ns for r in plan) < 1_000_000_000
        assert len({(r.worker, r.seq) for r in plan}) == len(plan) and sum(r.warmup for r in plan) <= 2


@pytest.mark.parametrize("threshold", [0.3, 1.0, 3.7, 50.0])
def test_the_capacity_search_brackets_the_threshold(threshold: float) -> None:
    from loadgen.advise.capacity import search

    lo, hi = search(lambda f: f <= threshold, tolerance=0.05)
    assert lo is not None and lo <= threshold and (hi is None or (hi > threshold and hi - lo <= 0.05 * lo))


@pytest.mark.timing
def test_capacity_on_the_calibrated_simulator_matches_the_known_capacity(tmp_path: Path) -> None:
    """The sweep's known-capacity simulator (4 seats, 10 steps of 20 ms a request: 20 req/s), measured at 12
    req/s: advise --capacity finds its capacity from the fitted model, and twice that with twice the seats."""
    import yaml

    from tests.test_sweep import KNOWN, KNOWN_CAPACITY_PER_S

    scenario = tmp_path / "known.yaml"
    scenario.write_text(yaml.safe_dump(KNOWN))
    res = run_cli("run", str(scenario), "--out", str(tmp_path / "run"), "--no-progress", "--no-png",
                  "--set", "load.duration_s=6")  # 6 s, not the scenario's 10 (CI's time): 60 requests fit the model
    assert res.returncode in (0, 3), res.stdout  # 3: 60 requests do not decide an error rate of 1 % (the verdict)
    advice = api.advise(tmp_path / "run", tries=["max_num_seqs=4,8"], capacity=True, png=False)
    four, eight = advice.candidates
    print(f"\ncapacity: 4 seats {four.capacity_requests_per_s}, 8 seats {eight.capacity_requests_per_s} req/s")
    assert four.capacity_requests_per_s == pytest.approx(KNOWN_CAPACITY_PER_S, rel=0.15)
    assert eight.capacity_requests_per_s == pytest.approx(2 * KNOWN_CAPACITY_PER_S, rel=0.15)
    four.headroom = eight.headroom = None  # the ranking alone (a 10 s run's p99 is not decided with evidence)
    assert recommend(advice.candidates) == 1  # the most goodput at capacity
    assert "capacity req/s" in (tmp_path / "run" / "advice.md").read_text()


def test_a_gap_ending_in_a_burst_of_chunks_is_a_held_delivery_not_an_engine_step() -> None:
    import polars as pl

    from loadgen.analysis.calibrate import held_deliveries

    ms = 1_000_000
    steady = [i * 10 * ms for i in range(10)]  # one chunk every 10 ms
    held = steady + [590 * ms + i * ms // 10 for i in range(6)]  # 500 ms, then 6 chunks within 0.6 ms
    short = steady + [590 * ms + i * ms // 10 for i in range(4)]  # 4 at once: chunk coalescing, not a hold
    chunks = pl.DataFrame({"seq": [1] * len(held) + [2] * len(short), "t_ns": held + short, "tokens": 1,
                           "worker": 0})
    requests = pl.DataFrame({"seq": [1, 2], "worker": [0, 0], "class_name": "c", "warmup": False})
    assert held_deliveries(requests, chunks).to_list() == [500.0]
