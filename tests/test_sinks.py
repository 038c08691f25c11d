"""The record sink under a failing disk: a flush that cannot write keeps its records; parts are whole or absent;
a damaged part is skipped and named, never fatal."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.records import parts as pt
from loadgen.records.sink import RecordSink
from loadgen.records.scan import load_records


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


def _parts(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.glob("requests.part-*.parquet"))


def test_parts_are_merged_in_tiers_while_the_run_goes(tmp_path, monkeypatch):
    """An hour flushed every second must not leave 3,600 parts: every FANOUT parts of one size become one."""
    monkeypatch.setattr(pt, "MERGE_FANOUT", 4)
    sink = RecordSink(tmp_path)
    for seq in range(22):
        sink.add(*_record(seq))
        sink.flush()
    assert _parts(tmp_path) == ["requests.part-00001-00016.parquet", "requests.part-00017-00020.parquet",
                                "requests.part-00021.parquet", "requests.part-00022.parquet"]
    assert len(list(tmp_path.glob("chunks.part-*.parquet"))) == 4 and not list(tmp_path.glob(".*"))
    requests, chunks = sink.frames()
    assert requests["seq"].to_list() == list(range(22)) and chunks.height == 44
    sink.close()
    requests, chunks = load_records(tmp_path)
    assert requests["seq"].to_list() == list(range(22)) and chunks["seq"].to_list() == sorted(list(range(22)) * 2)
    assert not _parts(tmp_path)


def test_a_merge_cut_short_by_a_crash_reads_each_record_once(tmp_path, monkeypatch):
    """Killed between a merge's rename and the removal of its inputs: both are on disk; readers skip the inputs."""
    monkeypatch.setattr(pt, "MERGE_FANOUT", 100)
    sink = RecordSink(tmp_path)
    for seq in range(5):
        sink.add(*_record(seq))
        sink.flush()
    saved = {p: p.read_bytes() for p in tmp_path.glob("*.part-*.parquet")}
    pt.merge(tmp_path, pt.list_parts(tmp_path)[:4])
    for path, data in saved.items():
        path.write_bytes(data)  # the inputs still there
    assert [p.requests.name for p in pt.list_parts(tmp_path)] == ["requests.part-00001-00004.parquet",
                                                                  "requests.part-00005.parquet"]
    requests, chunks = load_records(tmp_path)
    assert requests["seq"].to_list() == list(range(5)) and chunks.height == 10
    assert not list(tmp_path.glob("*.part-*")), "the merge into requests.parquet removes every part"


def test_a_merge_that_cannot_write_leaves_its_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(pt, "MERGE_FANOUT", 2)

    def full(sources: list[Path], target: Path) -> None:
        target.write_bytes(b"PAR1 half")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(pt, "_concat_files", full)
    sink = RecordSink(tmp_path)
    for seq in range(3):
        sink.add(*_record(seq))
        sink.flush()
    assert _parts(tmp_path) == [f"requests.part-0000{i}.parquet" for i in (1, 2, 3)]
    assert not list(tmp_path.glob(".*"))
    sink.close()
    assert load_records(tmp_path)[0]["seq"].to_list() == [0, 1, 2]
