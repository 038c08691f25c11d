"""Records over Locust's messaging (distributed runs): a worker packs its finished records columnar and
msgpack-friendly, the master unpacks them. Pure: no locust or gevent here."""

from __future__ import annotations

import collections
from dataclasses import asdict
from typing import Any

from loadgen.core.records import ChunkRecord, RequestRecord


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
