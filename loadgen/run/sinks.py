"""Raw records to Parquet, incrementally: each flush writes a part file (``requests.part-00001.parquet``), so a
crash or Ctrl-C loses at most the records since the last flush; ``close()`` merges the parts into
``requests.parquet`` / ``chunks.parquet``; while the run goes, parts are merged in tiers (``parts.py``), so an
hour leaves tens of parts, not thousands. ``load_records`` reads either form, skipping (and naming) a damaged
part. Parts are written aside and renamed, so a full disk leaves no half-written part, and a flush that fails,
for any reason, keeps its records in memory (``frames()`` still returns them; the next flush writes them). A
value that does not fit its column (a length past Int64 from a bad dataset) becomes null in that row rather
than failing the flush: every request sent keeps its row.

Records are appended to per-column lists as they come (cheap, spread over the run); a flush hands those lists
to polars. Converting record objects column by column at flush time held the GIL ~16 ms per 32k chunks, a
stall of the driver's loop that showed in its timing.
"""

from __future__ import annotations

import io
import os
import re
import threading
from pathlib import Path

import polars as pl

from loadgen.analysis.frames import CHUNK_SCHEMA, REQUEST_SCHEMA
from loadgen.core.records import CHUNK_COLUMNS, REQUEST_COLUMNS, ChunkRecord, RequestRecord
from loadgen.core.secrets import clip, redact
from loadgen.run import parts as pt

LATER_COLUMNS = ("conversation", "turn", "cached_tokens")  # added after the first release: null when absent
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
        row = [getattr(record, name) for name in REQUEST_COLUMNS]
        chunk_cols = {"seq": [record.seq] * len(chunks), "t_ns": [c.t_ns for c in chunks],
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
            _write_atomic({written.requests: _frame(requests, REQUEST_SCHEMA),
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
        requests, chunks = _read_all(self.run_dir, [], merge=False)
        with self._lock:
            return (pl.concat([requests, _frame(self._requests, REQUEST_SCHEMA)]),
                    pl.concat([chunks, _frame(self._chunks, CHUNK_SCHEMA)]))


def _empty(columns: tuple[str, ...]) -> dict[str, list[object]]:
    return {name: [] for name in columns}


def _frame(columns: dict[str, list[object]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """The buffered columns as a frame; a value that does not fit its type (an integer past Int64) is null in
    its row instead of failing the whole flush."""
    try:
        return pl.DataFrame(columns, schema=schema)
    except Exception:  # noqa: BLE001 - polars raises several kinds (OverflowError, TypeError, its own)
        return pl.DataFrame(columns, schema=schema, strict=False)


def _write_atomic(files: dict[Path, pl.DataFrame]) -> None:
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


def as_os_error(exc: Exception) -> OSError:
    """polars' "... (os error 28)" as the OSError it was (ENOSPC: "No space left on device")."""
    if isinstance(exc, OSError):
        return exc
    found = re.search(r"\(os error (\d+)\)", str(exc))
    if found:
        return OSError(int(found.group(1)), os.strerror(int(found.group(1))))
    return OSError(str(exc))


def _read_pairs(run_dir: Path, broken: list[str],
                eager: bool = True) -> tuple[list[pl.DataFrame], list[pl.DataFrame | Path], list[Path]]:
    """The readable (requests, chunks) pairs: the merged files, then each part; a pair with an unreadable file
    (cut short by a full disk or a kill) is skipped and named in ``broken``. Returns the parts read too. Not
    ``eager``: each chunks file is checked (its footer and columns) but not read, and given as its path."""
    pairs = [(run_dir / "requests.parquet", run_dir / "chunks.parquet")]
    pairs += [(p.requests, p.chunks) for p in pt.list_parts(run_dir)]
    requests: list[pl.DataFrame] = []
    chunks: list[pl.DataFrame | Path] = []
    parts: list[Path] = []
    for req_path, chunk_path in pairs:
        if req_path.name == "requests.parquet" and not req_path.exists():
            continue
        pair, why = _read_pair(req_path, chunk_path, eager)
        if pair is None:
            broken.append(f"{req_path.name} + {chunk_path.name}: unreadable ({why}), skipped")
            continue
        requests.append(_with_new_columns(pair[0], REQUEST_SCHEMA))
        chunks.append(pair[1] if eager else chunk_path)
        if ".part-" in req_path.name:
            parts += [req_path, chunk_path]
    return requests, chunks, parts


MERGED_PAIR = "requests.parquet + chunks.parquet"  # how ``broken`` names the run's merged pair


def merged_pair_damaged(broken: list[str]) -> bool:
    """Does ``broken`` (``load_records``') name the merged requests.parquet/chunks.parquet?"""
    return any(b.startswith(MERGED_PAIR + ":") for b in broken)


def _read_pair(req_path: Path, chunk_path: Path,
               eager: bool = True) -> tuple[tuple[pl.DataFrame, pl.DataFrame] | None, str]:
    """Both files of a pair, or None and which file is damaged and how (one line, e.g. "chunks.parquet: The
    file must end with PAR1 or PARE"). Not ``eager``: the chunks file's schema only (an empty frame of it)."""
    frames = []
    for path in (req_path, chunk_path):
        try:
            frames.append(pl.read_parquet(path) if eager or path is req_path
                          else pl.DataFrame(schema=pl.read_parquet_schema(path)))
        except Exception as exc:  # noqa: BLE001 - polars raises several kinds for a damaged file
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            reason = reason.removeprefix("parquet: ").removeprefix("File out of specification: ")
            return None, f"{path.name}: {clip(reason, 160)}"
    for path, frame, schema in ((req_path, frames[0], REQUEST_SCHEMA), (chunk_path, frames[1], CHUNK_SCHEMA)):
        lacking = [c for c in schema if c not in frame.columns and c not in LATER_COLUMNS]
        if lacking:  # a Parquet file, but not loadgen's records
            return None, f"{path.name}: not loadgen's records, no column {', '.join(lacking[:3])}"
    return (frames[0], frames[1]), ""


def _with_new_columns(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Records written before a column existed (an older loadgen's run) get it as nulls."""
    missing = [pl.lit(None, dtype).alias(name) for name, dtype in schema.items() if name not in frame.columns]
    return frame.with_columns(missing).select(list(schema)) if missing else frame


def merge_parts(run_dir: Path, broken: list[str] | None = None) -> None:
    """Merge the readable parts into requests.parquet / chunks.parquet (streamed) and remove them. Damaged
    parts are left in place and named in ``broken``."""
    scan_records(run_dir, broken if broken is not None else [], merge=True, quiet=False)


def _read_all(run_dir: Path, broken: list[str], merge: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    if merge:
        scan_records(run_dir, broken, merge=True)
        broken_now: list[str] = []
        requests, chunks = _read_all(run_dir, broken_now, merge=False)
        return requests, chunks
    req_frames, chunk_frames, _ = _read_pairs(run_dir, broken)
    requests = pl.concat(req_frames) if req_frames else pl.DataFrame(schema=REQUEST_SCHEMA)
    chunks = pl.concat(chunk_frames) if chunk_frames else pl.DataFrame(schema=CHUNK_SCHEMA)  # type: ignore[type-var]
    return requests, chunks


def scan_records(run_dir: Path, broken: list[str], merge: bool = True,
                 quiet: bool = True) -> tuple[pl.DataFrame, pl.LazyFrame]:
    """The run's requests (read) and a lazy scan of its chunk files (never read whole: an hour is ≈19 M rows).
    ``merge``: the readable parts are merged into requests.parquet / chunks.parquet first, the chunks streamed
    to a file aside and renamed (as ``parts.merge`` does); a merge the disk refuses leaves the parts as they
    are (``quiet``) or raises OSError. Damaged parts are skipped and named in ``broken``."""
    before = len(broken)
    req_frames, chunk_paths, parts = _read_pairs(run_dir, broken, eager=False)
    requests = pl.concat(req_frames) if req_frames else pl.DataFrame(schema=REQUEST_SCHEMA)
    # a damaged requests.parquet / chunks.parquet is never replaced by the parts alone (its records would be lost)
    merged_damaged = merged_pair_damaged(broken[before:])
    if merge and not merged_damaged and (parts or not (run_dir / "requests.parquet").exists()):
        try:
            _merge_streaming(run_dir, requests, [p for p in chunk_paths if isinstance(p, Path)])
        except OSError:
            if not quiet:
                raise
        else:
            chunk_paths = [run_dir / "chunks.parquet"]
            for p in parts + [q for c in pt.covered_parts(run_dir) for q in (c.requests, c.chunks)]:
                p.unlink(missing_ok=True)
    paths = [p for p in chunk_paths if isinstance(p, Path)]
    return requests, (pl.scan_parquet(paths) if paths else pl.DataFrame(schema=CHUNK_SCHEMA).lazy())


def _merge_streaming(run_dir: Path, requests: pl.DataFrame, chunk_paths: list[Path]) -> None:
    """requests.parquet (encoded whole) and chunks.parquet (streamed from ``chunk_paths``: memory is bounded by
    a row group), both written aside, then renamed together; a failure (a full disk) is an OSError and leaves
    nothing behind."""
    targets = [run_dir / "chunks.parquet", run_dir / "requests.parquet"]
    tmps = [t.with_name(f".{t.name}.tmp") for t in targets]
    try:
        if chunk_paths:
            pl.scan_parquet(chunk_paths).sink_parquet(tmps[0])
        else:
            pl.DataFrame(schema=CHUNK_SCHEMA).write_parquet(tmps[0])
        encoded = io.BytesIO()
        requests.write_parquet(encoded)
        tmps[1].write_bytes(encoded.getbuffer())
    except BaseException as exc:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, Exception) and not isinstance(exc, OSError):
            raise as_os_error(exc) from exc
        raise
    for target, tmp in zip(targets, tmps):
        tmp.replace(target)


def load_records(run_dir: Path, broken: list[str] | None = None,
                 merge: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The run's request and chunk records: the merged files and every readable part (merged into them when
    ``merge`` and the disk allows). Damaged parts are skipped and named in ``broken``."""
    if not (run_dir / "requests.parquet").exists() and not any(run_dir.glob("requests.part-*.parquet")):
        raise FileNotFoundError(f"{run_dir}: no requests.parquet (is this a loadgen run directory?)")
    found: list[str] = [] if broken is None else broken
    try:
        return _read_all(run_dir, found, merge)
    except OSError:  # the merge could not be written (a full disk): read them as they are
        return _read_all(run_dir, found, merge=False)


def load_server_metrics(run_dir: Path) -> pl.DataFrame | None:
    """server_metrics.parquet, if the run scraped any."""
    path = run_dir / "server_metrics.parquet"
    return pl.read_parquet(path) if path.exists() else None
