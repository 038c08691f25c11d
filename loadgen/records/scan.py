"""Reading a run directory's records back, in whichever form they are: the merged ``requests.parquet`` /
``chunks.parquet`` pair, the part files a run left (merged in tiers while it went, ``parts.py``), or both (a crash
between a merge's rename and its removal: readers skip the parts a merged part covers). A damaged file (cut
short by a full disk or a kill) is skipped and named in ``broken``; the chunks can be scanned lazily
(``scan_records``) so a long run's are never read whole; the final merge of the parts streams."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import polars as pl

from loadgen.records import parts as pt
from loadgen.records.schema import CHUNK_SCHEMA, LATER_COLUMNS, REQUEST_SCHEMA
from loadgen.core.secrets import clip


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


def _with_new_columns(frame: pl.DataFrame, schema: pl.Schema) -> pl.DataFrame:
    """Records written before a column existed (an older loadgen's run) get it as nulls."""
    missing = [pl.lit(None, dtype).alias(name) for name, dtype in schema.items() if name not in frame.columns]
    return frame.with_columns(missing).select(list(schema)) if missing else frame


def merge_parts(run_dir: Path, broken: list[str] | None = None) -> None:
    """Merge the readable parts into requests.parquet / chunks.parquet (streamed) and remove them. Damaged
    parts are left in place and named in ``broken``."""
    scan_records(run_dir, broken if broken is not None else [], merge=True, quiet=False)


def read_all(run_dir: Path, broken: list[str], merge: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    if merge:
        scan_records(run_dir, broken, merge=True)
        broken_now: list[str] = []
        requests, chunks = read_all(run_dir, broken_now, merge=False)
        return requests, chunks
    req_frames, read, _ = _read_pairs(run_dir, broken)
    chunk_frames = [frame for frame in read if isinstance(frame, pl.DataFrame)]  # all of them: read eagerly
    requests = pl.concat(req_frames) if req_frames else pl.DataFrame(schema=REQUEST_SCHEMA)
    chunks = pl.concat(chunk_frames) if chunk_frames else pl.DataFrame(schema=CHUNK_SCHEMA)
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
        return read_all(run_dir, found, merge)
    except OSError:  # the merge could not be written (a full disk): read them as they are
        return read_all(run_dir, found, merge=False)


def load_server_metrics(run_dir: Path) -> pl.DataFrame | None:
    """server_metrics.parquet, if the run scraped any."""
    path = run_dir / "server_metrics.parquet"
    return pl.read_parquet(path) if path.exists() else None
