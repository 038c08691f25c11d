"""Stall attribution scored against the ground truth on every engine personality, in virtual time: the scenario's
own plan through the simulator's scheduler (tests/virtual_truth.py), loadgen's analysis on the records, the
engine's steps as truth (tests/ground_truth.py, the same rule as for the simulator's trace). A second per case
instead of a 30 s real-time run each; tests/test_spike_truth.py keeps the real-time run end to end, where
delivery jitter and the client's own timing are part of what is scored."""

from __future__ import annotations

import pytest

from tests.ground_truth import predicted_pairs_of, score_pairs, truth_pairs_of
from tests.virtual_truth import virtual_run

# Each scheduler the simulator reproduces (local_target/sim/engine.py), with what makes it itself: llama.cpp's
# 2048-token n_batch slices, vLLM's chunked prefill with a budget large enough that every chunk is a stall.
ENGINES = {
    "vllm": [],
    "vllm-chunked-4096": ["target.simulator.chunked_prefill=true", "target.simulator.max_num_batched_tokens=4096"],
    "sglang": ["target.simulator.engine=sglang"],
    "llamacpp": ["target.simulator.engine=llamacpp", "target.simulator.max_num_batched_tokens=2048"],
    "tgi": ["target.simulator.engine=tgi"],
}
RUNS = {"aggressor_victim": "scenarios/aggressor_victim.yaml", "mixed": "tests/data/mixed_engines.yaml"}


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("engine", ENGINES)
def test_attribution_holds_on_every_engine(engine: str, run: str) -> None:
    v = virtual_run(RUNS[run], ENGINES[engine])
    st = v.summary["stalls"]
    truth = truth_pairs_of(v.trace, v.seq_of, st["long_prompt_tokens"], st["min_gap_ms"])
    sc = score_pairs(truth, predicted_pairs_of(v.chunks, v.stalls), v.requests)
    print(f"{engine} {run}: precision {sc.precision:.3f} recall {sc.recall:.3f} ({sc.hits} of {sc.truth} true "
          f"pairs, {sc.predicted} predicted)")
    assert sc.truth >= 30  # long prefills really stalled running streams
    assert sc.precision >= 0.95 and sc.recall >= 0.90, (sc.missed, sc.wrong)


def test_the_replay_trace_is_the_engines_own() -> None:
    """The truth is not read off the records it scores: every token the records hold is one the trace's steps
    emitted, at that step's end, and every long prompt's prefill is in the steps."""
    v = virtual_run(RUNS["mixed"], ENGINES["llamacpp"])
    emitted = {(rid, index): t for e in v.trace if e["type"] == "step" for rid, index, t in e["tokens"]}
    chunks = v.chunks.sort("seq", "t_ns")
    by_seq: dict[int, list[int]] = {}
    for seq, t_ns in chunks.select("seq", "t_ns").iter_rows():
        by_seq.setdefault(seq, []).append(t_ns)
    for rid, seq in v.seq_of.items():
        assert by_seq.get(seq, []) == [emitted[(rid, i)] for i in range(len(by_seq.get(seq, [])))]
    prefilled: dict[str, int] = {}
    for e in v.trace:
        if e["type"] == "step":
            for rid, tokens, _ in e["prefill"]:
                prefilled[rid] = prefilled.get(rid, 0) + tokens
    long_ids = [e["id"] for e in v.trace if e["type"] == "request" and e["prompt_tokens"] >= 6000]
    assert long_ids and all(prefilled[rid] >= 6000 for rid in long_ids if v.seq_of[rid] in by_seq)
