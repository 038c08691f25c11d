"""``loadgen run --workers N|auto`` on the asyncio engine: N sending processes on this machine, one plan split
between them (plan/shares.py), their records merged into ONE run directory (records/merge.py), then one summary
and one verdict from the merged records, with the CPU of every process in summary.json's ``generator`` block.

The parent process resolves the target (its banner, run.json), starts the embedded simulator if asked, scrapes
the server's /metrics, and starts the processes (multiprocessing, spawn: a fresh interpreter each, nothing of
this process's loop or threads inherited; run/worker_process.py). When every one is ready it gives them one
start instant on the monotonic clock (the same clock in every process of the machine), so the shares keep the
plan's instants. Every wait has a bound: the processes say they are ready within ``READY_CHECKS`` preflight
timeouts and ``READY_MARGIN_S`` or are stopped (one line, exit 2, nothing sent); a process not done by the plan's
give-up point (its hard end and ``WORKER_GRACE_S``, plan/deadlines.py) is told to stop, then after ``SHUTDOWN_S``
SIGTERMed by its PID, then SIGKILLed. Ctrl-C or SIGTERM stops every process (what is in flight is cancelled and
recorded). A process that crashes or is killed leaves its records up to its last flush (kept) and the run is cut
short, named: a would-be pass is inconclusive (docs/verdicts.md). Before the start: a bad target is exit 2, an
interrupt exit 3. A process that says it crashed (a bug in loadgen) ends the run with exit 4, after its reports
if it had started. A full disk in the merge leaves the processes' records where they are (``workers/<k>/``):
the run is inconclusive.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from rich.console import Console
from rich.markup import escape

from loadgen.analysis.result import RunResult
from loadgen.errors import ScenarioError, ServerFault
from loadgen.plan.deadlines import SHUTDOWN_S, give_up_s
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import build_plan
from loadgen.plan.shares import processes_for
from loadgen.plan.until_spec import horizon
from loadgen.records.merge import WORKERS_DIR, merge_shares, share_dir
from loadgen.report.console import print_summary
from loadgen.run import exits, worker_process
from loadgen.run.loops import event_loop_run, interruptible
from loadgen.run.prepare import Preparation, note_proxy, target_proxy
from loadgen.run.runner import Run, RunOptions
from loadgen.run.session import RunSession, processes_figures
from loadgen.run.target import ResolvedTarget, TargetError, auth_headers, resolve, scenario_secrets, start_embedded

START_LEAD_S = 0.25  # the common start is this far after the last process said it is ready
POLL_S = 0.05
READY_MARGIN_S = 60.0  # beyond the preflight's checks, for a process's start-up and its prompts
READY_CHECKS = 3  # a process's preflight: at most this many checks of target.preflight_timeout_s each


class WorkerCrash(RuntimeError):
    """A sending process crashed (a bug in loadgen): the run ends as any bug does, exit 4."""


def ready_bound_s(scenario: Scenario) -> float:
    """How long the processes may take to say ``ready`` (resolve the target, build the prompts)."""
    return READY_CHECKS * scenario.target.preflight_timeout_s + READY_MARGIN_S


def refuse_workers(scenario: Scenario) -> None:
    """What a run on several processes cannot do: one line (exit 2) before anything starts."""
    if scenario.load.until == "decided":
        raise ScenarioError("load.until: decided judges the records as one process takes them: drop --workers, "
                            "or set load.until: duration")
    faults = scenario.target.simulator.faults
    if faults is not None and faults.client_blocks:
        raise ScenarioError("target.simulator.faults.client_block_ms blocks one process's loop: drop --workers")


def run_workers(scenario: Scenario, opts: RunOptions, console: Console, workers: int) -> RunResult:
    """The run on ``workers`` processes (a closed loop: no more than its users); see the module's docstring."""
    if opts.capture:
        raise ScenarioError("--capture keeps what one process received: it works without --workers")
    auth_headers(scenario)
    refuse_workers(scenario)
    plan = build_plan(horizon(scenario))
    session = RunSession(scenario.name, opts, console)
    parent = Parent(scenario, Run(scenario, plan, session, console, opts), processes_for(scenario, workers))
    sim = None
    try:
        sim = start_embedded(scenario, session.run_dir) if scenario.target.embedded else None
        target = event_loop_run(parent.execute(sim.base_url if sim else scenario.target.base_url, sim))
    except (TargetError, exits.Interrupted, KeyboardInterrupt):
        parent.end_processes()
        session.discard_if_empty()
        raise
    except ServerFault as exc:
        parent.end_processes()
        session.discard_if_empty()
        raise TargetError(str(exc)) from None
    finally:
        parent.end_processes()
        parent.merge()
        if sim is not None:
            sim.stop()
    session.phase("writing the reports")
    result = parent.run.finish(target, parent.generator())
    print_summary(console, result, str(session.run_dir))
    for k, why in sorted(parent.crashed.items()):  # the records and reports are written: then a bug is a bug
        raise WorkerCrash(f"sending process {k} crashed ({why}); its traceback is on stderr above")
    return result


class Parent:
    """The processes of one run: started, given their start, watched, stopped, their figures kept."""

    def __init__(self, scenario: Scenario, run: Run, processes: int) -> None:
        self.scenario, self.run, self.n = scenario, run, processes
        self.procs: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self.ready: set[int] = set()
        self.figures: dict[int, dict[str, Any]] = {}
        self.counts: dict[int, int] = {}
        self.gone: dict[int, str] = {}  # processes that ended without their figures: why
        self.crashed: dict[int, str] = {}  # those that said they crashed (a bug in loadgen: exit 4)
        self.started = self.stopping = False
        self.master_cpu_s: float | None = None  # this (coordinating, not sending) process's CPU while they sent
        self.merged = False

    async def execute(self, base_url: str, sim: Any) -> ResolvedTarget:
        def on_signal() -> bool:
            self.run.interrupted = True
            if not self.started:
                return True
            self.stop_all("interrupted")
            return False
        return await interruptible(self._execute(base_url, sim), on_signal)

    async def _execute(self, base_url: str, sim: Any) -> ResolvedTarget:
        run = self.run
        target = await self._resolve(base_url)
        target.sim = sim
        run.write_run_json(target, finished=False)
        self._spawn(base_url)
        await self._until_ready()
        t0_ns = time.monotonic_ns() + int(START_LEAD_S * 1e9)
        for conn in self.conns:
            conn.send(("start", t0_ns))
        self.started = True
        run.session.phase("running")
        cpu0 = time.process_time()
        async with run.server_metrics(target):
            await self._watch(t0_ns + int(give_up_s(run.plan, self.scenario) * 1e9))
        self.master_cpu_s = round(time.process_time() - cpu0, 3)
        self.note(target)
        return target

    async def _resolve(self, base_url: str) -> ResolvedTarget:
        """The target as the processes will find it: for run.json, the banner and the scraper."""
        prep = Preparation(horizon(self.scenario), self.run.plan, base_url,
                           out_dir=self.run.run_dir if self.run.opts.progress else None)
        headers, redact = auth_headers(self.scenario)
        proxy = target_proxy(self.scenario, base_url)
        async with prep.open_client() as client:
            target = await resolve(self.scenario, client, base_url, headers, redact)
        note_proxy(target, proxy)
        if prep.out_dir is not None:
            from loadgen.report.banner import banner_lines
            err = Console(stderr=True)
            for line in banner_lines(self.scenario, target, prep.out_dir, err.width):
                err.print(line, highlight=False, markup=False, soft_wrap=True)
            err.print(f"sending from {self.n} processes (--workers)", highlight=False)
        return target

    def _spawn(self, base_url: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        for k in range(self.n):
            mine, theirs = ctx.Pipe()
            share = worker_process.Share(self.scenario, k, self.n, base_url, share_dir(self.run.run_dir, k),
                                         scenario_secrets(self.scenario))
            proc = ctx.Process(target=worker_process.main, args=(share, theirs), name=f"loadgen-worker-{k}",
                               daemon=True)
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.conns.append(mine)

    async def _until_ready(self) -> None:
        """Every process resolved its target and built its prompts, by ``ready_s``: a TargetError from one is the
        run's (exit 2), an interrupt is (exit 3), a crash is a bug (exit 4); not ready in time: exit 2."""
        ready_s = ready_bound_s(self.scenario)
        by = time.monotonic() + ready_s
        while len(self.ready) < self.n:
            self._read()
            for k, why in self.gone.items():
                kind, _, message = why.partition(":")
                if kind == "target":
                    raise TargetError(message.strip())
                if kind == "interrupted":
                    self.run.interrupted = True
                    raise exits.Interrupted()
                raise WorkerCrash(f"sending process {k} ended before the start ({why}); "
                                  "its traceback is on stderr above")
            if time.monotonic() > by:
                late = sorted(set(range(self.n)) - self.ready)
                raise TargetError(f"sending process(es) {', '.join(map(str, late))} not ready within {ready_s:.0f} s "
                                  "(resolving the target, building the prompts): stopped, nothing was sent")
            await asyncio.sleep(POLL_S)

    async def _watch(self, give_up_ns: int) -> None:
        """Until every process has ended, or the give-up point: progress on stderr, fail-fast relayed."""
        with self.run.progress() as progress:
            task = progress.add_task(f"running ({self.n} processes)", total=self.run.plan.size)
            stopped_at: float | None = None
            while any(p.is_alive() for p in self.procs) or any(self._poll(c) for c in self._open()):
                self._read()
                progress.update(task, completed=sum(self.counts.values()))
                if time.monotonic_ns() >= give_up_ns and not self.stopping:
                    self.stop_all("past the run's give-up point")
                if self.stopping:
                    stopped_at = stopped_at or time.monotonic()
                    if time.monotonic() - stopped_at > SHUTDOWN_S:
                        break  # end_processes: SIGTERM, then SIGKILL
                await asyncio.sleep(POLL_S)
            self._read()

    def _open(self) -> list[Connection]:
        return [c for c in self.conns if not c.closed]

    def _read(self) -> None:
        for k, conn in enumerate(self.conns):
            while not conn.closed and self._poll(conn):
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    conn.close()
                    if k not in self.figures and k not in self.gone:
                        self.gone[k] = f"crash: it ended without its figures (exit code {self.procs[k].exitcode})"
                    break
                self._on_message(k, msg)

    @staticmethod
    def _poll(conn: Connection) -> bool:
        try:
            return conn.poll()
        except (EOFError, OSError):
            return True

    def _on_message(self, k: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ready":
            self.ready.add(k)
        elif kind == "n":
            self.counts[k] = int(msg[1])
        elif kind == "stopped":
            self.run.console.print(f"[red]error:[/] process {k}: {escape(str(msg[1]))}; stopping the run",
                                   highlight=False)
            self.stop_all(str(msg[1]))
        elif kind == "done":
            self.figures[k] = msg[1]
            self.counts[k] = int(msg[1].get("records") or 0)
        elif kind == "error":
            self.gone[k] = f"{msg[1]}: {msg[2]}"
            if msg[1] == "crash":
                self.crashed[k] = str(msg[2])

    def stop_all(self, reason: str) -> None:
        self.stopping = True
        for conn in self._open():
            try:
                conn.send(("stop", reason))
            except (OSError, ValueError):
                pass

    def end_processes(self) -> None:
        """Every process ends, by its PID: told to stop, SIGTERM after ``SHUTDOWN_S``, then SIGKILL."""
        if not self.procs or all(p.exitcode is not None for p in self.procs):
            return
        self.stop_all("the run ended")
        deadline = time.monotonic() + SHUTDOWN_S
        for p in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(SHUTDOWN_S)
            if p.is_alive():
                p.kill()
                p.join()
        self._read()

    def merge(self) -> None:
        """The processes' records into the run directory, once (whatever ended the run)."""
        if self.merged or not self.procs:
            return
        self.merged = True
        try:
            broken = merge_shares(self.run.run_dir, self.n)
        except OSError as exc:  # a full disk: inconclusive, the processes' records kept where they are (workers/)
            self.run.session.disk_error = (f"{exc.strerror or exc}: the records could not be merged; each "
                                           f"process's are kept in {self.run.run_dir / WORKERS_DIR}/<k>/")
            return
        for why in broken:
            self.run.session.disk_error = self.run.session.disk_error or why

    def note(self, target: ResolvedTarget) -> None:
        """The processes' own notes (once each), and those that ended without finishing (the run cut short)."""
        for k, fig in sorted(self.figures.items()):
            for line in fig.get("notes") or []:
                if line not in target.notes:
                    target.notes.append(line if self.n == 1 else f"process {k}: {line}")
            self.run.sessions_not_finished += list(fig.get("sessions_not_finished") or [])
            if fig.get("stopped_early") and not self.run.cut_short:
                self.run.cut_short = f"process {k}: {fig['stopped_early']}"
            if fig.get("disk_error"):
                self.run.session.disk_error = self.run.session.disk_error or str(fig["disk_error"])
        self.run.prompt_stats = sum_prompts([f.get("prompts") for _, f in sorted(self.figures.items())])
        for k, why in sorted(self.gone.items()):
            line = (f"sending process {k} (pid {self.procs[k].pid}) ended before its share of the plan did ({why}); "
                    "its records up to its last flush are kept")
            target.notes.append(line)
            self.run.cut_short = self.run.cut_short or line
            self.run.console.print(f"[yellow]warning:[/] {escape(line)}", highlight=False)

    def generator(self) -> dict[str, Any]:
        per = [self.figures.get(k, {"process": k, "pid": self.procs[k].pid if self.procs else None})
               for k in range(self.n)]
        return processes_figures("asyncio", per, **({} if self.master_cpu_s is None else
                                                    {"master_cpu_s": self.master_cpu_s}))


PROMPT_COUNTS = ("built", "counted", "estimated", "checked", "missed")


def sum_prompts(per: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """run.json's ``prompts`` of the run: the processes' counts summed, the largest error, the policy as it is."""
    got = [p for p in per if p]
    if not got:
        return None
    total = {**got[0], **{key: sum(int(p.get(key) or 0) for p in got) for key in PROMPT_COUNTS}}
    total["max_error_tokens"] = max(int(p.get("max_error_tokens") or 0) for p in got)
    if any(p.get("policy") == "every prompt" for p in got):
        total["policy"] = "every prompt"
    return total
