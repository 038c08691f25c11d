"""The part files a run's records are written in, and their merging while the run goes.

Each flush of the sink writes one pair, ``requests.part-00042.parquet`` and ``chunks.part-00042.parquet``. An
hour flushed every second would leave 3,600 pairs for the end, so parts are merged as they come, in tiers:
every ``MERGE_FANOUT`` consecutive parts of one size become one part named by the range it holds
(``requests.part-00001-00016.parquet``), every ``MERGE_FANOUT`` of those one more (``part-00001-00256``), and so
on; an hour leaves at most ``3 × (MERGE_FANOUT − 1)`` pairs. A merge streams its inputs (polars' streaming
engine: memory is bounded by a row group, not by the part's size), writes aside, renames, then removes its
inputs; a crash between the rename and the removal leaves parts that a merged part covers, and readers skip
them (``list_parts``), so no record is ever read twice or lost.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

MERGE_FANOUT = 16
_PART = re.compile(r"^requests\.part-(\d+)(?:-(\d+))?\.parquet$")


@dataclass(frozen=True, order=True)
class Part:
    first: int
    last: int
    requests: Path

    @property
    def chunks(self) -> Path:
        return self.requests.with_name(self.requests.name.replace("requests.", "chunks.", 1))

    @property
    def size(self) -> int:
        return self.last - self.first + 1


def part_path(run_dir: Path, kind: str, first: int, last: int) -> Path:
    span = f"{first:05d}" if first == last else f"{first:05d}-{last:05d}"
    return run_dir / f"{kind}.part-{span}.parquet"


def list_parts(run_dir: Path) -> list[Part]:
    """The run's parts in order, leaving out any that a merged part covers (left by an interrupted merge)."""
    kept: list[Part] = []
    for part in sorted(_all_parts(run_dir), key=lambda p: (p.first, -p.last)):
        if kept and part.last <= kept[-1].last:
            continue  # inside the range of a merged part already kept
        kept.append(part)
    return kept


def covered_parts(run_dir: Path) -> list[Part]:
    """Parts that a merged part covers (an interrupted merge's inputs): safe to remove."""
    kept = set(list_parts(run_dir))
    return [p for p in _all_parts(run_dir) if p not in kept]


def _all_parts(run_dir: Path) -> list[Part]:
    out = []
    for path in run_dir.glob("requests.part-*.parquet"):
        m = _PART.match(path.name)
        if m:
            out.append(Part(int(m.group(1)), int(m.group(2) or m.group(1)), path))
    return out


def due_merge(parts: list[Part], fanout: int = MERGE_FANOUT) -> list[Part] | None:
    """The last ``fanout`` parts when they have one size (the next tier is due), else None."""
    tail = parts[-fanout:]
    if len(tail) == fanout and len({p.size for p in tail}) == 1:
        return tail
    return None


def merge(run_dir: Path, parts: list[Part]) -> Part:
    """Merge consecutive parts into one named by their range; remove them once it is in place. On an error
    (a full disk) nothing is removed and whatever was half-written aside is deleted; the parts stay readable."""
    first, last = parts[0].first, parts[-1].last
    merged = Part(first, last, part_path(run_dir, "requests", first, last))
    pairs = ((merged.requests, [p.requests for p in parts]), (merged.chunks, [p.chunks for p in parts]))
    tmps = [target.with_name(f".{target.name}.tmp") for target, _ in pairs]
    try:
        for (target, sources), tmp in zip(pairs, tmps):
            _concat_files(sources, tmp)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    for (target, _), tmp in zip(pairs, tmps):
        tmp.replace(target)
    for p in parts:
        p.requests.unlink(missing_ok=True)
        p.chunks.unlink(missing_ok=True)
    return merged


def _concat_files(sources: list[Path], target: Path) -> None:
    pl.scan_parquet(sources).sink_parquet(target)


def merge_due(run_dir: Path, parts: list[Part], fanout: int = MERGE_FANOUT) -> list[Part]:
    """After a new part: merge tiers while one is due; returns the parts as they now are."""
    while (tail := due_merge(parts, fanout)) is not None:
        parts = parts[:-fanout] + [merge(run_dir, tail)]
    return parts
