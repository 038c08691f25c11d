"""``loadgen ui``: Locust's web UI with the LLM tab (report/llm_tab.py), each Start in the browser one run.

Import this module before anything imports ``ssl`` or ``socket`` users: through ``drivers/locust_user.py`` it
monkey-patches the process for gevent.
"""

from __future__ import annotations

from loadgen.drivers import locust_user as lu  # first: Locust monkey-patches the process on import

import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from rich.console import Console  # noqa: E402

from loadgen.core.secrets import redact_url  # noqa: E402
from loadgen.drivers.scrape import Scraper  # noqa: E402
from loadgen.drivers.locust_messages import DONE_MESSAGE, RECORDS_MESSAGE, unpack  # noqa: E402
from loadgen.plan.scenario import Scenario  # noqa: E402
from loadgen.plan.schedule import build_plan  # noqa: E402
from loadgen.run.client_faults import refuse_client_blocks  # noqa: E402
from loadgen.run.until import refuse_engine  # noqa: E402
from loadgen.report.console import print_summary  # noqa: E402
from loadgen.report import llm_tab  # noqa: E402
from loadgen.report.llm_tab import LLM_TAB, LLM_TABLE, live_rows, live_series, result_rows  # noqa: E402
from loadgen.run import exits  # noqa: E402
from loadgen.run.locust_run import (quiet_own_spawn_rate, send_slices, start_scraper, users_for,  # noqa: E402
                                    workers_left)
from loadgen.run.prepare import Preparation  # noqa: E402
from loadgen.run.runner import Run, RunOptions  # noqa: E402
from loadgen.run.session import RunSession, generator_figures  # noqa: E402
from loadgen.run.target import auth_headers, start_embedded  # noqa: E402

LIVE_EVERY_S = 2.0


class PlannedUsers(lu.LoadTestShape):  # type: ignore[misc, name-defined]
    """An open-loop run's users in the web UI: loadgen's count, all at once (the plan sets the pace); with a
    shape class, Locust's start form disables its users and ramp-up fields (the LLM panel hides them)."""

    def __init__(self, users: Any) -> None:
        super().__init__()
        self.users = users

    def tick(self) -> tuple[int, float]:
        return self.users(), max(self.users() * 100.0, 1.0)


class UiSession:
    """``loadgen ui``: each Start in the browser is one run (its own run directory); Stop, or the end of the
    plan, writes the same files and verdict as ``loadgen run``."""

    def __init__(self, scenario: Scenario, opts: RunOptions, console: Console, host: str, port: int,
                 web_login: bool, master: bool, master_bind: tuple[str, int]) -> None:
        self.scenario, self.opts, self.console = scenario, opts, console
        refuse_engine(scenario, "locust (the web UI)")  # load.until: decided is the asyncio engine's
        refuse_client_blocks(scenario, "locust")  # its users are not on the asyncio loop
        self.plan = build_plan(scenario)
        self.master, (self.master_host, self.master_port) = master, master_bind
        auth_headers(scenario)
        self.sim = start_embedded(scenario, None) if scenario.target.embedded else None
        self.base_url = self.sim.base_url if self.sim else scenario.target.base_url
        self.run: Run | None = None
        self.scraper: Scraper | None = None
        self.clients: list[str] = []
        self.done_workers: set[str] = set()
        self.live: list[Any] = []
        self.live_rows: list[dict[str, Any]] = []
        self.series: list[dict[str, Any]] = []
        self.final: Any = None  # the last run's RunResult, once written
        self.run_dir: Any = None  # the current or last run's directory
        self.stopped_by: str | None = None  # the signal that ended `loadgen ui`
        self.final_pending = False  # stopped from the page: its last poll must carry the run's final rows
        self.state = lu.ProcessState(scenario, Preparation(scenario, self.plan, self.base_url), on_record=self._on_record)
        self.target = self.state.engine.wait_ready(lu.sleep)
        self.target.sim = self.sim
        self.env = self._environment(host, port, web_login)

    def _environment(self, host: str, port: int, web_login: bool) -> Any:
        sys.argv = sys.argv[:1]  # Locust's web UI re-parses the command line as its own: loadgen's is done
        n = users_for(self.scenario)  # the start form's defaults
        options = lu.web_ui_options(num_users=n, spawn_rate=max(n, 1), host=self.base_url)
        shape = None
        if not self.scenario.load.concurrency:  # open loop: the users are loadgen's; the form hides its fields
            shape = PlannedUsers(lambda: n * max(1, self.env.runner.worker_count) if self.master else n)
            quiet_own_spawn_rate()  # they start all at once, as in `loadgen run --engine locust`
        env = lu.new_environment(parsed_options=options, host=self.base_url, shape_class=shape)
        lu.LLMUser.state = self.state
        if self.master:
            runner = env.create_master_runner(master_bind_host=self.master_host,
                                                master_bind_port=self.master_port)
            runner.register_message(RECORDS_MESSAGE, lambda msg, **_: [self._on_record(r, c)
                                                                          for r, c in unpack(msg.data)])
            runner.register_message(DONE_MESSAGE, lambda msg, **_: self.done_workers.add(msg.node_id))
        else:
            env.create_local_runner()
        web = env.create_web_ui(host, port, web_login=web_login, delayed_start=True)
        web.template_args["extended_tabs"] = [LLM_TAB]
        web.template_args["extended_tables"] = [LLM_TABLE]
        web.app.after_request(self._with_llm_stats)
        self._routes(web)
        env.events.test_start.add_listener(lambda **_: self._start())
        env.events.test_stopping.add_listener(lambda **_: setattr(self, "final_pending", self.run is not None))
        env.events.test_stop.add_listener(lambda **_: self._stop())
        web.start()
        return env

    def serve(self) -> None:
        self.console.print(f"Locust web UI with the LLM tab: http://{self.env.web_ui.host or '127.0.0.1'}:"
                           f"{self.env.web_ui.port}  (Ctrl-C to quit)", highlight=False)
        if self.master:
            self.console.print(f"workers: loadgen worker SCENARIO --master-host THIS_HOST --master-port "
                               f"{self.master_port} --base-url {redact_url(self.base_url)}  (the master listens "
                               f"on {self.master_host}:{self.master_port})", highlight=False)
        lu.spawn(self._refresh_live)
        lu.on_signals(self._quit)  # `kill PID` or Ctrl-C: the run written, the simulator stopped, one line, exit 3
        try:
            self.env.runner.greenlet.join()
        finally:
            if self.run is not None:
                self._stop()
            self.env.runner.quit()
            self.state.close()
            if self.sim is not None:
                self.sim.stop()
        if self.stopped_by is not None:
            print(f"stopped ({self.stopped_by})", file=sys.stderr, flush=True)
            raise SystemExit(exits.INCONCLUSIVE)  # as an interrupted `loadgen run`

    def _quit(self, signal_name: str) -> None:
        self.stopped_by = signal_name
        self.env.runner.quit()

    def _start(self) -> None:
        self.run = Run(self.scenario, self.plan, RunSession(self.scenario.name, self.opts, self.console),
                       self.console, self.opts, engine_name="locust")
        self.run.write_run_json(self.target, finished=False)
        self.live, self.live_rows, self.series, self.final = [], [], [], None
        self.run_dir = self.run.run_dir
        self.state.reset()
        self.scraper = start_scraper(self.state, self.target, self.opts)
        if self.master:
            self.done_workers = set()
            self.clients = send_slices(self.env.runner)
        else:
            self.state.set_slice(0, 1, time.monotonic_ns() + int(0.2e9))
        lu.spawn(self._stop_at_end)

    def _finished(self) -> bool:
        if not self.master:
            return self.state.finished
        return workers_left(self.env.runner, self.clients, self.done_workers)[0]

    def _stop_at_end(self) -> None:
        run = self.run
        while self.run is run and run is not None and not self._finished():
            lu.sleep(0.2)
        if self.run is run and run is not None:
            self._stop()  # the final rows are set while the runner still runs: Locust's page polls them once more
            lu.sleep(LIVE_EVERY_S + 1.0)  # (it stops polling when the runner says stopped)
            if self.run is None:
                self.env.runner.stop()

    def _stop(self) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        self.state.engine.cancel_in_flight()
        deadline = time.monotonic() + 5
        while self.state.in_flight > 0 and time.monotonic() < deadline:
            lu.sleep(0.05)
        interrupted = not (self._finished() if self.master else self.state.exhausted)
        if self.scraper is not None:
            self.state.engine.stop_scraper(lu.sleep)
            run.keep_server_metrics(self.scraper, self.target)
            self.scraper = None
        result = run.finish(self.target, generator_figures("locust", workers=0), interrupted)
        self.final, self.live_rows = result, result_rows(result, final=True)  # the tab's last state is the run's
        self.series = lu.in_thread(live_series, list(self.live))
        print_summary(self.console, result, str(run.run_dir))

    def _on_record(self, record: Any, chunks: Any) -> None:
        if self.run is not None:
            self.run.sink.add(record, chunks)
            self.live.append((record, chunks))

    def _refresh_live(self) -> None:
        while True:
            lu.sleep(LIVE_EVERY_S)
            run = self.run
            if run is not None and self.live:  # on a native thread: the hub keeps handing requests meanwhile
                records = list(self.live)
                rows = lu.in_thread(live_rows, self.scenario, records, self.plan.size)
                series = lu.in_thread(live_series, records)
                if self.run is run:  # not ended meanwhile: the final rows are the run's, never overwritten
                    self.live_rows, self.series = rows, series

    def _with_llm_stats(self, response: Any) -> Any:
        from flask import request

        if request.path.endswith("/stats/requests") and response.is_json:
            data = response.get_json()
            data["extended_stats"] = [{"key": "llm", "data": self.live_rows}]
            if self.final_pending and self.final is None:  # Stop pressed, the run still being written: the
                data["state"] = "running"  # page polls only a running swarm; its next poll has the final rows
            elif self.final is not None:
                self.final_pending = False
            response.set_data(json.dumps(data))
        elif request.path == "/" and response.mimetype == "text/html" and not response.direct_passthrough:
            page = response.get_data(as_text=True)  # Locust's page: the LLM tab's panel goes under its table
            response.set_data(page.replace("</body>", '<script src="llm/vega.js"></script>'
                                           '<script src="llm/panel.js"></script></body>', 1))
        return response

    def _routes(self, web: Any) -> None:
        """The LLM tab's page side (report/llm_tab.py's script, injected into Locust's page), its state as JSON,
        the Vega bundle report.html inlines (no CDN: the page works offline) and the last run's report.html."""
        from flask import Response, abort, jsonify, send_file

        from loadgen.report.html import vega_bundle

        def state() -> Any:
            counts = (self.final.requests if self.final is not None else None)
            completed = counts["completed"] if counts else sum(1 for r, _ in self.live if not r.error_kind)
            verdict = (self.final.verdict.upper() if self.final is not None
                       else "running" if self.run is not None else "not started")
            report = self.run_dir is not None and (self.run_dir / "report.html").exists()
            return jsonify({"verdict": verdict, "completed": completed, "planned": self.plan.size,
                            "run_dir": str(self.run_dir) if self.run_dir else None,
                            "report": "llm/report.html" if report else None, "series": self.series,
                            "load": llm_tab.load_note(self.scenario, users_for(self.scenario)),
                            "open_loop": not self.scenario.load.concurrency,
                            "spec": llm_tab.chart_spec()})

        def report() -> Any:
            if self.run_dir is None or not (self.run_dir / "report.html").exists():
                abort(404)
            return send_file(self.run_dir / "report.html", mimetype="text/html")

        routes = {"/llm/state.json": state, "/llm/report.html": report,
                  "/llm/panel.js": lambda: Response(llm_tab.PANEL_JS, mimetype="application/javascript"),
                  "/llm/vega.js": lambda: Response(vega_bundle(), mimetype="application/javascript")}
        for path, view in routes.items():
            web.app.add_url_rule(path, path, web.auth_required_if_enabled(view))
