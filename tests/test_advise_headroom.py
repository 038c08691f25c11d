"""advise's headroom rule (loadgen/advise/headroom.py): margins as shares of the limit, the stall threshold
lowered by the margin, decisions with evidence, 95 % of seeded replays; and the rule end to end in virtual time:
a synthetic run of the main job's traffic replayed through the simulator (no clock, no sockets)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from local_target.sim.config import build_config
from loadgen.advise.headroom import (decided_pass, headroom_of, holds, keeps_margin, kept_margin, relative_margin,
                                     required, stressed)
from loadgen.advise.replay import ReplayLoad, ReplayRequest, replay
from loadgen.advise.whatif import AdviceError, AdviseOptions, RunData, advise
from loadgen.analysis.advice_result import Advice, CandidateResult, closest, recommend
from loadgen.plan.scenario_file import load_scenario
from loadgen.records.schema import chunks_frame, requests_frame
from loadgen.report.advice_report import headline, markdown


def _o(value: float | None, limit: float, comparison: str = "<=", decision: str | None = "pass",
       name: str = "x") -> dict[str, Any]:
    return {"objective": name, "value": value, "threshold": limit, "comparison": comparison, "decision": decision,
            "passed": decision == "pass" if decision != "inconclusive" else None}


def test_margins_are_shares_of_the_limit_on_the_side_of_room() -> None:
    assert relative_margin(_o(90, 100)) == pytest.approx(0.10)
    assert relative_margin(_o(110, 100)) == pytest.approx(-0.10)
    assert relative_margin(_o(0.55, 0.5, ">=")) == pytest.approx(0.10)
    assert relative_margin(_o(None, 100)) is None and relative_margin(_o(0.0, 0.0)) is None
    assert keeps_margin(_o(0.0, 0.0), 0.1) and not keeps_margin(_o(0.001, 0.0), 0.1)  # a 0 limit: exactly 0
    assert keeps_margin(_o(90, 100), 0.10) and not keeps_margin(_o(90.01, 100), 0.10)


def test_a_pass_needs_the_evidence_where_the_verdict_has_it() -> None:
    assert decided_pass(_o(1, 100)) and not decided_pass(_o(1, 100, decision="inconclusive"))
    point = {"objective": "x", "value": 1, "threshold": 100, "passed": True}  # a summary without decisions
    assert decided_pass(point) and not decided_pass({**point, "passed": None})
    # far inside the limit, but its interval reaches it: the replay does not hold
    assert not holds([_o(1, 100, decision="inconclusive")], [_o(1, 100)], 0.1)
    # decided pass, but the judgment with the lowered stall threshold leaves no margin
    assert not holds([_o(0.0, 0.1)], [_o(0.095, 0.1)], 0.1)
    assert holds([_o(0.0, 0.1)], [_o(0.05, 0.1)], 0.1) and not holds([], [], 0.1)


def test_ninety_five_percent_of_the_seeds_and_the_margin_kept_by_them() -> None:
    assert [required(n) for n in (1, 5, 10, 19, 20, 40)] == [1, 5, 10, 19, 19, 38]
    margins = [0.3, 0.05, 0.2, 0.12, *[0.5] * 16]
    assert kept_margin(margins, 20) == 0.12  # 19 of 20 keep 12 %: the second worst
    assert kept_margin([0.3, 0.05], 20) == 0.3  # stopped early: of those run
    assert kept_margin(margins[:10], 10) == 0.05  # of 10, all must hold: the worst


def test_headroom_over_replays_counts_what_held() -> None:
    ok, short = ([_o(50, 100)], [_o(50, 100)]), ([_o(50, 100)], [_o(95, 100)])
    undecided = ([{**_o(50, 100, decision="inconclusive"), "needed": 900, "samples": 400}], [_o(50, 100)])
    h = headroom_of([ok] * 18 + [short, undecided], 0.10, 20)
    assert (h.held, h.required, h.qualifies) == (18, 19, False)
    o = h.objectives[0]
    assert (o.short, o.undecided, o.worst, o.kept) == (2, 1, pytest.approx(0.05), pytest.approx(0.5))
    assert o.needed == 900 and headroom_of([ok] * 19 + [short], 0.10, 20).qualifies
    never = headroom_of([undecided] * 2, 0.10, 20)  # stopped after two: no interval decided it
    assert (never.replays, never.held, [x.objective for x in never.failing]) == (2, 0, ["x"])
    cand = CandidateResult("c", {}, [], "inconclusive", [], {}, 1.0, {}, headroom=never)
    text = headline(Advice("run", "vllm", "run.json", {}, {}, [], [cand], None, margin=0.1, seeds=20, closest=0))
    assert "not passed with evidence: x in 2 of 2 (needs 900 samples, has 400: a run ~2.2× as long)" in text


def test_the_stall_threshold_is_lowered_by_the_margin() -> None:
    main = load_scenario("scenarios/long_context.yaml")  # floor: the itl_ms p99 limit, 100 ms
    low = stressed(main, 0.10)
    assert (low.slo.stalls.min_gap_ms, low.slo.stalls.spike_factor) == (pytest.approx(90.0), pytest.approx(3.6))
    assert low.slo.itl_ms == main.slo.itl_ms and low.slo.ttft_ms == main.slo.ttft_ms
    assert main.slo.stalls.min_gap_ms is None  # the scenario itself is untouched
    own = load_scenario("scenarios/long_context.yaml", ["slo.stalls.min_gap_ms=250"])
    assert stressed(own, 0.2).slo.stalls.min_gap_ms == pytest.approx(200.0)


def _cand(label: str, held: int, kept: float, goodput: float = 1.0, undecided: int = 0) -> CandidateResult:
    h = headroom_of([([_o(0.5, 1.0)], [_o(1 - kept, 1.0)])] * held
                    + [([_o(0.5, 1.0, decision="inconclusive" if undecided else "pass")], [_o(0.99, 1.0)])]
                    * (20 - held), 0.10, 20)
    return CandidateResult(label, {}, [], "pass", [{"objective": "x", "passed": True}], {"TTFT p99": 1.0},
                           goodput, {}, headroom=h)


def test_only_a_setting_with_headroom_is_recommended_else_the_closest_is_named() -> None:
    cands = [_cand("current", 0, 0.5), _cand("thin", 20, 0.04, goodput=9.0), _cand("roomy", 20, 0.2)]
    assert recommend(cands) == 2  # "thin" meets everything, with more goodput, but keeps 4 % only
    cands = [_cand("current", 0, 0.5, undecided=1), _cand("thin", 20, 0.04), _cand("thinner", 20, 0.02)]
    assert recommend(cands) is None and closest(cands) == 1
    a = Advice("run", "vllm", "run.json", {}, {}, [], cands, None, margin=0.10, seeds=20, closest=1)
    assert headline(a).startswith("no candidate setting keeps a 10 % margin on every objective it covers in 19 of "
                                  "20 replays; the closest: thin (held in 0 of 20; least margin kept x 4.0 %, 6.0 "
                                  "points short)")
    assert a.exit_code == 1 and Advice.from_dict(a.to_dict()).to_dict() == a.to_dict()


@pytest.mark.parametrize("args", [{"seeds": 0}, {"margin": 1.0}, {"margin": -0.1}])
def test_bad_seeds_or_margin_are_refused(args: dict[str, Any]) -> None:
    with pytest.raises(AdviceError):
        AdviseOptions(**args).check()


# ---- the rule end to end, in virtual time -----------------------------------------------------------------
def _main_job_plan(seconds: float = 60, rate_per_s: float = 4.0, seed: int = 3) -> list[ReplayRequest]:
    """The main job's traffic: chat (~300-token prompts, ~200 tokens out) with 5 % long documents (8k-16k)."""
    rng, t, out = random.Random(seed), 0.0, []
    while t < seconds:
        t += rng.expovariate(rate_per_s)
        long = rng.random() < 0.05
        out.append(ReplayRequest(len(out), 0, "long_doc" if long else "chat", t < 5, int(t * 1e9),
                                 rng.randint(8000, 16000) if long else max(16, int(rng.lognormvariate(5.7, 0.6))),
                                 64 if long else max(16, int(rng.gauss(200, 50)))))
    return out


@pytest.fixture(scope="module")
def synthetic_run() -> RunData:
    """A 60 s 'run' of an A100-like engine, chunked prefill off: its own replay, with jittered steps. The SLOs:
    the main job's stall objective (floor 100 ms) and medians; the tails' intervals need a longer run."""
    scenario = load_scenario("scenarios/long_context.yaml", [
        "slo.ttft_ms.p99=null", "slo.itl_ms.p99=null", "slo.stalls.min_gap_ms=100", "slo.error_rate.max=0.05"])
    truth = build_config("a100-llama-7b", overrides={"chunked_prefill": False, "spin_ms": 0.0})
    records, chunks = replay(truth, _main_job_plan(), ReplayLoad(None, 256, 5.0, 30.0, (-0.5, 0.0, 0.3, 1.0), 1),
                             t0_ns=10**12)
    info = {"target": {"engine": "vllm", "simulator": {"chunked_prefill": False, "max_num_batched_tokens": 16384,
                                                       "max_num_seqs": 256}}, "planned": len(records)}
    return RunData(info, scenario, requests_frame(records), chunks_frame(chunks), None, "synthetic")


def test_gaps_just_under_the_stall_threshold_are_not_headroom(synthetic_run: RunData) -> None:
    """Budget 448: chunk steps of ~91 ms against a 100 ms stall threshold, so the replay passes every objective
    (zero stalls), but gaps 10 % longer would be stalls; budget 384 (~80 ms steps) keeps the margin in every
    replay and is the advice. With a 5 % margin 448 keeps it too and, at the same goodput, its lower TTFT p99
    is the advice."""
    tries = {"chunked_prefill": [True], "max_num_batched_tokens": [384, 448]}
    advice = advise(synthetic_run, AdviseOptions(tries=tries, seeds=5))
    off, b384, b448 = advice.candidates
    assert b448.meets_all and b448.headroom is not None and not b448.headroom.qualifies
    stall = b448.headroom.objectives[-1]
    assert stall.objective.startswith("stalls.") and stall.undecided == 0 and stall.kept is not None
    assert stall.kept < 0.10  # stalls counted at 90 ms
    assert advice.recommendation is b384 and b384.headroom is not None
    assert b384.headroom.held == b384.headroom.replays == 5
    assert all(o.kept is None or o.kept >= 0.10 for o in b384.headroom.objectives)
    assert off.headroom is not None and off.headroom.replays == 1  # fails at once: no more replays spent on it
    assert headline(advice).startswith("recommended: chunked 384 — kept a 10 % margin on every objective it covers "
                                       "in 5 of 5 replays")
    assert "| chunked 384 | held in 5 of 5 (all run) |" in markdown(advice)
    wide = advise(synthetic_run, AdviseOptions(tries=tries, seeds=5, margin=0.05))
    assert wide.candidates[2].headroom is not None and wide.candidates[2].headroom.qualifies
    assert wide.recommendation is wide.candidates[2]  # 448: the lower TTFT p99 at the same goodput


def test_between_the_grid_s_budgets_halfway_to_the_closest_one_s_neighbours() -> None:
    from loadgen.advise.settings import budgets_between

    base = {"chunked_prefill": True, "max_num_seqs": 256}
    tried = [{**base, "max_num_batched_tokens": b} for b in (256, 512, 1024)] + [
        {"chunked_prefill": False, "max_num_batched_tokens": 16384, "max_num_seqs": 256},
        {**base, "max_num_seqs": 64, "max_num_batched_tokens": 384}]  # another max_num_seqs: not a neighbour
    assert [f["max_num_batched_tokens"] for f in budgets_between(tried[1], tried, "vllm")] == [384, 768]
    assert [f["max_num_batched_tokens"] for f in budgets_between(tried[0], tried, "vllm")] == [384]
    tried.append({**base, "max_num_batched_tokens": 448})
    assert [f["max_num_batched_tokens"] for f in budgets_between(tried[-1], tried, "vllm")] == [352, 480]
    assert budgets_between(tried[3], tried, "vllm") == []  # chunked prefill off: no budget to refine
    assert budgets_between({**base, "max_num_batched_tokens": 256},
                           [{**base, "max_num_batched_tokens": 272}], "vllm") == []  # 256 + 8 rounds onto 256/272
