"""Records over Locust's messaging (distributed runs): a worker packs its finished records columnar and
msgpack-friendly and sends them in batches (``Outbox``), the master unpacks them; and a record as Locust's
``request`` event. Pure: no locust or gevent here (the caller's runner sends, its greenlet flushes)."""

from __future__ import annotations

import collections
from dataclasses import asdict
from typing import Any, Callable

from loadgen.core.records import ChunkRecord, RequestRecord

RECORDS_MESSAGE, SLICE_MESSAGE, DONE_MESSAGE = "loadgen_records", "loadgen_slice", "loadgen_done"


def pack(records: list[tuple[RequestRecord, list[ChunkRecord]]], worker: int) -> dict[str, Any]:
    """Columnar, msgpack-friendly; ``worker`` is stamped so that seqs from two workers never collide."""
    reqs, chunks = [], []
    for record, cs in records:
        record.worker = worker
        reqs.append(asdict(record))
        for c in cs:
            c.worker = worker
            chunks.append((c.seq, c.t_ns, c.tokens, c.reasoning))
    return {"requests": reqs, "chunks": chunks}


def unpack(data: dict[str, Any]) -> list[tuple[RequestRecord, list[ChunkRecord]]]:
    by_seq: dict[tuple[int, int], list[ChunkRecord]] = collections.defaultdict(list)
    out = []
    for r in data["requests"]:
        record = RequestRecord(**r)
        out.append((record, by_seq[(record.worker, record.seq)]))
    workers = {r["seq"]: r["worker"] for r in data["requests"]}
    for seq, t_ns, tokens, reasoning in data["chunks"]:
        w = workers.get(seq, 0)
        by_seq[(w, seq)].append(ChunkRecord(seq, t_ns, tokens, reasoning, w))
    return out


class Outbox:
    """A worker's finished records, sent to the master in batches (``flush``: every half second, from a greenlet
    the worker runs, and when the worker stops)."""

    def __init__(self, send: Callable[[str, Any], None], worker: int) -> None:
        self.send, self.worker = send, worker
        self.pending: list[tuple[RequestRecord, list[ChunkRecord]]] = []

    def add(self, record: RequestRecord, chunks: list[ChunkRecord]) -> None:
        self.pending.append((record, chunks))

    def flush(self) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            self.send(RECORDS_MESSAGE, pack(batch, self.worker))


def fire_request_event(environment: Any, record: RequestRecord) -> None:
    """Locust's tables, charts and CSV: response time = TTFT (ms; E2E when no token came), length = tokens."""
    end_ns = record.t_first_token_ns or record.t_done_ns
    exception = RuntimeError(f"{record.error_kind}: {record.error_message}") if record.error_kind else None
    environment.events.request.fire(request_type="POST", name=record.class_name,
                                    response_time=(end_ns - record.t_intended_ns) / 1e6,
                                    response_length=record.output_tokens, exception=exception, context={})
