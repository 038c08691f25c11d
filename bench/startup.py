"""How long ``loadgen`` takes to start: the installed console script run as a user runs it (a fresh process
each time, its output discarded), ``--runs`` times per command; prints each command's median and fastest wall
time, its median CPU time (user + system: what a busy machine's other work inflates least) and whether it meets
its goal (issue 50: ``--version`` and ``--help`` within 0.3 s, ``run --help`` within 0.5 s, median of 5). What a
command imports at start is held by tests/test_cli_startup.py; this measures the time.

    python bench/startup.py                                   # the loadgen beside this Python, else on PATH
    python bench/startup.py --exe "python -m loadgen"         # another build: run from its clone's folder
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

GOALS_S = {"--version": 0.3, "--help": 0.3, "run --help": 0.5}


def default_exe() -> list[str]:
    """The console script installed beside this interpreter (a venv's bin/), else the one on PATH."""
    beside = Path(sys.executable).with_name("loadgen")
    found = str(beside) if beside.exists() else shutil.which("loadgen")
    if found is None:
        raise SystemExit("no loadgen console script beside this Python or on PATH: pip install . first, or --exe")
    return [found]


def start_s(exe: list[str], args: list[str]) -> tuple[float, float]:
    """One start: wall time from spawning the process to its exit, and the CPU time it used (its output
    discarded; a failure stops the bench)."""
    env = {**os.environ, "COLUMNS": "80"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([*exe, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join([*exe, *args])} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return elapsed, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--exe", help="the command that starts loadgen (default: the installed console script)")
    ap.add_argument("--runs", type=int, default=5, help="starts per command (the median is reported)")
    args = ap.parse_args()
    exe = shlex.split(args.exe) if args.exe else default_exe()
    start_s(exe, ["--version"])  # one start unmeasured: the file system's caches, not loadgen, on the first
    print(f"{shlex.join(exe)}: {args.runs} starts per command\n")
    print("| command | median (s) | fastest (s) | median CPU (s) | goal (s) |")
    print("| --- | --- | --- | --- | --- |")
    medians = {}
    for command, goal_s in GOALS_S.items():
        walls, cpus = zip(*(start_s(exe, command.split()) for _ in range(args.runs)))
        medians[command] = statistics.median(walls)
        print(f"| loadgen {command} | {medians[command]:.3f} | {min(walls):.3f} | {statistics.median(cpus):.3f} | "
              f"≤ {goal_s} |")
    print()
    for command, goal_s in GOALS_S.items():
        verdict = "met" if medians[command] <= goal_s else "MISSED"
        print(f"goal: loadgen {command} within {goal_s} s (median of {args.runs}): {medians[command]:.3f} s, {verdict}")


if __name__ == "__main__":
    main()
