"""Raw records to Parquet, incrementally: each flush writes a part file (``requests.part-00001.parquet``), so a
crash or Ctrl-C loses at most the records since the last flush; ``close()`` merges the parts into
``requests.parquet`` / ``chunks.parquet``. ``load_records`` reads either form.

Records are appended to per-column lists as they come (cheap, spread over the run); a flush hands those lists
to polars. Converting record objects column by column at flush time held the GIL ~16 ms per 32k chunks, a
stall of the driver's loop that showed in its timing.
"""

from __future__ import annotations

import threading
from pathlib import Path

import polars as pl

from .core.records import CHUNK_COLUMNS, REQUEST_COLUMNS, ChunkRecord, RequestRecord

REQUEST_SCHEMA = {
    "seq": pl.Int64, "class_name": pl.String, "warmup": pl.Boolean, "t_intended_ns": pl.Int64,
    "t_sent_ns": pl.Int64, "t_first_token_ns": pl.Int64, "t_last_token_ns": pl.Int64, "t_done_ns": pl.Int64,
    "prompt_tokens_asked": pl.Int64, "prompt_tokens": pl.Int64, "prompt_tokens_source": pl.String,
    "output_tokens_asked": pl.Int64, "output_tokens": pl.Int64, "output_tokens_source": pl.String,
    "chunks": pl.Int64, "request_id": pl.String, "finish_reason": pl.String, "http_status": pl.Int64,
    "error_kind": pl.String, "error_message": pl.String, "reasoning": pl.Boolean, "worker": pl.Int64,
}
CHUNK_SCHEMA = {"seq": pl.Int64, "t_ns": pl.Int64, "tokens": pl.Int64, "reasoning": pl.Boolean,
                "worker": pl.Int64}
assert tuple(REQUEST_SCHEMA) == REQUEST_COLUMNS and tuple(CHUNK_SCHEMA) == CHUNK_COLUMNS


def requests_frame(records: list[RequestRecord]) -> pl.DataFrame:
    return pl.DataFrame({c: [getattr(r, c) for r in records] for c in REQUEST_COLUMNS}, schema=REQUEST_SCHEMA)


def chunks_frame(chunks: list[ChunkRecord]) -> pl.DataFrame:
    return pl.DataFrame({c: [getattr(r, c) for r in chunks] for c in CHUNK_COLUMNS}, schema=CHUNK_SCHEMA)


class RecordSink:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._requests = _empty(REQUEST_COLUMNS)
        self._chunks = _empty(CHUNK_COLUMNS)
        self._parts = 0
        self._lock = threading.Lock()  # a flush runs in a worker thread while the loop keeps adding

    def add(self, record: RequestRecord, chunks: list[ChunkRecord]) -> None:
        with self._lock:
            for name in REQUEST_COLUMNS:
                self._requests[name].append(getattr(record, name))
            cols = self._chunks
            cols["seq"].extend([record.seq] * len(chunks))
            cols["t_ns"].extend([c.t_ns for c in chunks])
            cols["tokens"].extend([c.tokens for c in chunks])
            cols["reasoning"].extend([c.reasoning for c in chunks])
            cols["worker"].extend([record.worker] * len(chunks))

    def pending(self) -> int:
        return len(self._requests["seq"])

    def flush(self) -> None:
        """Write what is buffered as one more part (safe to call from a worker thread)."""
        with self._lock:
            requests, chunks = self._requests, self._chunks
            if not requests["seq"]:
                return
            self._requests, self._chunks = _empty(REQUEST_COLUMNS), _empty(CHUNK_COLUMNS)
            self._parts += 1
            part = self._parts
        pl.DataFrame(requests, schema=REQUEST_SCHEMA).write_parquet(
            self.run_dir / f"requests.part-{part:05d}.parquet")
        pl.DataFrame(chunks, schema=CHUNK_SCHEMA).write_parquet(self.run_dir / f"chunks.part-{part:05d}.parquet")

    def close(self) -> None:
        self.flush()
        merge_parts(self.run_dir)


def _empty(columns: tuple[str, ...]) -> dict[str, list[object]]:
    return {name: [] for name in columns}


def merge_parts(run_dir: Path) -> None:
    """Merge part files into requests.parquet / chunks.parquet and remove the parts."""
    for name, schema in (("requests", REQUEST_SCHEMA), ("chunks", CHUNK_SCHEMA)):
        parts = sorted(run_dir.glob(f"{name}.part-*.parquet"))
        final = run_dir / f"{name}.parquet"
        frames = ([pl.read_parquet(final)] if final.exists() else []) + [pl.read_parquet(p) for p in parts]
        frame = pl.concat(frames) if frames else pl.DataFrame(schema=schema)
        tmp = run_dir / f".{name}.parquet.tmp"
        frame.write_parquet(tmp)
        tmp.replace(final)
        for p in parts:
            p.unlink()


def load_records(run_dir: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The run's request and chunk records (merging parts left by an interrupted run)."""
    if any(run_dir.glob("requests.part-*.parquet")):
        merge_parts(run_dir)
    if not (run_dir / "requests.parquet").exists():
        raise FileNotFoundError(f"{run_dir}: no requests.parquet (is this a loadgen run directory?)")
    return pl.read_parquet(run_dir / "requests.parquet"), pl.read_parquet(run_dir / "chunks.parquet")
