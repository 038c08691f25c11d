"""``loadgen run``: target → plan → prompts → engine → records → summary → reports, in that order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import platform
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from loadgen import __version__
from loadgen.run import exits
from loadgen.analysis.result import RunResult
from loadgen.core.records import ChunkRecord, RequestRecord
from loadgen.drivers import kernel_stamps
from loadgen.drivers.asyncio_engine import AsyncioEngine
from loadgen.drivers.sessions import CallResult, Sessions, Transcript
from loadgen.run.prepare import Prepared, Preparation, ssl_context
from loadgen.run.progress import RunProgress, bar
from loadgen.run.loops import event_loop_run, interruptible
from loadgen.report.console import print_summary
from loadgen.plan.scenario import Scenario
from loadgen.plan.schedule import Plan, PlannedRequest, build_plan
from loadgen.plan.workload import ServerFault
from loadgen.core.secrets import masked_fields, redact_headers, redact_url, write_text
from loadgen.drivers.loop_sampler import LoopSampler
from loadgen.drivers.scrape import Scraper
from loadgen.records.client_metrics import client_metrics_frame, write_client_metrics
from loadgen.run.client_faults import ClientBlocks, client_blocks, refuse_client_blocks
from loadgen.run.guards import Captures, FailFast
from loadgen.run.reporting import rebuild_reports, report_records
from loadgen.run.session import RunSession, generator_figures
from loadgen.run.until import DecidedWatch
from loadgen.plan.until_spec import horizon
from loadgen.run.target import ResolvedTarget, TargetError, auth_headers, sim_trace_path, start_embedded
from loadgen.plan.workload import Prompt, PromptFactory, build_prompts


@dataclass
class RunOptions:
    out: Path | None = None
    reports_dir: Path = Path("reports")
    progress: bool = True
    png: bool = True  # charts/*.png beside report.html
    server_metrics: bool = True  # scrape the target's /metrics into server_metrics.parquet
    server_metrics_period_s: float = 0.5
    capture: int = 0  # keep the first N failed responses as received (run/guards.py)


def run_scenario(scenario: Scenario, opts: RunOptions, console: Console) -> RunResult:
    """Run and report; returns the result (its run directory set). TargetError → exit 2 before anything is sent;
    SIGINT/SIGTERM before sending → exits.Interrupted."""
    auth_headers(scenario)  # an API key's variable not set: TargetError before anything is created
    refuse_client_blocks(scenario, "asyncio")  # faults.client_block_ms on a URL target: exit 2
    plan = build_plan(horizon(scenario))  # until: decided: planned for its maximum
    session = RunSession(scenario.name, opts, console)
    run_dir = session.run_dir
    sim = None
    run = Run(scenario, plan, session, console, opts)
    try:
        sim = start_embedded(scenario, run_dir) if scenario.target.embedded else None
        target = event_loop_run(run.execute(sim.base_url if sim else scenario.target.base_url, sim))
    except (TargetError, exits.Interrupted, KeyboardInterrupt):  # KeyboardInterrupt: before the loop's handlers
        session.discard_if_empty()
        raise
    except ServerFault as exc:  # the server failed a step before any load (counting the prompts): exit 2
        session.discard_if_empty()
        raise TargetError(str(exc)) from None
    except Exception:
        run.close_sink()  # a bug: the records taken so far reach the disk before the crash report
        raise
    finally:
        if sim is not None:
            sim.stop()
            if run.blocks is not None:  # the slow client's blocks into the (closed) trace: ground truth
                run.blocks.add_to_trace(sim_trace_path(scenario, run_dir))
    session.phase("writing the reports")
    result = run.summarize(target)
    print_summary(console, result, str(run_dir))
    return result


class Run:
    """One run's state on its way to the run directory: run.json, the guards, the summary (the directory, the
    record sink and its flush policy are the session's, shared with the Locust driver). A ``--workers`` process
    (run/worker_process.py) is a Run with its own engine class and a wait for the common start."""

    engine_class: type[AsyncioEngine] = AsyncioEngine
    def __init__(self, scenario: Scenario, plan: Plan, session: RunSession, console: Console, opts: RunOptions,
                 engine_name: str = "asyncio") -> None:
        self.scenario, self.plan, self.session, self.console, self.opts = scenario, plan, session, console, opts
        self.run_dir, self.sink = session.run_dir, session.sink
        self.interrupted = False
        self._engine: AsyncioEngine | None = None  # set once sending starts: a signal then stops it
        self.generator: dict[str, Any] = {}
        self.prompt_stats: dict[str, Any] | None = None  # run.json's ``prompts`` (keep_prompt_stats)
        self.findings: list[dict[str, Any]] = []  # loadgen check's signs in the records (analysis/run_findings.py)
        self.engine_name = engine_name
        self.fail_fast = FailFast(scenario.load.fail_fast_requests, self._stop_early)
        self.stopper: Callable[[str], None] | None = None  # how the driver stops early (set when sending starts)
        self.cut_short: str | None = None  # the driver's reason the plan did not run whole (Locust: a worker left)
        self.sessions_not_finished: list[int] = []  # sessions with calls not sent (analysis: not completed jobs)
        self.captures = Captures(self.run_dir, opts.capture) if opts.capture else None
        self.started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.until = DecidedWatch(scenario, session) if scenario.load.until == "decided" else None
        self.blocks = ClientBlocks.of(scenario)  # faults.client_block_ms: loadgen's loop blocked on purpose

    @property
    def disk_error(self) -> str | None:
        return self.session.disk_error

    async def execute(self, base_url: str, sim: Any) -> ResolvedTarget:
        """Preflight, prompts, the run; returns the resolved target (the records are in the sink). SIGINT and
        SIGTERM: before sending, exits.Interrupted; while sending, the engine stops (in-flight → cancelled)."""
        def on_signal() -> bool:
            self.interrupted = True
            if self._engine is None:
                return True
            self._engine.stop()
            return False
        return await interruptible(self._execute(base_url, sim), on_signal)

    async def _execute(self, base_url: str, sim: Any) -> ResolvedTarget:
        prep = Preparation(horizon(self.scenario), self.plan, base_url,
                           out_dir=self.run_dir if self.opts.progress else None)  # None: no start banner
        async with prep.open_client() as client:
            prepared = await prep.prepare(client)
            target = prepared.target
            target.sim = sim
            self._warn_tls(target)
            prompts = await self._prepare_prompts(prepared.factory)
            self.write_run_json(target, finished=False)
            self._engine = engine = self._engine_for(prepared, client, prompts)
            self.stopper = engine.stop
            self.session.phase("running")
            kernel_stamps.STATS.reset()  # this run's reads (generator.read_stamps)
            async with self.server_metrics(target), self._client_metrics(target):
                with client_blocks(self.blocks, target.notes):
                    await self._drive(engine)
        self.close_sink()
        self.note_stopped_early(target)
        st = engine.stats
        self.generator = generator_figures("asyncio", st.cpu_s, st.wall_s, read_stamps=kernel_stamps.STATS.as_dict())
        self.keep_prompt_stats(prepared.factory, target)
        self.note_cut_at_end(target, st.cut_at_end)
        if isinstance(engine.conversations, Sessions):
            self.sessions_not_finished = sorted(engine.conversations.unfinished)
            if engine.conversations.failed:
                target.notes.append(engine.conversations.note())
        return target

    def keep_prompt_stats(self, factory: PromptFactory, target: ResolvedTarget) -> None:
        """How the prompts' lengths were had (counted, the word model's estimates: docs/metrics.md) into
        run.json's ``prompts``, and one line of it into the notes."""
        self.prompt_stats = factory.stats.to_dict()
        note = factory.stats.note()
        if note:
            target.notes.append(note)

    async def before_sending(self, engine: AsyncioEngine) -> None:
        """The engine is ready, the prompts built: the moment before the first send (a hook; nothing here)."""

    def on_record(self, record: RequestRecord, chunks: list[ChunkRecord], answer: str = "") -> None:
        """Every record of the run: into the sink, then past the fail-fast guard. A fault on the way (a bug)
        still leaves the request its row: as error ``internal``, without its chunks (exit 4)."""
        try:
            self.sink.add(record, chunks)
        except Exception as exc:  # noqa: BLE001 - the record's row matters more than the bug
            self.sink.add(replace(record, error_kind="internal", error_message=(
                f"loadgen failed to record this response (a bug; please report it): {type(exc).__name__}: {exc}")),
                [])
        self.fail_fast.observe(record)

    def _stop_early(self, reason: str) -> None:
        self.console.print(f"[red]error:[/] {escape(reason)}; stopping the run", highlight=False)
        if self.stopper is not None:
            self.stopper(f"run {reason}")

    def note_stopped_early(self, target: ResolvedTarget) -> None:
        if self.fail_fast.reason:
            target.notes.append(self.fail_fast.reason)
        if self.captures is not None and self.captures.written:
            target.notes.append(f"{len(self.captures.written)} failed response(s) kept as received in "
                                f"{self.captures.dir.name}/ (--capture)")

    def note_cut_at_end(self, target: ResolvedTarget, cut: int) -> None:
        if cut:
            target.notes.append(f"{cut} request(s) still in flight {self.scenario.load.drain_timeout_s:g} s after "
                                "the last send were cancelled at the run's end (load.drain_timeout_s)")

    def _warn_tls(self, target: ResolvedTarget) -> None:
        if target.base_url.startswith("https://") and not self.scenario.target.tls.verify:
            target.notes.append("TLS certificate checks were off (target.tls.verify: false)")
            self.console.print("[yellow]warning:[/] TLS certificate checks are off (target.tls.verify: false): "
                               "anyone on the path can read the prompts and the API key", highlight=False)

    def close_sink(self) -> None:
        """Flush and merge the records (the session's ``close``: never raises; a full disk is recorded)."""
        self.session.close()

    @contextlib.asynccontextmanager
    async def server_metrics(self, target: ResolvedTarget) -> AsyncIterator[None]:
        """Scrape the target's /metrics while the block runs (server_metrics.parquet); a note if it cannot."""
        if not self.opts.server_metrics:
            yield
            return
        scraper = Scraper(target.root + "/metrics", target.headers, self.opts.server_metrics_period_s,
                          verify=ssl_context(self.scenario) or True, proxy=target.proxy,
                          power=self.scenario.target.power_metrics)  # GPU power beside /metrics (F's figures)
        stop = asyncio.Event()
        task = asyncio.create_task(scraper.run_own_client(stop))
        try:
            await scraper.started()  # its first scrape's one-time work and connection, before the first send
            yield
        finally:
            stop.set()
            await task
            self.keep_server_metrics(scraper, target)

    def keep_server_metrics(self, scraper: Scraper, target: ResolvedTarget) -> None:
        """server_metrics.parquet, and the scraper's warning (if any) as a note and on the console."""
        scraper.write(self.run_dir)
        if scraper.warning:
            target.notes.append(scraper.warning)
            self.console.print(f"[yellow]warning:[/] {scraper.warning}", highlight=False)

    @contextlib.asynccontextmanager
    async def _client_metrics(self, target: ResolvedTarget) -> AsyncIterator[None]:
        """Sample loadgen's own loop lag and CPU share while the block runs, on the engine's loop: written as
        client_metrics.parquet however the block ends (stopped, interrupted, failed), as the records are."""
        s = LoopSampler()
        task = asyncio.create_task(s.run())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its last CPU share taken
            why = write_client_metrics(self.run_dir, client_metrics_frame(s.t_ns, s.names(), s.values))
            if why is not None:
                target.notes.append(why)

    async def _prepare_prompts(self, factory: PromptFactory) -> dict[int, Prompt]:
        if self.plan.requests is None:
            return {}
        with bar(self.opts.progress) as progress:
            task = progress.add_task("preparing prompts", total=len(self.plan.requests))
            return await build_prompts(factory, self.plan.requests, progress=lambda n: progress.advance(task, n))

    def _engine_for(self, prepared: Prepared, client: httpx.AsyncClient, prompts: dict[int, Prompt]) -> AsyncioEngine:
        async def body_for(req: PlannedRequest) -> dict[str, Any]:
            return await prepared.body(req, prompts.get(req.seq))

        async def turn_for(req: PlannedRequest, history: list[tuple[str, str]]) -> tuple[dict[str, Any], str]:
            return await prepared.turn(req, history, prompts.get(req.seq) if not self.plan.closed_loop else None)

        async def call_for(req: PlannedRequest, transcript: Transcript,
                           parents: list[CallResult]) -> tuple[dict[str, Any], Transcript]:
            return await prepared.call(req, transcript, parents,
                                       prompts.get(req.seq) if not self.plan.closed_loop else None)

        return self.engine_class(prepared.engine_config(), self.plan, body_for, self.on_record, client, turn_for,
                                 capture=self.captures, call_for=call_for)

    async def _drive(self, engine: AsyncioEngine) -> None:
        with RunProgress(self.plan, self.opts.progress) as progress:
            await self.before_sending(engine)
            run_task = asyncio.create_task(engine.run())
            try:
                await self._tick(run_task, engine, progress)
            finally:  # whatever happened, the engine ends (and records what is in flight) before the client closes
                if not run_task.done():
                    engine.stop()
                await run_task

    async def _tick(self, run_task: asyncio.Task[Any], engine: AsyncioEngine, progress: RunProgress) -> None:
        while not run_task.done():
            await asyncio.wait([run_task], timeout=0.25)
            st = engine.stats
            progress.update(st)
            if self.session.flush_due() and await asyncio.to_thread(self.session.flush):
                engine.stop()  # the disk is full: the session said so and made the run inconclusive
            elapsed_s = (time.monotonic_ns() - st.t0_ns) / 1e9
            if self.until is not None and st.t0_ns and self.until.due(elapsed_s) and not engine.stopping:
                await self._check_decided(engine, elapsed_s)

    async def _check_decided(self, engine: AsyncioEngine, elapsed_s: float) -> None:
        """``load.until: decided``: every objective decided on the records so far ends the run (run/until.py)."""
        assert self.until is not None
        decided = await asyncio.to_thread(self.until.check, elapsed_s)
        if self.disk_error:
            engine.stop()  # the check's flush found the disk full
        elif decided:
            self.console.print(f"every objective decided after {elapsed_s:.1f} s: the run ends (load.until: "
                               "decided)", highlight=False)
            self.until.stop(engine)

    def progress(self) -> Progress:  # the Locust driver's count bar (run/locust_run.py)
        return bar(self.opts.progress)

    def finish(self, target: ResolvedTarget, generator: dict[str, Any],
               interrupted: bool | None = None) -> RunResult:
        """For drivers that run the plan themselves (Locust): the records are in; how the generator fared and
        whether the run was stopped early; then the summary and every report (``summarize``)."""
        self.close_sink()
        self.generator = generator
        if interrupted is not None:
            self.interrupted = interrupted
        return self.summarize(target)

    def summarize(self, target: ResolvedTarget) -> RunResult:
        """run.json (finished), then the summary and every report from the records. With a full disk: from the
        records on disk and in memory, verdict inconclusive, and whichever reports still fit."""
        if not self.disk_error:
            try:
                self.write_run_json(target, finished=True)
                result = rebuild_reports(self.run_dir, self.scenario, png=self.opts.png)
                if result.findings:  # what the records showed of the server's framing, beside the run's notes
                    self.findings = result.findings
                    self.write_run_json(target, finished=True)
                return result
            except OSError as exc:
                self.session.write_failed(exc)
        requests, chunks = self.sink.frames()
        info = self.run_info(target, finished=True)
        with contextlib.suppress(OSError):
            self.write_run_json(target, finished=True)
        return report_records(self.run_dir, info, self.scenario, requests, chunks, None, png=False)

    def _target_info(self, target: ResolvedTarget) -> dict[str, Any]:
        info: dict[str, Any] = {"base_url": "embedded" if target.sim else redact_url(target.base_url),
                                "model": target.model,
                                "continuous_usage_stats": target.continuous_usage, "tokenize": target.has_tokenize,
                                "tokenize_endpoint": target.tokenize_dialect, "engine": target.engine}
        if target.sim is not None:
            from local_target.sim import build_config

            spec = self.scenario.target.simulator
            cfg = build_config(spec.preset_name, overrides=spec.overrides())
            info["simulator"] = {"preset": spec.preset_name, **cfg.model_dump(include={
                "engine", "chunked_prefill", "max_num_batched_tokens", "max_num_seqs", "kv_cache_tokens", "time_scale",
                "max_chunk_tokens"})}
        return info

    def write_run_json(self, target: ResolvedTarget, finished: bool) -> None:
        """run.json: everything besides the records that ``loadgen report`` needs to rebuild the views."""
        write_text(self.run_dir / "run.json", json.dumps(self.run_info(target, finished), indent=2) + "\n")

    def run_info(self, target: ResolvedTarget, finished: bool) -> dict[str, Any]:
        scenario = self.scenario.model_dump(mode="json")
        scenario["target"]["headers"] = redact_headers(scenario["target"]["headers"])
        scenario["target"]["base_url"] = redact_url(scenario["target"]["base_url"])
        masked = masked_fields(self.scenario.model_dump(mode="json"), scenario, self.scenario.env_refs)
        info = {"loadgen_version": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
                "host": socket.gethostname(), "seed": self.scenario.seed, "engine": self.engine_name,
                "target": self._target_info(target),
                "notes": target.notes, "started_at": self.started_at, "finished": finished,
                "interrupted": self.interrupted, "disk_error": self.disk_error, "planned": self.plan.size,
                "stopped_early": self.fail_fast.reason or self.cut_short, "findings": self.findings,
                "generator": self.generator, "sessions_not_finished": self.sessions_not_finished,
                "prompts": self.prompt_stats,
                "scenario": scenario, "masked": masked}
        if self.until is not None:
            info.update(self.until.info(finished, self.interrupted))
        return info


__all__ = ["Run", "RunOptions", "run_scenario", "rebuild_reports", "TargetError"]
