"""The record sink under a failing disk: a flush that cannot write keeps its records; parts are whole or absent;
a damaged part is skipped and named, never fatal."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.run.sinks import RecordSink, load_records


def _record(seq: int) -> tuple[RequestRecord, list[ChunkRecord]]:
    rec = RequestRecord(seq=seq, class_name="c", warmup=False, t_intended_ns=1, t_sent_ns=2, t_first_token_ns=3,
                        t_last_token_ns=4, t_done_ns=5, prompt_tokens_asked=8, prompt_tokens=8,
                        prompt_tokens_source="server", output_tokens_asked=2, output_tokens=2,
                        output_tokens_source="server", chunks=2, error_message="bad http://u:pw-123456@h/v1")
    return rec, [ChunkRecord(seq, 3, 1), ChunkRecord(seq, 4, 1)]


def test_a_flush_that_cannot_write_keeps_every_record(tmp_path, monkeypatch):
    sink = RecordSink(tmp_path)
    sink.add(*_record(1))
    real = Path.write_bytes

    def full(self: Path, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(OSError):
        sink.flush()
    sink.add(*_record(2))
    assert sink.pending() == 2 and not list(tmp_path.iterdir())  # no half-written part, no temp file left
    requests, chunks = sink.frames()
    assert requests["seq"].to_list() == [1, 2] and chunks.height == 4
    monkeypatch.setattr(Path, "write_bytes", real)
    sink.close()
    requests, _ = load_records(tmp_path)
    assert requests["seq"].to_list() == [1, 2]
    assert requests["error_message"].to_list() == ["bad http://u:***@h/v1"] * 2  # redacted on the way in


def test_a_damaged_part_is_skipped_and_named(tmp_path):
    sink = RecordSink(tmp_path)
    sink.add(*_record(1))
    sink.flush()
    (tmp_path / "requests.part-00007.parquet").write_bytes(b"PAR1 cut short")
    (tmp_path / "chunks.part-00007.parquet").write_bytes(b"")
    broken: list[str] = []
    requests, chunks = load_records(tmp_path, broken)
    assert requests["seq"].to_list() == [1] and chunks.height == 2
    assert len(broken) == 1 and broken[0].startswith("requests.part-00007.parquet + chunks.part-00007.parquet: "
                                                     "unreadable (") and broken[0].endswith("), skipped")
