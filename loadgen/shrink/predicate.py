"""The search's predicate: a candidate set replayed in virtual time (``advise/replay.py``) on the simulator made
to match the run's target, and whether the victim stalls again.

- A run on the **embedded simulator**: its own engine configuration, rebuilt from the scenario in run.json
  (the preset and overrides the run started it with), so the replay is that server's scheduler and cost model
  exactly; the request's way to the engine costs ``SIM_ARRIVAL_DELAY_MS`` (as tests/virtual_truth.py).
- **Any other target**: the cost model fitted to the run (``analysis/calibrate.py``) and the server's settings
  as ``loadgen advise`` takes them (``advise/whatif.py``: run.json, else the engine's defaults), with the fitted
  step noise under the scenario's seed.

*Reproduced*: the victim's worst chunk gap in the replay is at least ``share`` (default 0.5) of the original
(a TTFT event: its time from send to first token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from local_target.sim import build_config
from local_target.sim.config import EngineConfig
from loadgen.advise.replay import ReplayLoad, ReplayRequest, replay
from loadgen.advise.whatif import RunData, current_settings, engine_config
from loadgen.analysis.calibrate import calibrate
from loadgen.analysis.metrics import with_request_metrics
from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.run.reporting import stored_summary
from loadgen.shrink.event import Item, RunRecords

SIM_ARRIVAL_DELAY_MS = 1.0
NS_PER_MS = 1e6


@dataclass(frozen=True)
class Model:
    """The server a candidate is replayed on, and how the client sends."""

    cfg: EngineConfig
    load: ReplayLoad
    source: str  # "the embedded simulator's own configuration" or "the cost model fitted to the run"


def model_of(run: RunRecords) -> Model:
    load = run.scenario.load
    sim = (run.info.get("target") or {}).get("simulator")
    if sim:
        spec = run.scenario.target.simulator
        cfg = build_config(spec.preset_name, overrides=spec.overrides())
        return Model(cfg, ReplayLoad(None, load.max_in_flight, SIM_ARRIVAL_DELAY_MS, load.drain_timeout_s,
                                     seed=run.scenario.seed), "the embedded simulator's own configuration")
    stored = stored_summary(run.run_dir)
    prefill_fit = dict(((stored[0].get("stalls") or {}).get("prefill_fit") or {}) if stored else {})
    cal = calibrate(with_request_metrics(run.requests), run.chunks, prefill_fit, None)
    engine = (run.info.get("target") or {}).get("engine") or "vllm"
    data = RunData(run.info, run.scenario, run.requests, run.chunks, None, str(run.run_dir))
    settings, _ = current_settings(data, engine, {})
    return Model(engine_config(engine, settings, cal),
                 ReplayLoad(None, load.max_in_flight, cal.arrival_delay_ms, load.drain_timeout_s,
                            tuple(cal.step_noise_ms), run.scenario.seed),
                 f"the cost model fitted to the run ({engine}'s scheduler)")


def _replay(model: Model, items: Sequence[Item]) -> tuple[list[RequestRecord], list[ChunkRecord]]:
    """The replay of ``items``, stamped from the first one's intended send (0)."""
    t0 = min(i.t_intended_ns for i in items)
    reqs = [ReplayRequest(i.seq, i.worker, i.class_name, False, i.t_intended_ns - t0, i.prompt_tokens,
                          i.output_tokens) for i in items]
    return replay(model.cfg, reqs, model.load)


def replay_gaps(model: Model, items: Sequence[Item]) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """Every stream's chunk gaps in the replay of ``items``: (worker, seq) → [(end ns from the first send,
    gap ms)]."""
    return _gaps(_replay(model, items)[1])


def _gaps(chunks: list[ChunkRecord]) -> dict[tuple[int, int], list[tuple[int, float]]]:
    times: dict[tuple[int, int], list[int]] = {}
    for c in chunks:
        times.setdefault((c.worker, c.seq), []).append(c.t_ns)
    return {k: [(b, (b - a) / NS_PER_MS) for a, b in zip(sorted(v), sorted(v)[1:])] for k, v in times.items()}


def victim_value_ms(model: Model, items: Sequence[Item], victim: Item, metric: str = "chunk_gap_ms") -> float:
    """What the event measures of the victim when ``items`` are replayed: its worst chunk gap (0 when it
    streamed under two chunks), or for ``ttft_ms`` its time from send to first token (to its end, if none)."""
    records, chunks = _replay(model, items)
    if metric == "ttft_ms":
        rec = next(r for r in records if (r.worker, r.seq) == (victim.worker, victim.seq))
        return ((rec.t_first_token_ns or rec.t_done_ns or rec.t_sent_ns) - rec.t_sent_ns) / NS_PER_MS
    gaps = _gaps(chunks).get((victim.worker, victim.seq), [])
    return max((g for _, g in gaps), default=0.0)
