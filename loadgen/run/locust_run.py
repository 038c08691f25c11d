"""``loadgen run --engine locust [--workers N]``, ``loadgen worker`` and ``loadgen ui``: Locust runners around
the LLM users of ``drivers/locust_user.py``. The master (or the single process) owns the run directory, through
the same ``RunSession`` as the asyncio driver (run/session.py: directory, phase, flush and disk-full policy):
workers ship their raw records to it in batches, so what a worker sent before it stopped is kept.

Every wait has a deadline derived from the run's stated bound (plan/deadlines.py): the plan's hard end plus
``WORKER_GRACE_S``, then ``SHUTDOWN_S`` for the runners and the worker processes. A worker that dies or stalls
(Locust marks it missing after three silent heartbeats), or that has not said its slice is done by the give-up
point, is *left*: its records up to its last batch are kept, the run ends on its own and is cut short as one
whose requests the hard end cut is (a would-be pass is inconclusive, exit 3; a failed objective still fails). A
worker whose master is gone gives up by itself. Worker processes write their stderr to a file, never to a pipe
nobody reads.

Import this module before anything imports ``ssl`` or ``socket`` users: through ``drivers/locust_user.py`` (the
one module that imports locust or gevent) it monkey-patches the process for gevent.
"""

from __future__ import annotations

from loadgen.drivers import locust_user as lu  # first: Locust monkey-patches the process on import

import logging  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import IO, Any  # noqa: E402

from rich.console import Console  # noqa: E402

from loadgen.analysis.result import RunResult  # noqa: E402
from loadgen.drivers.locust_messages import DONE_MESSAGE, RECORDS_MESSAGE, SLICE_MESSAGE, Outbox, unpack  # noqa: E402
from loadgen.drivers.scrape import Scraper  # noqa: E402
from loadgen.plan.deadlines import (ORPHAN_S, SHUTDOWN_S, START_LEAD_S, WORKER_CONNECT_TIMEOUT_S,  # noqa: E402
                                    WORKER_GRACE_S, give_up_s)
from loadgen.plan.scenario import Scenario  # noqa: E402
from loadgen.plan.schedule import build_plan  # noqa: E402
from loadgen.plan.shares import processes_for  # noqa: E402
from loadgen.report.console import print_summary  # noqa: E402
from loadgen.run import exits  # noqa: E402
from loadgen.run.prepare import Preparation, ssl_context  # noqa: E402
from loadgen.run.runner import Run, RunOptions  # noqa: E402
from loadgen.run.client_faults import refuse_client_blocks  # noqa: E402
from loadgen.run.until import refuse_engine  # noqa: E402
from loadgen.run.session import RunSession, generator_figures, processes_figures  # noqa: E402
from loadgen.run.target import TargetError, auth_headers, start_embedded  # noqa: E402

__all__ = ["LocustRun", "RunOptions", "WORKER_GRACE_S", "WorkerLaunch", "quiet_own_spawn_rate", "run_worker",
           "send_slices", "start_scraper", "users_for", "workers_left"]


class _OwnSpawnRate(logging.Filter):
    """Locust warns when users start faster than 100/s; loadgen starts its users all at once on purpose (the
    plan sets the pace, not a ramp-up), so that warning is about a setting the user never made."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "spawn rate is very high" not in record.getMessage()


_OWN_SPAWN_RATE = _OwnSpawnRate()


def quiet_own_spawn_rate() -> None:
    """Drop Locust's high-spawn-rate warning in this process (idempotent: one filter instance)."""
    logging.getLogger("locust.runners").addFilter(_OWN_SPAWN_RATE)


@dataclass
class WorkerLaunch:
    """How to start a worker process that loads the same scenario as the master."""

    scenario_path: Path
    sets: list[str] = field(default_factory=list)


def users_for(scenario: Scenario) -> int:
    """Closed loop: one user per concurrent request. Open loop: enough users never to hold a request back
    (``max_in_flight``); fewer would show up as queue delay, which is recorded."""
    return scenario.load.concurrency or scenario.load.max_in_flight


def start_scraper(state: lu.ProcessState, target: Any, opts: RunOptions) -> Scraper | None:
    """The server's /metrics scraped on this process's engine thread (the master's, with workers)."""
    if not opts.server_metrics:
        return None
    scraper = Scraper(target.root + "/metrics", target.headers, opts.server_metrics_period_s,
                      verify=ssl_context(state.scenario) or True, proxy=target.proxy,
                      power=state.scenario.target.power_metrics)  # GPU power beside /metrics (F's figures)
    state.engine.start_scraper(scraper)
    return scraper


def send_slices(runner: Any) -> list[str]:
    """Give each connected worker its slice of the plan and the plan's start (wall clock: workers may run on
    other machines); returns the workers' ids in slice order."""
    clients = sorted(runner.clients.keys())
    t0_wall_ns = time.time_ns() + int(START_LEAD_S * 1e9)
    for i, client_id in enumerate(clients):
        runner.send_message(SLICE_MESSAGE, {"index": i, "workers": len(clients), "t0_wall_ns": t0_wall_ns},
                            client_id=client_id)
    return clients


def workers_left(runner: Any, clients: list[str], done: set[str]) -> tuple[bool, list[str]]:
    """(every worker still connected has reported its slice done, the workers that left before that)."""
    alive = {c for c in clients if c in runner.clients and runner.clients[c].state != "missing"}
    return alive <= done, sorted(set(clients) - alive - done)


class LocustRun:
    """One run through Locust: local (one process) or master with N local worker processes."""

    def __init__(self, scenario: Scenario, opts: RunOptions, console: Console, workers: int,
                 launch: WorkerLaunch | None) -> None:
        # a closed loop on no more workers than users: Locust shares the users out, a worker without one would
        # never take its slice of the plan nor say it is done (its share of load.requests never sent)
        workers = processes_for(scenario, workers) if workers else 0
        self.scenario, self.opts, self.console, self.launch = scenario, opts, console, launch
        self.workers = workers if workers > 1 else 0
        refuse_engine(scenario, "locust")  # load.until: decided is the asyncio engine's (exit 2)
        refuse_client_blocks(scenario, "locust")  # its users are not on the asyncio loop
        self.plan = build_plan(scenario)
        self.done_workers: set[str] = set()
        self.worker_figures: dict[str, dict[str, Any]] = {}  # each worker's CPU over its slice (its done message)
        self.left_workers: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []  # each worker's stderr (a file: a pipe nobody reads would stall it)
        self.recorded = 0
        self.stopped = False  # the fail-fast guard or a full disk stopped the run
        self.gave_up = False  # this process stopped waiting for its own slice at the give-up point

    def execute(self) -> RunResult:
        auth_headers(self.scenario)  # may raise TargetError before anything starts
        session = RunSession(self.scenario.name, self.opts, self.console)
        self.sim = None
        try:
            self.sim = start_embedded(self.scenario, session.run_dir) if self.scenario.target.embedded else None
            self.base_url = self.sim.base_url if self.sim else self.scenario.target.base_url
            self.run = Run(self.scenario, self.plan, session, self.console, self.opts, engine_name="locust")
            target, generator = self._drive()
        except (TargetError, exits.Interrupted, KeyboardInterrupt):
            session.discard_if_empty()  # nothing was sent: leave no empty run behind (as the asyncio driver)
            raise
        except Exception:
            session.close()  # a bug: the records taken so far reach the disk before the crash report
            raise
        finally:
            self._end_workers()
            if self.sim is not None:
                self.sim.stop()
        session.phase("writing the reports")
        result = self.run.finish(target, generator)
        print_summary(self.console, result, str(session.run_dir))
        return result

    def _drive(self) -> tuple[Any, dict[str, Any]]:
        prep = Preparation(self.scenario, self.plan, self.base_url, capture=self.run.captures,
                           out_dir=self.run.run_dir if self.opts.progress else None)  # None: no start banner
        state = lu.ProcessState(self.scenario, prep, on_record=self._record)
        self.run.stopper = lambda reason: self._stop_early(state)
        try:
            target = state.engine.wait_ready(lu.sleep)  # the master probes the target too: exit 2 early
            target.sim = self.sim
            self.run.write_run_json(target, finished=False)  # as the asyncio driver: a run cut short is reportable
            scraper = start_scraper(state, target, self.opts)
            env = lu.new_environment()
            cpu0, wall0 = time.process_time(), time.monotonic()
            self.run.session.phase("running")
            if self.workers:
                self._distributed(env)
            else:
                self._local(env, state)
            cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
            self.run.note_cut_at_end(target, state.engine.cut_at_end)  # this process's engine
            if scraper is not None:
                state.engine.stop_scraper(lu.sleep)
                self.run.keep_server_metrics(scraper, target)
        finally:
            state.close()
        self._note_cut_short(target, state)
        self.run.note_stopped_early(target)
        # one process: its CPU is the generator's; with workers, each worker's over its slice (its done message)
        if not self.workers:
            return target, generator_figures("locust", cpu_s, wall_s, workers=1, left=[])
        per = sorted(self.worker_figures.values(), key=lambda f: f.get("process", 0))
        return target, processes_figures("locust", per, workers=self.workers, left=self.left_workers,
                                         master_cpu_s=round(cpu_s, 3))

    def _note_cut_short(self, target: Any, state: lu.ProcessState) -> None:
        """Workers that left, or answers this process stopped waiting for: noted, and the run cut short."""
        reasons = []
        if self.left_workers:
            reasons.append(f"{len(self.left_workers)} worker(s) left before their plan ended, or did not say so "
                           f"within {WORKER_GRACE_S:g} s of its hard end: their records up to then are kept")
        if self.gave_up or state.abandoned:
            reasons.append(f"{max(state.in_flight, state.abandoned)} request(s) had no answer from the engine "
                           f"{WORKER_GRACE_S:g} s past the run's hard end and were given up")
        target.notes.extend(reasons)
        if reasons:
            self.run.cut_short = reasons[0]

    def _local(self, env: Any, state: lu.ProcessState) -> None:
        lu.LLMUser.state = state
        runner = env.create_local_runner()
        state.set_slice(0, 1, time.monotonic_ns() + int(0.2e9))
        n = users_for(self.scenario)
        quiet_own_spawn_rate()
        runner.start(n, spawn_rate=max(n * 100.0, 1.0))
        give_up = time.monotonic() + 0.2 + give_up_s(self.plan, self.scenario)
        self._wait(lambda: state.finished or self.stopped or self._local_gave_up(give_up), runner)
        self._quit(runner, state)

    def _local_gave_up(self, give_up: float) -> bool:
        self.gave_up = time.monotonic() >= give_up
        return self.gave_up

    def _quit(self, runner: Any, state: lu.ProcessState | None = None) -> None:
        """The runner's quit, within ``SHUTDOWN_S`` (Locust's own waits on its users and greenlets have no
        deadline); what this process still has in flight is cancelled first (recorded as cancelled)."""
        if state is not None and (self.stopped or self.gave_up):
            state.engine.cancel_in_flight()
        if not lu.within(SHUTDOWN_S, runner.quit):
            self.console.print(f"[yellow]warning:[/] Locust's runner did not quit within {SHUTDOWN_S:g} s; "
                               "going on without it", highlight=False)

    def _distributed(self, env: Any) -> None:
        runner = env.create_master_runner(master_bind_host="127.0.0.1", master_bind_port=0)  # a port of its own
        runner.master_bind_port = runner.server.port  # a reset of its socket binds the same port again
        runner.register_message(RECORDS_MESSAGE, self._on_records)
        runner.register_message(DONE_MESSAGE, self._on_done)
        self._start_workers(runner.server.port)
        deadline = time.monotonic() + WORKER_CONNECT_TIMEOUT_S
        while runner.worker_count < self.workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise TargetError(f"only {runner.worker_count} of {self.workers} workers connected"
                                  + self._worker_log_tail())
            lu.sleep(0.05)
        give_up = time.monotonic() + START_LEAD_S + give_up_s(self.plan, self.scenario)  # from the slices' t0
        clients = send_slices(runner)
        # closed loop: the scenario's concurrency in all, shared out by Locust; open loop: each worker's users
        n = users_for(self.scenario) * (1 if self.scenario.load.concurrency else len(clients))
        quiet_own_spawn_rate()
        runner.start(n, spawn_rate=max(n * 100.0, 1.0))
        self._wait(lambda: self._all_workers_done(runner, clients) or self.stopped or self._gave_up(give_up, clients),
                   runner)
        self._quit(runner)

    def _gave_up(self, give_up: float | None, clients: list[str]) -> bool:
        """Past the plan's hard end and the grace: the workers that have not said they are done are left (each
        cuts its own requests at the hard end; a worker that never says so must not hold the run open)."""
        if give_up is None or time.monotonic() < give_up:
            return False
        self.left_workers = sorted(set(self.left_workers) | (set(clients) - self.done_workers))
        return True

    def _all_workers_done(self, runner: Any, clients: list[str]) -> bool:
        done, self.left_workers = workers_left(runner, clients, self.done_workers)
        return done

    def _on_done(self, msg: Any, **_: Any) -> None:
        self.done_workers.add(msg.node_id)
        if isinstance(msg.data, dict):
            self.worker_figures[msg.node_id] = msg.data

    def _on_records(self, msg: Any, **_: Any) -> None:
        for record, chunks in unpack(msg.data):
            self._record(record, chunks)

    def _start_workers(self, port: int) -> None:
        assert self.launch is not None
        args = [sys.executable, "-m", "loadgen", "worker", str(self.launch.scenario_path), "--master-host",
                "127.0.0.1", "--master-port", str(port), "--base-url", self.base_url]
        for item in self.launch.sets:
            args += ["--set", item]
        for _ in range(self.workers):
            log = tempfile.TemporaryFile(prefix="loadgen-worker-")
            self.logs.append(log)
            self.procs.append(subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=log, env={**os.environ}))

    def _worker_log_tail(self) -> str:
        """The last lines a worker wrote to stderr (why it did not connect)."""
        for log in self.logs:
            log.seek(0)
            text = log.read()[-2000:].decode(errors="replace").strip()
            if text:
                return ": a worker said:\n" + "\n".join(text.splitlines()[-10:])
        return ""

    def _end_workers(self) -> None:
        """Every worker process ends: they were told to quit; SIGTERM after ``SHUTDOWN_S``, then SIGKILL."""
        deadline = time.monotonic() + SHUTDOWN_S
        for p in self.procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(SHUTDOWN_S)
            except subprocess.TimeoutExpired:
                p.kill()  # stalled (SIGSTOP, a full pipe, a lock): SIGKILL ends it whatever its state
                p.wait()
        for log in self.logs:
            log.close()

    def _wait(self, done: Any, runner: Any) -> None:
        """Until the plan is done (or its give-up point, in ``done``): progress on stderr, records flushed to
        Parquet every second by the session (a full disk stops the run, as in the asyncio driver). Ctrl-C or
        SIGTERM stops it too, as in the asyncio driver: what is in flight is cancelled, the records taken are
        kept and reported, the run is interrupted (inconclusive at best)."""
        with self.run.progress() as progress:
            task = progress.add_task("running (locust)", total=self.plan.size)
            try:
                while not done():
                    lu.sleep(0.25)
                    progress.update(task, completed=self.recorded, description=(
                        f"running (locust)  users {runner.user_count:>4}  workers {len(self.done_workers)} done"))
                    if self.run.session.flush_due() and self.run.session.flush():
                        self.stopped = True  # the disk is full: the session said so and made the run inconclusive
            except KeyboardInterrupt:
                self.stopped = self.run.interrupted = True

    def _record(self, record: Any, chunks: Any) -> None:
        self.recorded += 1
        self.run.on_record(record, chunks)  # into the sink, past the fail-fast guard

    def _stop_early(self, state: lu.ProcessState) -> None:
        """Fail fast: stop waiting for the plan; what this process has in flight is cancelled."""
        self.stopped = True
        state.engine.cancel_in_flight()


def run_worker(scenario: Scenario, master_host: str, master_port: int) -> int:
    """A worker: its slice of the plan, its records shipped to the master; returns when the master quits (0),
    or by itself when the master is gone past the run's bound (3: inconclusive)."""
    plan = build_plan(scenario)
    outbox = Outbox(lambda kind, data: None, worker=0)
    state = lu.ProcessState(scenario, Preparation(scenario, plan, scenario.target.base_url), on_record=outbox.add)
    lu.LLMUser.state = state
    try:
        state.engine.wait_ready(lu.sleep)  # ready before it connects: its slice comes as soon as it has
        runner = lu.new_environment().create_worker_runner(master_host, master_port)
        outbox.send = runner.send_message
        stop_outbox = lu.every(0.5, outbox.flush)

        def on_slice(msg: Any, **_: Any) -> None:
            data = msg.data
            outbox.worker = data["index"]
            t0_ns = time.monotonic_ns() + (data["t0_wall_ns"] - time.time_ns())
            state.set_slice(data["index"], data["workers"], t0_ns)
            lu.spawn(_report_done, state, outbox, runner, (time.process_time(), time.monotonic()))

        runner.register_message(SLICE_MESSAGE, on_slice)
        quit_by_master = _until_the_master_quits(runner, state)
    finally:
        state.close()
    stop_outbox()
    outbox.flush()
    return 0 if quit_by_master else exits.INCONCLUSIVE


def _until_the_master_quits(runner: Any, state: lu.ProcessState) -> bool:
    """Wait for the master's quit; False when it never came: no slice within ``ORPHAN_S``, or none past this
    slice's give-up point and the master's own shutdown (the master is gone or stalled)."""
    started = time.monotonic()
    while not lu.joined(runner.greenlet, 0.5):
        give_up_ns = state.slice.give_up_ns()
        if give_up_ns is None:
            late = time.monotonic() - started > ORPHAN_S
        else:
            late = time.monotonic_ns() > give_up_ns + int((START_LEAD_S + 2 * SHUTDOWN_S) * 1e9)
        if late:
            print("loadgen worker: no word from the master within the run's bound; stopping", file=sys.stderr)
            lu.within(SHUTDOWN_S, runner.quit)
            return False
    return True


def _report_done(state: lu.ProcessState, outbox: Outbox, runner: Any, started: tuple[float, float]) -> None:
    """Tell the master this slice is done: when it is, or at its give-up point, whichever comes first."""
    while not (state.finished or state.slice.past_give_up(time.monotonic_ns())):
        lu.sleep(0.1)
    outbox.flush()
    cpu0, wall0 = started  # this process's CPU over its slice: the generator's figure (summary.json)
    runner.send_message(DONE_MESSAGE, {**state.counts, "process": state.slice.index, "pid": os.getpid(),
                                       "cpu_s": time.process_time() - cpu0, "wall_s": time.monotonic() - wall0})
