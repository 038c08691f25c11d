"""`loadgen report RUN` twice gives the same summary.json, summary.md and junit.xml, byte for byte, whatever
polars' thread pool and hash seeds did: group_by's output order varies with both (and with the thread count),
so every float summed over groups is summed in a fixed order and every tie is broken by a key, not by the
order rows came out of a group_by, a join or ``mode``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl

from loadgen.analysis.spikes import SpikeConfig, attribute, group_events

GOLDEN = Path(__file__).parent / "data" / "golden_run"
VIEWS = ("summary.json", "summary.md", "junit.xml")

# The rebuild of `loadgen report` (run/reporting.py) with the summary's files written and report.html skipped
# (its charts are not what is compared, and they cost most of a rebuild's time).
REBUILD = """
import sys
from pathlib import Path
from loadgen.run import reporting
from loadgen.report.writers import write_all
reporting.write_reports = lambda run_dir, result, name, tables, *a, **k: write_all(run_dir, result, name, tables)
reporting.write_benchmark_report = lambda *a: None
reporting.rebuild_reports(Path(sys.argv[1]), png=False, again=True)
"""


def rebuilds(tmp_path: Path, threads: tuple[int, ...]) -> list[list[bytes]]:
    """The golden run rebuilt once per thread count, the rebuilds side by side (one process each)."""
    procs = []
    for n in threads:
        run_dir = tmp_path / f"threads-{n}"
        shutil.copytree(GOLDEN, run_dir)
        env = {**os.environ, "POLARS_MAX_THREADS": str(n), "PYTHONHASHSEED": str(n)}
        procs.append((run_dir, subprocess.Popen([sys.executable, "-c", REBUILD, str(run_dir)], env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    out = []
    for run_dir, proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        out.append([(run_dir / n).read_bytes() for n in VIEWS])
    return out


def test_rebuilds_on_different_thread_pools_write_identical_views(tmp_path: Path) -> None:
    """The records of a seeded aggressor/victim run (27 stalls in 3 events) rebuilt with 1 and 4 polars threads:
    the stall objective's interval and dispersion were summed over time batches in group_by's order and moved
    in their last digits (the CI failure of test_report.py::test_rebuilding_twice_gives_identical_views)."""
    one, four = rebuilds(tmp_path, (1, 4))
    for name, a, b in zip(VIEWS, one, four):
        assert a == b, f"{name} differs between rebuilds"


def _stalls(causes: list[str]) -> pl.DataFrame:
    n = len(causes)
    return pl.DataFrame({"worker": [0] * n, "seq": list(range(n)), "t_start_ns": [1_000 + i for i in range(n)],
                         "t_end_ns": [2_000_000 + i for i in range(n)], "chunk_gap_ms": [50.0] * n,
                         "prefill_induced": [False] * n, "culprits": [[] for _ in range(n)], "cause": causes},
                        schema_overrides={"culprits": pl.List(pl.Int64)})


def test_an_event_of_tied_causes_is_named_the_same_every_time() -> None:
    """One event, one stall of each cause: its cause (summary.json's worst_events, summary.md's stall table)
    is one of them, the same on every rebuild (polars' ``mode`` lists tied values in a varying order)."""
    stalls = _stalls(["unknown", "prefill_burst", "burst", "client_lag"])
    named = {group_events(stalls.sample(fraction=1.0, shuffle=True, seed=s), 10.0)["cause"].item()
             for s in range(30)}
    assert len(named) == 1 and named <= {"unknown", "prefill_burst", "burst", "client_lag"}


def test_culprits_covering_a_gap_equally_are_listed_in_one_order() -> None:
    """Two long prefills whose windows each cover the whole gap (equal overlaps): the stall names the same first
    culprit (summary.json's worst.culprit, the headline's "caused by request R") whatever order the windows
    come in."""
    stall = pl.DataFrame({"worker": [0], "seq": [1], "class_name": ["victim"], "t_start_ns": [1_000_000_000],
                          "t_end_ns": [1_500_000_000], "tokens": [1], "chunk_gap_ms": [500.0]})
    windows = pl.DataFrame({"worker": [0, 0], "seq": [7, 3], "prompt_tokens": [9000, 9000],
                            "w_start_ns": [900_000_000, 900_000_000], "w_end_ns": [1_500_000_000, 1_500_000_000]})
    requests = pl.DataFrame({"t_sent_ns": [0, 1], "t_done_ns": [2_000_000_000] * 2,
                             "t_first_token_ns": [1_500_000_000] * 2, "t_intended_ns": [0, 1]})
    cfg = SpikeConfig(step_tol_ms=10.0)
    lists = {tuple(attribute(stall, w, requests, cfg)["culprits"].item().to_list())
             for w in (windows, windows.reverse())}
    assert len(lists) == 1 and sorted(next(iter(lists))) == [3, 7]
