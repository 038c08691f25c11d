"""What-if over a measured run, from its records alone (no I/O here; ``run/advise.py`` reads and writes):

1. **Calibrate** the simulator's cost model to the run (``analysis/calibrate.py``) and replay the run's own plan
   under the server's setting: predicted against measured TTFT, ITL, worst gap and prefill-induced stalls show
   how far the model can be trusted.
2. **Counterfactuals**: the same plan under each candidate setting (``settings.py``), every objective of the
   scenario that the replay can move judged on the replay by the same analysis as a measured run; the others
   (``headroom.ON_RUN_ONLY``: the error rate, the answer phase) are the measured run's own judgment, once.
3. **Headroom**: each candidate replayed under ``seeds`` step-noise seeds, every replay judged with the margin
   (``headroom.py``: the stall threshold lowered by it, every objective keeping it and passing with evidence).
4. **Recommend** the candidate that keeps the margin in 95 % of its replays with the most goodput, with its flags
   and costs; with ``capacity``, each candidate's capacity on the calibrated simulator (``capacity.py``) ranks
   them. When no candidate of the default grid qualifies, up to ``REFINE_ROUNDS`` rounds try the budgets halfway
   between the closest one and its neighbours; still none: the closest, and how short it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable

import polars as pl

from local_target.sim.config import EngineConfig
from loadgen.advise.capacity import MAX_FACTOR, plan_span_ns, search, tiled
from loadgen.advise.headroom import (DEFAULT_MARGIN, DEFAULT_SEEDS, ON_RUN_ONLY, headroom_of, holds, keeps_margin,
                                    replay_judges, required, stressed)
from loadgen.advise.replay import ReplayLoad, ReplayRequest, replay
from loadgen.advise.settings import (ENGINE_DEFAULTS, KNOBS, Candidate, budgets_between, candidates, label_of,
                                    simulator_flags)
from loadgen.analysis.advice_result import (Advice, CandidateResult, FitRow, Headroom, closest, costs_of, fit_rows,
                                            recommend)
from loadgen.analysis.calibrate import Calibration, calibrate
from loadgen.records.schema import chunks_frame, requests_frame
from loadgen.analysis.metrics import with_request_metrics
from loadgen.analysis.result import RunResult
from loadgen.analysis.summary import summarize
from loadgen.core.vocabulary import ObjectiveId
from loadgen.plan.scenario import Scenario
from loadgen.report.wording import with_headline
from loadgen.errors import AdviceError as AdviceError

UNBOUNDED_KV_TOKENS = 10**12
REFINE_ROUNDS = 3  # when no grid setting qualifies: rounds of budgets halfway to the closest one's neighbours
MIN_COMPLETED = 20


@dataclass
class RunData:
    """What the advisor reads of a run directory."""

    info: dict[str, Any]  # run.json
    scenario: Scenario
    requests: pl.DataFrame
    chunks: pl.DataFrame
    server: pl.DataFrame | None
    run_dir: str = ""
    summary: dict[str, Any] | None = None  # summary.json, where the run wrote one (read, not recomputed)


@dataclass
class AdviseOptions:
    tries: dict[str, list[Any]] = field(default_factory=dict)  # --try KEY=V1,V2
    server: dict[str, Any] = field(default_factory=dict)  # --server KEY=V: what the run's server ran with
    capacity: bool = False  # --capacity: each candidate's highest rate meeting every objective
    seeds: int = DEFAULT_SEEDS  # --replays: replays per candidate
    margin: float = DEFAULT_MARGIN  # --margin: the share of each limit to keep

    def check(self) -> None:
        if self.seeds < 1:
            raise AdviceError(f"--replays {self.seeds}: at least 1")
        if not 0 <= self.margin < 1:
            raise AdviceError(f"--margin {self.margin * 100:g}%: a percentage from 0 to below 100")


def result_of(scenario: Scenario, requests: pl.DataFrame, chunks: pl.DataFrame, planned: int | None,
              server: pl.DataFrame | None = None) -> RunResult:
    summary, _ = summarize(scenario, requests, chunks, planned, None, server, ledger=False)
    return RunResult.from_dict(with_headline(summary))


def current_settings(data: RunData, engine: str, given: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The run's server settings and where they came from: the embedded simulator's run.json, else --server
    over the engine's defaults."""
    sim = (data.info.get("target") or {}).get("simulator")
    if sim:
        base = {k: sim[k] for k in ("chunked_prefill", "max_num_batched_tokens", "max_num_seqs") if k in sim}
        return {**base, **given}, "run.json" if not given else "run.json and --server"
    base = dict(ENGINE_DEFAULTS.get(engine, ENGINE_DEFAULTS["vllm"]))
    assumed = sorted(set(base) - set(given))
    return {**base, **given}, ("--server" if given else "") + (
        (" and " if given else "") + f"{engine}'s defaults for " + ", ".join(assumed) if assumed else "")


def replay_requests(requests: pl.DataFrame) -> tuple[list[ReplayRequest], int]:
    """The run's requests as the replay takes them (achieved lengths; a failed request's asked output) and
    the run's start. The replay has no prefix cache: a prompt the server found partly cached replays as the
    tokens it prefilled (``cached_tokens`` off), sent when it was sent (a conversation's turns included)."""
    t0 = int(requests["t_intended_ns"].min())  # type: ignore[arg-type]
    out = []
    for r in requests.iter_rows(named=True):
        ok = r["error_kind"] is None
        prompt = (r["prompt_tokens"] or r["prompt_tokens_asked"]) - (r.get("cached_tokens") or 0)
        out.append(ReplayRequest(r["seq"], r["worker"], r["class_name"], r["warmup"], r["t_intended_ns"] - t0,
                                 max(1, prompt), max(1, r["output_tokens"] if ok else r["output_tokens_asked"])))
    return out, t0


def engine_config(engine: str, settings: dict[str, Any], cal: Calibration) -> EngineConfig:
    knobs = {k: v for k, v in settings.items() if k in KNOBS}
    if engine == "llamacpp":
        knobs["chunked_prefill"] = True
    return EngineConfig(engine=engine, max_model_len=10**7, kv_cache_tokens=cal.kv_cache_tokens or UNBOUNDED_KV_TOKENS,
                        spin_ms=0.0, **knobs, **cal.cost)


@dataclass
class _Replayer:
    """The run's plan, the fitted model and the client's load: one replay per call, judged like a run."""

    data: RunData
    engine: str
    cal: Calibration
    reqs: list[ReplayRequest]
    load: ReplayLoad
    t0_ns: int

    def frames(self, settings: dict[str, Any], reqs: list[ReplayRequest] | None = None,
               seed: int | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
        """One replay's records (the scenario's seed for the step noise, or ``seed``)."""
        load = self.load if seed is None else replace(self.load, seed=seed)
        records, chunk_records = replay(engine_config(self.engine, settings, self.cal), reqs or self.reqs, load,
                                        self.t0_ns)
        return requests_frame(records), chunks_frame(chunk_records)

    def result(self, settings: dict[str, Any], reqs: list[ReplayRequest] | None = None,
               frames: tuple[pl.DataFrame, pl.DataFrame] | None = None,
               scenario: Scenario | None = None) -> RunResult:
        requests, chunks = frames or self.frames(settings, reqs)
        r = result_of(scenario or self.data.scenario, requests, chunks, requests.height)
        return replace(r, slo=[o for o in r.slo if replay_judges(dict(o))])  # the objectives it can move

    def headroom(self, cand: Candidate, opts: AdviseOptions, first: tuple[pl.DataFrame, pl.DataFrame],
                 progress: Callable[[str], None]) -> Headroom:
        """The candidate under ``opts.seeds`` seeds (the first replay is ``first``), each judged as the scenario
        says (the decisions) and with the stall threshold lowered by the margin (the margins); stops once more
        replays have failed than the rule allows."""
        judge, allowed = stressed(self.data.scenario, opts.margin), opts.seeds - required(opts.seeds)
        runs: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = []
        for k in range(opts.seeds):
            frames = first if k == 0 else self.frames(cand.fields, seed=self.load.seed + k)
            nominal = [dict(o) for o in self.result(cand.fields, frames=frames).slo]
            runs.append((nominal, [dict(o) for o in self.result(cand.fields, frames=frames, scenario=judge).slo]
                         if judge is not self.data.scenario else nominal))
            if sum(not holds(*r, opts.margin) for r in runs) > allowed:
                break
            if k % 5 == 4:
                progress(f"{cand.label}: {k + 1}/{opts.seeds} replays")
        return headroom_of(runs, opts.margin, opts.seeds)

    def capacity(self, cand: Candidate, progress: Callable[[str], None]) -> tuple[float | None, str]:
        """The highest request rate at which the replay meets every objective, and a note on the figure."""
        rate_per_s = len(self.reqs) / (plan_span_ns(self.reqs) / 1e9)

        def meets(factor: float) -> bool:
            r = self.result(cand.fields, tiled(self.reqs, factor))  # one replay, judged on point values
            return bool(r.slo) and all(keeps_margin(dict(o), 0.0) for o in r.slo)

        lo, hi = search(meets, progress=lambda f, ok: progress(
            f"{cand.label}: {f * rate_per_s:.2f} req/s {'meets every objective' if ok else 'fails'}"))
        if lo is None:
            return None, f"fails even at 1/{MAX_FACTOR:g} of the run's rate"
        return lo * rate_per_s, "at least: the search's ceiling" if hi is None else ""


def advise(data: RunData, opts: AdviseOptions, progress: Callable[[str], None] = lambda line: None) -> Advice:
    opts.check()
    req = with_request_metrics(data.requests)
    completed = int(req.filter(pl.col("ok") & ~pl.col("warmup")).height)
    if completed < MIN_COMPLETED:
        raise AdviceError(f"{data.run_dir}: {completed} completed requests; the fit needs at least {MIN_COMPLETED}")
    engine = (data.info.get("target") or {}).get("engine") or "vllm"
    current, source = current_settings(data, engine, opts.server)
    measured = (RunResult.from_dict(data.summary) if data.summary is not None
                else result_of(data.scenario, data.requests, data.chunks, data.info.get("planned"), data.server))
    cal = calibrate(req, data.chunks, dict(measured.stalls.get("prefill_fit") or {}), data.server)
    reqs, t0 = replay_requests(data.requests)
    if cal.kv_cache_tokens is not None:  # the server held the run's largest request, whatever the estimate
        cal.kv_cache_tokens = max(cal.kv_cache_tokens, max(r.prompt_tokens + r.output_tokens for r in reqs))
    load = data.scenario.load
    closed = load.concurrency if load.arrival == "concurrency" else None
    rp = _Replayer(data, engine, cal, reqs, ReplayLoad(closed, load.max_in_flight, cal.arrival_delay_ms,
                                                       load.drain_timeout_s, tuple(cal.step_noise_ms),
                                                       data.scenario.seed), t0)
    simulated = (data.info.get("target") or {}).get("simulator") is not None
    results: list[CandidateResult] = []
    fit: list[FitRow] = []

    def judge(cand: Candidate) -> CandidateResult:
        progress(f"replay {len(results) + 1}: {cand.label}")
        first = rp.frames(cand.fields)
        replayed = rp.result(cand.fields, frames=first)
        if not fit:  # the current setting (the first) under the scenario's seed: how well the model fits
            fit.extend(fit_rows(measured, replayed))
        flags = simulator_flags(cand.fields) if simulated else cand.flags(engine)
        out = CandidateResult.from_result(cand.label, cand.fields, flags, replayed)
        out.headroom = rp.headroom(cand, opts, first, progress)
        if opts.capacity and closed is None:
            out.capacity_requests_per_s, out.capacity_note = rp.capacity(cand, progress)
        return out

    for cand in candidates(current, engine, opts.tries):
        results.append(judge(cand))
    for _ in range(0 if opts.tries else REFINE_ROUNDS):  # none qualifies: look between the grid's budgets
        near = closest(results) if recommend(results) is None else None
        more = [] if near is None else budgets_between(results[near].settings, [r.settings for r in results], engine)
        results += [judge(Candidate(label_of(f, engine, current), f)) for f in more]
        if not more:
            break
    chosen = recommend(results)
    notes = list(cal.notes) + _notes(source, engine, data, opts)
    return Advice(data.run_dir, engine, source, current, cal.as_dict(), fit, results, chosen,
                  costs_of(results[chosen], results[0]) if chosen is not None else [], notes, opts.margin,
                  opts.seeds, closest(results) if chosen is None else None,
                  [o["objective"] for o in results[0].objectives], on_run(measured))


ON_RUN_KEYS = ("objective", "comparison", "threshold", "value", "decision", "samples", "needed", "note")


def on_run(measured: RunResult) -> list[dict[str, Any]]:
    """The measured run's judgment of each objective the replay cannot move, and why it cannot."""
    out = []
    for o in (dict(x) for x in measured.slo):
        if not replay_judges(o):
            decision = o.get("decision") or {True: "pass", False: "fail"}.get(o.get("passed"), "inconclusive")
            out.append({**{k: o.get(k) for k in ON_RUN_KEYS}, "decision": decision,
                        "why": ON_RUN_ONLY[ObjectiveId.of(o).metric]})
    return out


def _notes(source: str, engine: str, data: RunData, opts: AdviseOptions) -> list[str]:
    out = []
    if not (data.info.get("target") or {}).get("engine"):
        out.append("the server's engine was not recognised (no /metrics, no tokenize dialect): replayed as vLLM's "
                   "scheduler, with vLLM's flags")
    if opts.capacity and data.scenario.load.arrival == "concurrency":
        out.append("--capacity searches open-loop runs only (a request rate); this run is closed-loop")
    if "defaults" in source:
        assumed = source.split(" for ", 1)[1]
        out.append(f"{engine}'s defaults were assumed for {assumed} (not given): pass --server KEY=VALUE for each "
                   "setting the server ran with (a wrong one shows as a poor replay of the run)")
    if data.scenario.load.arrival == "concurrency" and data.scenario.load.max_rate_per_s:
        out.append("the replay's closed-loop users are not held to load.max_rate_per_s")
    if data.requests["cached_tokens"].fill_null(0).sum() > 0:
        out.append("the server's prefix cache held part of some prompts: the replay prefills only the rest "
                   "(the tokens it computed), and its cache is not modelled for the candidates either")
    return out
