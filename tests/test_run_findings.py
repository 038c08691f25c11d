"""The usage finding read from a run's own records: completion_tokens against max_tokens where an answer stopped
at it — but not for a request that reasoned, whose cap held a thinking budget the records do not carry."""

from __future__ import annotations


from loadgen.analysis.run_findings import run_findings
from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.records.schema import chunks_frame, requests_frame

MS = 1_000_000


def answered(seq: int, asked: int, reported: int, reasoning_tokens: int) -> tuple[RequestRecord, list[ChunkRecord]]:
    """A request that stopped at its cap (finish_reason length) after ``reported`` tokens, one a chunk 10 ms
    apart, the first ``reasoning_tokens`` of them reasoning."""
    t0 = seq * 100_000
    times = [t0 + 10 * (i + 1) for i in range(reported)]
    record = RequestRecord(
        seq=seq, class_name="think", warmup=False, t_intended_ns=t0 * MS, t_sent_ns=t0 * MS,
        t_first_token_ns=times[0] * MS, t_last_token_ns=times[-1] * MS, t_done_ns=(times[-1] + 1) * MS,
        prompt_tokens_asked=10, prompt_tokens=10, prompt_tokens_source="server", output_tokens_asked=asked,
        output_tokens=reported, output_tokens_source="server", chunks=reported, finish_reason="length",
        reasoning=reasoning_tokens > 0, reasoning_tokens=reasoning_tokens,
        t_first_answer_ns=times[reasoning_tokens] * MS if reasoning_tokens < reported else None)
    return record, [ChunkRecord(seq, t * MS, 1, i < reasoning_tokens) for i, t in enumerate(times)]


def findings(*items: tuple[RequestRecord, list[ChunkRecord]]) -> list[str]:
    req = requests_frame([r for r, _ in items])
    chunks = chunks_frame([c for _, cs in items for c in cs])
    return [f["summary"] for f in run_findings(req, chunks)]


def test_an_answer_that_stopped_at_max_tokens_with_more_tokens_reported_is_a_finding() -> None:
    said = findings(*(answered(seq, asked=40, reported=60, reasoning_tokens=0) for seq in range(3)))
    assert any("usage misreports completion_tokens: 60 reported, 40 generated" in s for s in said), said


def test_a_reasoning_request_at_its_cap_of_answer_plus_budget_is_not_a_finding() -> None:
    # max_tokens was 40 asked + a 20-token budget: 60 reported (20 reasoning) is the truth, not a misreport
    said = findings(*(answered(seq, asked=40, reported=60, reasoning_tokens=20) for seq in range(3)))
    assert not any("usage" in s for s in said), said
