"""Timing against the model and the trace, over real loopback sockets with the simulator in a child process.

Every bound here compares a client measurement with the configured model or the simulator's own trace.
"""

from __future__ import annotations

import asyncio
import statistics

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from local_target.sim import PrefillChunk, build_config, prefill_alone_ms, read_trace, step_ms
from local_target.sim import tokenizer
from tests.sim_client import chat_body, run_timed, stream

pytestmark = pytest.mark.timing  # the simulator's real-time pacing against its configuration
MODEL = "llama-2-7b"
TOL_MS = 2.0


def _prompt_tokens(words: int) -> int:
    return words + tokenizer.MESSAGE_OVERHEAD_TOKENS + tokenizer.GENERATION_PROMPT_TOKENS


@pytest.mark.parametrize("words", [10, 500, 2000])
def test_ttft_at_low_load_matches_the_model(start_sim, words):
    sim = start_sim()
    cfg = build_config("a100-llama-7b")

    async def go():
        async with httpx.AsyncClient(timeout=30) as client:
            await stream(client, sim.base_url + "/chat/completions", chat_body(MODEL, 5, 1))  # warm connection
            return [await stream(client, sim.base_url + "/chat/completions", chat_body(MODEL, words, 2))
                    for _ in range(5)]
    streams = run_timed(go())
    sim.stop()
    arrivals = {e["id"]: e["t_arrival_ns"] for e in read_trace(sim.trace_path) if e["type"] == "request"}
    # TTFT from the request's arrival at the server (parsing and tokenizing included) to the client's receipt
    # of the first token; the client's own send overhead (httpx) is not the simulator's to model.
    ttfts_ms = [(s.content_times[0] - arrivals[s.request_id]) / 1e6 for s in streams]
    expected_ms = prefill_alone_ms(cfg, _prompt_tokens(words))
    assert statistics.median(ttfts_ms) == pytest.approx(expected_ms, abs=TOL_MS)


def _victims_and_aggressor(sim, aggressor_words: int, victims: int = 4, victim_tokens: int = 60):
    """Start ``victims`` decoding streams; once all emit tokens, send one long prompt; return all streams."""
    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            ready = [asyncio.Event() for _ in range(victims)]
            tasks = [asyncio.create_task(stream(client, sim.base_url + "/chat/completions",
                                                chat_body(MODEL, 20, victim_tokens), ev, after_tokens=5))
                     for ev in ready]
            await asyncio.gather(*(ev.wait() for ev in ready))
            long = await stream(client, sim.base_url + "/chat/completions", chat_body(MODEL, aggressor_words, 2))
            return long, await asyncio.gather(*tasks)
    return run_timed(go())


def _gap_ms_ending_at(stream_times_ns: list[int], index: int) -> float:
    return (stream_times_ns[index] - stream_times_ns[index - 1]) / 1e6


def test_long_prefill_stalls_every_running_stream_by_that_step(start_sim):
    sim = start_sim(chunked_prefill=False)
    long, victims = _victims_and_aggressor(sim, 8000)
    sim.stop()
    trace = read_trace(sim.trace_path)
    steps = [e for e in trace if e["type"] == "step"]
    (stall_step,) = [s for s in steps if any(p[0] == long.request_id for p in s["prefill"])]
    step_dur_ms = (stall_step["t_end_ns"] - stall_step["t_start_ns"]) / 1e6
    cfg = build_config("a100-llama-7b")
    assert step_dur_ms > 10 * step_ms(cfg, [], [100] * 4)  # the long step dwarfs a decode step
    for victim in victims:
        assert victim.request_id in stall_step["decode"]
        emitted = [t for rid, idx, t in stall_step["tokens"] if rid == victim.request_id]
        index = next(idx for rid, idx, t in stall_step["tokens"] if rid == victim.request_id)
        assert emitted, "the stalled step emitted the victim's token"
        assert _gap_ms_ending_at(victim.content_times, index) == pytest.approx(step_dur_ms, abs=TOL_MS)
        others = [_gap_ms_ending_at(victim.content_times, i) for i in range(2, len(victim.content_times))
                  if i != index]
        assert max(others) < step_dur_ms / 5  # only that one gap is a stall


def test_chunked_prefill_bounds_the_worst_gap_by_the_budget(start_sim):
    budget = 512
    sim = start_sim(chunked_prefill=True, max_num_batched_tokens=budget)
    long, victims = _victims_and_aggressor(sim, 8000)
    sim.stop()
    cfg = build_config("a100-llama-7b", overrides={"chunked_prefill": True, "max_num_batched_tokens": budget})
    prompt = _prompt_tokens(8000)
    contexts = [_prompt_tokens(20) + 60] * len(victims)
    bound_ms = step_ms(cfg, [PrefillChunk(budget, prompt - budget)], contexts)  # the costliest chunk possible
    worst_ms = max(_gap_ms_ending_at(v.content_times, i) for v in victims for i in range(2, len(v.content_times)))
    assert worst_ms <= bound_ms + TOL_MS
    chunk_steps = [e for e in read_trace(sim.trace_path) if e["type"] == "step"
                   and any(p[0] == long.request_id for p in e["prefill"])]
    assert len(chunk_steps) == -(-prompt // (budget - len(victims)))  # split across ceil(prompt/room) steps
    # unchunked, the same prompt would have stalled them far longer than the bound
    assert step_ms(cfg, [PrefillChunk(prompt)], contexts) > 5 * bound_ms


def test_preemption_when_kv_is_short_shows_in_metrics_and_trace(start_sim):
    sim = start_sim(kv_cache_tokens=3000, time_scale=0.1)

    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*[stream(client, sim.base_url + "/chat/completions",
                                                 chat_body(MODEL, 500, 400)) for _ in range(4)])
    streams = run_timed(go())
    assert all(s.done and len(s.content_times) == 400 for s in streams)  # preempted requests still complete
    text = httpx.get(sim.base_url.removesuffix("/v1") + "/metrics").text
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["vllm:num_preemptions_total"] > 0
    sim.stop()
    preempted = [rid for e in read_trace(sim.trace_path) if e["type"] == "step" for rid in e["preempted"]]
    assert len(preempted) == samples["vllm:num_preemptions_total"]
