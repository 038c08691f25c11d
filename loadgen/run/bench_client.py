"""``loadgen bench-client``: how many tokens per second loadgen measures within a tolerance on this machine.

Each step starts the precise SSE emitter (``local_target/precise_emitter.py``, a child process: one stream's
first token 20 ms plus a seeded 0–5 ms spread after its request, then one every 5 ms, 128 tokens, each write's
true CLOCK_MONOTONIC time logged) and ``loadgen run`` against it (another child: loadgen's own engine, as a user
runs it), a closed loop of N streams for a 2 s warm-up (left out) and the step's duration. Then every measured
chunk's stamp is scored against the emitter's write of it: the chunk-gap error (|loadgen's gap between two
chunks − the emitter's gap between writing them|) and the TTFT error (loadgen's first-token stamp − the
emitter's write of that token), each as a p99. With two or more CPUs the emitter is pinned to the first and
loadgen to the second (the rest too, for worker processes), so they do not share a core.

bench/capacity.py uses the same step (``run_step``) and scoring (``measure``).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

TTFT_MS, ITL_MS, OUTPUT_TOKENS, PROMPT_TOKENS = 20.0, 5.0, 128, 16
WARMUP_S = 2.0
STARTUP_S = 60.0  # a step's allowance beyond its load: both children's start, the drain, the report, the scoring
MAX_STREAMS = 4096  # each stream holds one connection (and one file descriptor on either side)
READY_TIMEOUT_S = 15.0
INTERRUPTS = {signal.SIGINT, signal.SIGTERM}  # what loadgen's CLI turns into KeyboardInterrupt
STOP_GRACE_S = 5.0  # a step's ``loadgen run``, SIGTERMed, ends its --workers processes within this, then SIGKILL
_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds loadgen/ and local_target/


class StepError(RuntimeError):
    """A step could not be measured (a child did not start, failed or overran its time): one line. ``bug``: the
    step's ``loadgen run`` exited 4 (a bug in loadgen; docs/exit-codes.md), else the step is inconclusive."""

    def __init__(self, message: str, bug: bool = False) -> None:
        super().__init__(message)
        self.bug = bug


@dataclass(frozen=True)
class Pinning:
    emitter_cpu: int | None
    loadgen_cpus: tuple[int, ...] | None
    processes: int = 1  # loadgen's

    def describe(self) -> str:
        if self.emitter_cpu is None or not self.loadgen_cpus:
            return ("not pinned: one CPU, so the emitter and loadgen share it (their contention is in the errors "
                    "measured)")
        cpus = ",".join(map(str, self.loadgen_cpus))
        shared = (f"; its {self.processes} processes share {len(self.loadgen_cpus)} CPU"
                  f"{'s' if len(self.loadgen_cpus) > 1 else ''}" if self.processes > len(self.loadgen_cpus) else "")
        return f"emitter on CPU {self.emitter_cpu}, loadgen on CPU {cpus} (sched_setaffinity, as taskset -c){shared}"


def plan_pinning(available: Sequence[int], processes: int = 1) -> Pinning:
    """The emitter on the first CPU, loadgen on the next (``processes`` > 1: up to that many of the rest)."""
    cpus = sorted(available)
    if len(cpus) < 2:
        return Pinning(None, None, processes)
    return Pinning(cpus[0], tuple(cpus[1:1 + max(1, processes)]), processes)


def ladder(start: int, max_streams: int) -> list[int]:
    """The steps: ``start``, doubling up to 128, then 64 more each step, and ``max_streams`` last."""
    steps, n = [], start
    while n < max_streams:
        steps.append(n)
        n = n * 2 if n < 128 else n + 64
    return steps + [max_streams]


def bound_s(steps: int, duration_s: float) -> float:
    """The most the whole command takes: every step its warm-up, its duration and ``STARTUP_S``."""
    return steps * (duration_s + WARMUP_S + STARTUP_S)


def scenario_yaml(port: int, streams: int, duration_s: float) -> str:
    return f"""
name: bench-client
target: {{base_url: "http://127.0.0.1:{port}/v1", model: auto, ttft_timeout_s: 30, idle_timeout_s: 30}}
load: {{arrival: concurrency, concurrency: {streams}, duration_s: {duration_s}, warmup_s: {WARMUP_S},
        max_in_flight: {streams}, drain_timeout_s: 10}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: {PROMPT_TOKENS}}},
              output_tokens: {{dist: fixed, value: {OUTPUT_TOKENS}}}}}]
slo: {{max_generator_lag_ms: 1000}}
"""


def _env() -> dict[str, str]:
    """The children import this loadgen and this local_target (a clone or a worktree as well as a wheel)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])))


def _child_setup(cpus: tuple[int, ...] | None) -> Callable[[], None]:
    # imported here, in the parent: between fork and exec the child only calls it (an import there, since the CLI
    # imports lazily, held the child unexec'd long enough for an interrupt to leave it behind)
    from local_target.sim.launcher import die_with_parent

    parent = os.getpid()

    def setup() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)  # held by run_child in the parent only
        die_with_parent(parent)
        if cpus:
            os.sched_setaffinity(0, set(cpus))
    return setup


def start_emitter(log: Path, cpu: int | None) -> tuple[subprocess.Popen[str], int, str]:
    """The emitter, listening: (process, port, its scheduler: SCHED_FIFO or why not)."""
    cmd = [sys.executable, "-m", "local_target.precise_emitter", "--ttft-ms", str(TTFT_MS), "--itl-ms",
           str(ITL_MS), "--ttft-spread-ms", str(ITL_MS), "--log", str(log)] + ([] if cpu is None else
                                                                             ["--cpu", str(cpu)])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                            preexec_fn=_child_setup(None))
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = proc.stdout.readline() if sel.select(READY_TIMEOUT_S) else ""
    if not line.startswith("listening "):
        stop(proc)
        err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
        if proc.stderr:
            proc.stderr.close()
        raise StepError("the emitter did not start: " + (err[-1] if err else f"no line in {READY_TIMEOUT_S:g} s"))
    _, port, scheduler = line.strip().split(" ", 2)
    return proc, int(port), scheduler


def stop(proc: subprocess.Popen[str], timeout_s: float = 5.0) -> None:
    """SIGTERM (the emitter then writes its log), SIGKILL after ``timeout_s``; its stdout closed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout:
        proc.stdout.close()


def run_child(cmd: list[str], cpus: tuple[int, ...] | None, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``cmd`` (``loadgen run``) in a process group of its own, its output captured. Past ``timeout_s`` or on an
    interrupt (Ctrl-C, SIGTERM): SIGTERM, which ``loadgen run`` answers by stopping its ``--workers`` processes,
    then SIGKILL after ``STOP_GRACE_S``; either way whatever is left in its group (a worker) is SIGKILLed."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)  # an interrupt while the child starts waits
    try:  # until the child is ours to stop (one in Popen left it running, unsignalled)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                preexec_fn=_child_setup(cpus), process_group=0)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a pending interrupt lands here, where it stops the child
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=STOP_GRACE_S)  # read on: a child blocked writing a full pipe cannot stop
        except subprocess.TimeoutExpired:
            pass
        _kill_group(proc.pid)  # a process left holds the pipes open: the output ends when the group has gone
        proc.communicate()
        raise
    _kill_group(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(pgid: int) -> None:
    """SIGKILL to what is left of a process group (it outlives its leader while a member lives)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_step(streams: int, duration_s: float, work: Path, pin: Pinning, engine: str = "asyncio",
             workers: int = 1) -> dict[str, Any]:
    """One step: the emitter and ``loadgen run`` at ``streams``, scored; within duration + warm-up + STARTUP_S."""
    deadline = time.monotonic() + duration_s + WARMUP_S + STARTUP_S
    work.mkdir(parents=True, exist_ok=True)
    log, run_dir = work / "writes.json", work / "run"
    emitter, port, scheduler = start_emitter(log, pin.emitter_cpu)
    try:
        (work / "scenario.yaml").write_text(scenario_yaml(port, streams, duration_s))
        cmd = [sys.executable, "-m", "loadgen", "run", str(work / "scenario.yaml"), "--out", str(run_dir),
               "--no-progress", "--no-png", "--no-server-metrics", "--engine", engine]
        cmd += ["--workers", str(workers)] if workers > 1 else []
        res = run_child(cmd, pin.loadgen_cpus, timeout_s=max(1.0, deadline - time.monotonic() - 10))
    except subprocess.TimeoutExpired:
        raise StepError(f"{streams} streams: loadgen run did not end within its step's "
                        f"{duration_s + WARMUP_S + STARTUP_S:g} s") from None
    finally:
        stop(emitter)
        if emitter.stderr:
            emitter.stderr.close()
    if res.returncode not in (0, 1, 3):  # 1: a failed request fails the default SLO; 3: inconclusive
        tail = (res.stderr or res.stdout).strip().splitlines()
        raise StepError(f"{streams} streams: loadgen run exited {res.returncode}: {tail[-1] if tail else ''}",
                        bug=res.returncode == 4)
    if not log.exists():
        raise StepError(f"{streams} streams: the emitter wrote no log (exit code {emitter.returncode})")
    try:
        figures = measure(json.loads(log.read_text()), run_dir)
    except (OSError, ValueError, KeyError) as exc:  # interrupted before its records: nothing to score
        raise StepError(f"{streams} streams: the run's records could not be scored: {exc}") from None
    return {"streams": streams, **figures, "emitter_scheduler": scheduler, "run_exit_code": res.returncode}


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (NaN for no values)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def errors_ms(truth: dict[str, list[int]], requests: Any, chunks: Any) -> tuple[list[float], list[float]]:
    """Per measured request: its TTFT error; per pair of its chunks: the chunk-gap error (ms)."""
    import polars as pl

    by_seq = {seq: g["t_ns"].to_list() for (seq,), g in chunks.sort("t_ns").group_by("seq")}
    ttft, gaps = [], []
    done = requests.filter(pl.col("error_kind").is_null() & ~pl.col("warmup"))
    for row in done.iter_rows(named=True):
        writes = truth.get(row["request_id"] or "", [])[1:]  # [0] is the emitter's receipt of the request
        seen = by_seq.get(row["seq"], [])
        if not writes or not seen:
            continue
        ttft.append((row["t_first_token_ns"] - writes[0]) / 1e6)
        gaps += [abs((b - a) - (wb - wa)) / 1e6 for a, b, wa, wb in zip(seen, seen[1:], writes, writes[1:])]
    return ttft, gaps


def true_p99s_ms(truth: dict[str, list[int]], requests: Any) -> tuple[float, float]:
    """The emitter's own TTFT and chunk-gap p99 over the requests summary.json judges (measured, successful):
    TTFT from loadgen's send stamp (right within 10 µs: it is taken just before the write) to the first token's
    write; gaps between the writes. Linear interpolation, as summary.json's (analysis/metrics.describe)."""
    import polars as pl

    ttft, gaps = [], []
    done = requests.filter(pl.col("error_kind").is_null() & ~pl.col("warmup"))
    for row in done.iter_rows(named=True):
        writes = truth.get(row["request_id"] or "", [])[1:]
        if writes:
            ttft.append((writes[0] - row["t_sent_ns"]) / 1e6)
            gaps += [(b - a) / 1e6 for a, b in zip(writes, writes[1:])]
    p99 = [pl.Series(v, dtype=pl.Float64).quantile(0.99, interpolation="linear") if v else None for v in (ttft, gaps)]
    return tuple(float("nan") if v is None else float(v) for v in p99)  # type: ignore[return-value]


def measure(truth: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A step's figures from the emitter's log and the run directory's records."""
    import polars as pl

    from loadgen.records.scan import load_records

    requests, chunks = load_records(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    emitter = truth.pop("__emitter__")
    ttft, gaps = errors_ms(truth, requests, chunks)
    true_ttft, true_gap = true_p99s_ms(truth, requests)
    metrics = summary.get("metrics", {})
    gen = summary["generator"]
    tokens = int(requests["output_tokens"].fill_null(0).sum())
    cpu_ms = gen["cpu_s"] / tokens * 1e6 if gen.get("cpu_s") is not None and tokens else float("nan")
    return {"tokens_per_s": summary["throughput"]["output_tokens_per_s"], "gap_p99_ms": pct(gaps, 0.99),
            "ttft_p99_ms": pct(ttft, 0.99), "cpu_ms_per_1k": cpu_ms,
            # the service TTFT (from the send): the emitter cannot see the intended instant; ttft_ms adds the
            # queue delay, which the generator-lag rule bounds (queue_delay_p99_ms here)
            "reported_ttft_p99_ms": (metrics.get("ttft_service_ms") or {}).get("p99"), "true_ttft_p99_ms": true_ttft,
            "queue_delay_p99_ms": (metrics.get("queue_delay_ms") or {}).get("p99"),
            "reported_gap_p99_ms": (metrics.get("chunk_gap_ms") or {}).get("p99"), "true_gap_p99_ms": true_gap,
            "cpu_utilization": gen.get("cpu_utilization") or float("nan"), "processes": gen.get("processes") or 1,
            "max_cpu_utilization": gen.get("max_cpu_utilization") or float("nan"),
            "emitter_lateness_p99_us": emitter["lateness_us"]["p99"], "requests": requests.height,
            "measured": len(ttft), "failed": int(requests.filter(pl.col("error_kind").is_not_null()).height)}


def held(row: dict[str, Any], max_error_ms: float) -> bool:
    """Both p99 errors within the tolerance, over measured requests, none failed (NaN never holds)."""
    return bool(row["measured"]) and not row["failed"] and row["gap_p99_ms"] <= max_error_ms \
        and row["ttft_p99_ms"] <= max_error_ms


@dataclass
class Settings:
    steps: list[int]
    duration_s: float
    max_error_ms: float
    engine: str = "asyncio"
    workers: int = 1  # sending processes (loadgen run --workers)


def bench(settings: Settings, pin: Pinning, on_start: Callable[[int, int], None],
          on_step: Callable[[dict[str, Any]], None]) -> list[dict[str, Any]]:
    """Every step up the ladder until the first past the tolerance (that one included); StepError stops it."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="loadgen-bench-client-") as tmp:
        for i, streams in enumerate(settings.steps):
            on_start(i, streams)
            row = run_step(streams, settings.duration_s, Path(tmp) / f"step-{streams}", pin, settings.engine,
                           settings.workers)
            row["held"] = held(row, settings.max_error_ms)
            rows.append(row)
            on_step(row)
            if not row["held"]:
                break
    return rows


def best(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The highest step that held (steps stop after the first that did not)."""
    return max((r for r in rows if r["held"]), key=lambda r: r["streams"], default=None)


def _ms(value: float) -> str:
    return "not measured" if value != value else f"{value:.2f} ms"


def final_line(rows: list[dict[str, Any]], max_error_ms: float, processes: int) -> str:
    within = f"within {max_error_ms:g} ms"
    where = f"on this machine ({'one process' if processes <= 1 else f'{processes} processes'})"
    top = best(rows)
    if top is not None:
        return f"loadgen measures up to {top['tokens_per_s']:,.0f} tokens/s {within} {where}"
    if not rows:
        return f"loadgen measured no step {where}: none ended"
    first = rows[0]
    return (f"loadgen measured no step {within} {where}: at {first['streams']} streams, chunk-gap p99 error "
            f"{_ms(first['gap_p99_ms'])}, TTFT p99 error {_ms(first['ttft_p99_ms'])}, {first['failed']} failed")


def _plain(value: Any) -> Any:
    """NaN (a figure that could not be taken) as null: JSON has no NaN."""
    return None if isinstance(value, float) and value != value else value


def machine_line(cpus: int, load_1m: float) -> str:
    """The CPUs and what else ran: other work on the same CPUs delays loadgen's reads and shows in the errors."""
    busy = load_1m >= 0.5
    return (f"machine: {cpus} CPU{'s' if cpus > 1 else ''}, load average {load_1m:.2f} before the test"
            + ("; other work competes with loadgen and the emitter: keep the machine otherwise idle" if busy else ""))


def document(settings: Settings, pin: Pinning, rows: list[dict[str, Any]], line: str,
             load_1m: float) -> dict[str, Any]:
    """The --out JSON: settings, pinning, the machine, every step, the result."""
    top = best(rows)
    rows = [{k: _plain(v) for k, v in r.items()} for r in rows]
    return {"settings": {**asdict(settings), "warmup_s": WARMUP_S, "ttft_ms": TTFT_MS, "itl_ms": ITL_MS,
                         "output_tokens": OUTPUT_TOKENS, "prompt_tokens": PROMPT_TOKENS},
            "pinning": {"emitter_cpu": pin.emitter_cpu, "loadgen_cpus": pin.loadgen_cpus,
                        "processes": pin.processes, "line": pin.describe()},
            "cpus": len(os.sched_getaffinity(0)), "load_average_1m_before": load_1m, "steps": rows,
            "result": {"tokens_per_s": top["tokens_per_s"] if top else None,
                       "streams": top["streams"] if top else None, "max_error_ms": settings.max_error_ms,
                       "line": line}}
