"""Raw records to Parquet, incrementally: each flush writes a part file (``requests.part-00001.parquet``), so a
crash or Ctrl-C loses at most the records since the last flush; ``close()`` merges the parts into
``requests.parquet`` / ``chunks.parquet``; while the run goes, parts are merged in tiers (``parts.py``), so an
hour leaves tens of parts, not thousands. ``scan.py``'s ``load_records`` and ``scan_records`` read either form,
skipping (and naming) a damaged part. Parts are written aside and renamed, so a full disk leaves no half-written part, and a flush that fails,
for any reason, keeps its records in memory (``frames()`` still returns them; the next flush writes them). A
value that does not fit its column (a length past Int64 from a bad dataset) becomes null in that row rather
than failing the flush: every request sent keeps its row.

Records are appended to per-column lists as they come (cheap, spread over the run); a flush hands those lists
to polars. Converting record objects column by column at flush time held the GIL ~16 ms per 32k chunks, a
stall of the driver's loop that showed in its timing.
"""

from __future__ import annotations

import io
import threading
from pathlib import Path

import polars as pl

from loadgen.records.schema import CHUNK_SCHEMA, REQUEST_SCHEMA
from loadgen.core.records import CHUNK_COLUMNS, REQUEST_COLUMNS, ChunkRecord, RequestRecord
from loadgen.core.secrets import clip, redact
from loadgen.records import parts as pt
from loadgen.records.scan import merge_parts, read_all

MESSAGE_CHARS = 500  # an error message in the records, at most (clipped after redaction)


class RecordSink:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._requests = _empty(REQUEST_COLUMNS)
        self._chunks = _empty(CHUNK_COLUMNS)
        self._parts = 0  # the last part's number
        self._written: list[pt.Part] = []  # the parts on disk, merged as tiers fill
        self._lock = threading.Lock()  # a flush runs in a worker thread while the loop keeps adding

    def add(self, record: RequestRecord, chunks: list[ChunkRecord]) -> None:
        """Buffer one request's records, whole or not at all (whatever raises, raises before the buffer is
        touched: its columns never go out of step)."""
        if record.error_message:  # the records' one way out: the redaction choke point (then clipped)
            record.error_message = clip(redact(record.error_message) or "", MESSAGE_CHARS)
        # every other string too: a server's chunk id and finish_reason are its to choose (one that echoes the
        # key there must not leave it in requests.parquet)
        row = [redact(value) if isinstance(value, str) else value
               for value in (getattr(record, name) for name in REQUEST_COLUMNS)]
        chunk_cols: dict[str, list[object]] = {"seq": [record.seq] * len(chunks), "t_ns": [c.t_ns for c in chunks],
                      "tokens": [c.tokens for c in chunks], "reasoning": [c.reasoning for c in chunks],
                      "worker": [record.worker] * len(chunks)}
        with self._lock:
            for name, value in zip(REQUEST_COLUMNS, row):
                self._requests[name].append(value)
            for name, values in chunk_cols.items():
                self._chunks[name].extend(values)

    def pending(self) -> int:
        return len(self._requests["seq"])

    def flush(self) -> None:
        """Write what is buffered as one more part (safe to call from a worker thread). The part appears whole
        or not at all (written aside, then renamed); if the write fails (OSError: the disk is full; anything
        else: a bug) nothing is lost: the records go back into the buffer, and the error is raised."""
        with self._lock:
            requests, chunks = self._requests, self._chunks
            if not requests["seq"]:
                return
            self._requests, self._chunks = _empty(REQUEST_COLUMNS), _empty(CHUNK_COLUMNS)
            part = self._parts + 1
        written = pt.Part(part, part, pt.part_path(self.run_dir, "requests", part, part))
        try:
            write_atomic({written.requests: _frame(requests, REQUEST_SCHEMA),
                           written.chunks: _frame(chunks, CHUNK_SCHEMA)})
        except BaseException:
            with self._lock:  # put them back in front of what came meanwhile
                for name in REQUEST_COLUMNS:
                    self._requests[name][:0] = requests[name]
                for name in CHUNK_COLUMNS:
                    self._chunks[name][:0] = chunks[name]
            raise
        self._parts = part
        self._merge(written)

    def _merge(self, written: pt.Part) -> None:
        """Merge the tiers the new part fills; a merge that fails (a full disk) leaves its parts as they were."""
        self._written.append(written)
        try:
            self._written = pt.merge_due(self.run_dir, self._written, pt.MERGE_FANOUT)
        except Exception:  # noqa: BLE001 - polars raises several kinds for a failed write; the parts stand
            self._written = pt.list_parts(self.run_dir)

    def close(self) -> None:
        self.flush()
        merge_parts(self.run_dir)

    def frames(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """Every record of the run: the parts on disk and what is still buffered (when it could not be written)."""
        requests, chunks = read_all(self.run_dir, [], merge=False)
        with self._lock:
            return (pl.concat([requests, _frame(self._requests, REQUEST_SCHEMA)]),
                    pl.concat([chunks, _frame(self._chunks, CHUNK_SCHEMA)]))


def _empty(columns: tuple[str, ...]) -> dict[str, list[object]]:
    return {name: [] for name in columns}


def _frame(columns: dict[str, list[object]], schema: pl.Schema) -> pl.DataFrame:
    """The buffered columns as a frame; a value that does not fit its type (an integer past Int64) is null in
    its row instead of failing the whole flush."""
    try:
        return pl.DataFrame(columns, schema=schema)
    except Exception:  # noqa: BLE001 - polars raises several kinds (OverflowError, TypeError, its own)
        return pl.DataFrame(columns, schema=schema, strict=False)


def write_atomic(files: dict[Path, pl.DataFrame]) -> None:
    """Write each frame beside its path, then rename them all into place; on failure remove what was written.
    Each file is encoded in memory and written by Python, so a full disk is the OSError it is (ENOSPC; polars
    writing itself reports it as "Invalid thrift: transport error")."""
    tmps = {path: path.with_name(f".{path.name}.tmp") for path in files}
    try:
        for path, frame in files.items():
            encoded = io.BytesIO()
            frame.write_parquet(encoded)
            tmps[path].write_bytes(encoded.getbuffer())
    except BaseException:
        for tmp in tmps.values():
            tmp.unlink(missing_ok=True)
        raise
    for path, tmp in tmps.items():
        tmp.replace(path)
