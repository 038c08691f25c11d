"""``loadgen run --engine locust [--workers N]``, ``loadgen worker`` and ``loadgen ui``: Locust runners around
the LLM users of ``drivers/locust_user.py``. The master (or the single process) owns the run directory: workers
ship their raw records to it in batches, so what a worker sent before it stopped is kept.

Import this module before anything imports ``ssl`` or ``socket`` users: through ``drivers/locust_user.py`` (the
one module that imports locust or gevent) it monkey-patches the process for gevent.
"""

from __future__ import annotations

from loadgen.drivers import locust_user as lu  # first: Locust monkey-patches the process on import

import os  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from rich.console import Console  # noqa: E402

from loadgen.analysis.result import RunResult  # noqa: E402
from loadgen.report.console import print_summary  # noqa: E402
from loadgen.run.runner import RunOptions, Run, make_run_dir  # noqa: E402
from loadgen.plan.scenario import Scenario  # noqa: E402
from loadgen.plan.schedule import build_plan  # noqa: E402
from loadgen.run.prepare import Preparation, ssl_context  # noqa: E402
from loadgen.drivers.scrape import Scraper  # noqa: E402
from loadgen.drivers.locust_messages import unpack  # noqa: E402
from loadgen.run.target import TargetError, auth_headers, start_embedded  # noqa: E402

START_LEAD_S = 1.0  # the plan's t0 is this far after the slices are sent
WORKER_GRACE_S = 15.0  # after the plan's hard end, the master waits this long for a worker's last records
WORKER_CONNECT_TIMEOUT_S = 60.0


@dataclass
class WorkerLaunch:
    """How to start a worker process that loads the same scenario as the master."""

    scenario_path: Path
    sets: list[str] = field(default_factory=list)


def users_for(scenario: Scenario) -> int:
    """Closed loop: one user per concurrent request. Open loop: enough users never to hold a request back
    (``max_in_flight``); fewer would show up as queue delay, which is recorded."""
    return scenario.load.concurrency or scenario.load.max_in_flight


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_scraper(state: lu.ProcessState, target: Any, opts: RunOptions) -> Scraper | None:
    """The server's /metrics scraped on this process's engine thread (the master's, with workers)."""
    if not opts.server_metrics:
        return None
    scraper = Scraper(target.root + "/metrics", target.headers, opts.server_metrics_period_s,
                      verify=ssl_context(state.scenario) or True, proxy=target.proxy)
    state.engine.start_scraper(scraper)
    return scraper


def send_slices(runner: Any) -> list[str]:
    """Give each connected worker its slice of the plan and the plan's start (wall clock: workers may run on
    other machines); returns the workers' ids in slice order."""
    clients = sorted(runner.clients.keys())
    t0_wall_ns = time.time_ns() + int(START_LEAD_S * 1e9)
    for i, client_id in enumerate(clients):
        runner.send_message(lu.SLICE_MESSAGE, {"index": i, "workers": len(clients), "t0_wall_ns": t0_wall_ns},
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
        self.scenario, self.opts, self.console, self.workers, self.launch = scenario, opts, console, workers, launch
        self.plan = build_plan(scenario)
        self.done_workers: set[str] = set()
        self.left_workers: list[str] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.recorded = 0
        self.stopped = False  # the fail-fast guard stopped the run

    def execute(self) -> RunResult:
        auth_headers(self.scenario)  # may raise TargetError before anything starts
        run_dir = make_run_dir(self.scenario, self.opts)
        sim = start_embedded(self.scenario, run_dir) if self.scenario.target.embedded else None
        self.sim = sim
        self.base_url = sim.base_url if sim else self.scenario.target.base_url
        self.run = Run(self.scenario, self.plan, run_dir, self.console, self.opts, engine_name="locust")
        try:
            result = self._drive()
        except TargetError:
            if self.opts.out is None and not any(run_dir.glob("*.parquet")):
                shutil.rmtree(run_dir, ignore_errors=True)  # nothing was sent: leave no empty run behind
            raise
        finally:
            for p in self.procs:
                if p.poll() is None:
                    p.terminate()
                    p.wait(10)
            if sim is not None:
                sim.stop()
        print_summary(self.console, result, str(run_dir))
        return result

    def _drive(self) -> RunResult:
        prep = Preparation(self.scenario, self.plan, self.base_url, capture=self.run.captures)
        state = lu.ProcessState(self.scenario, prep, on_record=self._record)
        self.run.stopper = lambda reason: self._stop_early(state)
        try:
            target = state.engine.wait_ready(lu.sleep)  # the master probes the target too: exit 2 early
            target.sim = self.sim
            scraper = start_scraper(state, target, self.opts)
            env = lu.new_environment()
            cpu0, wall0 = time.process_time(), time.monotonic()
            if self.workers:
                self._distributed(env)
            else:
                self._local(env, state)
            cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
            self.run.note_cut_at_end(target, state.engine.engine.stats.cut_at_end)  # this process's engine
            if scraper is not None:
                state.engine.stop_scraper(lu.sleep)
                self.run.keep_server_metrics(scraper, target)
        finally:
            state.close()
        generator: dict[str, Any] = {"engine": "locust", "workers": self.workers, "left": self.left_workers}
        if not self.workers:  # one process: its CPU is the generator's (with workers, it is theirs)
            generator.update(cpu_s=round(cpu_s, 3), wall_s=round(wall_s, 3),
                             cpu_utilization=round(cpu_s / wall_s, 3) if wall_s else None)
        if self.left_workers:
            target.notes.append(f"{len(self.left_workers)} worker(s) left before their plan ended, or did not say "
                                f"so within {WORKER_GRACE_S:g} s of its hard end: their records up to then are kept")
        self.run.note_stopped_early(target)
        return self.run.finish(target, generator)

    def _local(self, env: Any, state: lu.ProcessState) -> None:
        lu.LLMUser.state = state
        runner = env.create_local_runner()
        state.set_slice(0, 1, time.monotonic_ns() + int(0.2e9))
        n = users_for(self.scenario)
        runner.start(n, spawn_rate=max(n * 100.0, 1.0))
        self._wait(lambda: state.finished or self.stopped, runner)
        runner.quit()

    def _distributed(self, env: Any) -> None:
        port = _free_port()
        runner = env.create_master_runner(master_bind_host="127.0.0.1", master_bind_port=port)
        runner.register_message(lu.RECORDS_MESSAGE, self._on_records)
        runner.register_message(lu.DONE_MESSAGE, lambda msg, **_: self.done_workers.add(msg.node_id))
        self._start_workers(port)
        deadline = time.monotonic() + WORKER_CONNECT_TIMEOUT_S
        while runner.worker_count < self.workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise TargetError(f"only {runner.worker_count} of {self.workers} workers connected")
            lu.sleep(0.05)
        clients = send_slices(runner)
        # closed loop: the scenario's concurrency in all, shared out by Locust; open loop: each worker's users
        n = users_for(self.scenario) * (1 if self.scenario.load.concurrency else len(clients))
        runner.start(n, spawn_rate=max(n * 100.0, 1.0))
        end_s = self.plan.hard_end_s(self.scenario.load.drain_timeout_s)
        give_up = time.monotonic() + end_s + WORKER_GRACE_S if end_s is not None else None
        self._wait(lambda: self._all_workers_done(runner, clients) or self.stopped or self._gave_up(give_up, clients),
                   runner)
        runner.quit()

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
            self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                               env={**os.environ}))

    def _wait(self, done: Any, runner: Any) -> None:
        """Until the plan is done: progress on stderr, records flushed to Parquet every second."""
        last_flush = time.monotonic()
        with self.run.progress() as progress:
            task = progress.add_task("running (locust)", total=self.plan.size)
            while not done():
                lu.sleep(0.25)
                progress.update(task, completed=self.recorded, description=(
                    f"running (locust)  users {runner.user_count:>4}  workers {len(self.done_workers)} done"))
                if time.monotonic() - last_flush >= 1.0 and self.run.sink.pending() and not self.run.disk_error:
                    last_flush = time.monotonic()
                    try:
                        self.run.sink.flush()
                    except Exception as exc:  # noqa: BLE001 - the records stay in memory either way
                        self.stopped = self.run.flush_failed(exc) or self.stopped

    def _record(self, record: Any, chunks: Any) -> None:
        self.recorded += 1
        self.run.on_record(record, chunks)  # into the sink, past the fail-fast guard

    def _stop_early(self, state: lu.ProcessState) -> None:
        """Fail fast: stop waiting for the plan; what this process has in flight is cancelled."""
        self.stopped = True
        state.engine.cancel_in_flight()


def run_worker(scenario: Scenario, master_host: str, master_port: int) -> int:
    """A worker: its slice of the plan, its records shipped to the master; returns when the master quits."""
    plan = build_plan(scenario)
    env = lu.new_environment()
    runner = env.create_worker_runner(master_host, master_port)
    outbox = lu.Outbox(runner, worker=0)
    state = lu.ProcessState(scenario, Preparation(scenario, plan, scenario.target.base_url), on_record=outbox.add)
    lu.LLMUser.state = state

    def on_slice(msg: Any, **_: Any) -> None:
        data = msg.data
        outbox.worker = data["index"]
        t0_ns = time.monotonic_ns() + (data["t0_wall_ns"] - time.time_ns())
        state.set_slice(data["index"], data["workers"], t0_ns)
        lu.spawn(_report_done, state, outbox, runner)

    runner.register_message(lu.SLICE_MESSAGE, on_slice)
    state.engine.wait_ready(lu.sleep)
    runner.greenlet.join()
    state.close()
    outbox.close()
    return 0


def _report_done(state: lu.ProcessState, outbox: lu.Outbox, runner: Any) -> None:
    while not state.finished:
        lu.sleep(0.1)
    outbox.flush()
    runner.send_message(lu.DONE_MESSAGE, dict(state.counts))
