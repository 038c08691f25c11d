"""Proxies from the environment (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY): a run measures the route the user
configured, or refuses to start. Through a forward proxy on 127.0.0.1 (tests/proxy_server.py) that logs every
request line: an https target through a CONNECT tunnel, an http target in absolute form; the generation
requests, the preflight and the /metrics scrapes all take the proxy; NO_PROXY and the embedded simulator go
direct; a refused tunnel or a proxy URL loadgen cannot use is exit 2 naming the variable before any load; a proxy
password is never shown. The target (a ShapeServer) logs each request's peer port, so that "through the proxy"
is checked on the target's side too, where the proxy cannot see inside the tunnel."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pytest
import trustme

from loadgen import api
from tests.proxy_server import ProxyServer
from tests.run_helpers import ROOT
from tests.shape_server import ShapeServer, _write
from tests.test_preflight_shapes import assert_no_piece, one_line_exit_2

PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
REQUESTS, OUTPUT_TOKENS = 4, 6
SCENARIO = f"""\
name: proxied
target: {{base_url: embedded, ttft_timeout_s: 10}}
load: {{arrival: constant, rate_per_s: 20, requests: {REQUESTS}, duration_s: 5, drain_timeout_s: 5}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: fixed, value: {OUTPUT_TOKENS}}}}}]
"""
METRICS = b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"


class TracedShapeServer(ShapeServer):
    """The shape server, over TLS when given a context, with a vLLM ``/metrics``; ``seen`` holds each request's
    path and the port it came from."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(tls)
        self.seen: list[tuple[str, int]] = []

    async def _route(self, writer: asyncio.StreamWriter, shape: str, path: str, *args: Any) -> bool:
        self.seen.append((path, writer.get_extra_info("peername")[1]))
        if path == "/metrics":
            return _write(writer, b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
                          % (len(METRICS), METRICS))
        return await super()._route(writer, shape, path, *args)

    def paths(self) -> set[str]:
        return {path for path, _ in self.seen}


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pki") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
def http_target() -> Iterator[TracedShapeServer]:
    with TracedShapeServer() as srv:
        yield srv


@pytest.fixture
def https_target(ca: trustme.CA) -> Iterator[TracedShapeServer]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    with TracedShapeServer(ctx) as srv:
        yield srv


@pytest.fixture
def proxy() -> Iterator[ProxyServer]:
    with ProxyServer() as srv:
        yield srv


@pytest.fixture
def no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process's environment without any proxy variable (the machine running the tests may set some)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    return monkeypatch


def scenario_file(tmp_path: Path, target: TracedShapeServer, ca_file: Path) -> Path:
    path = tmp_path / "proxied.yaml"
    tls = f", tls: {{ca_bundle: '{ca_file}'}}" if target.ssl_context else ""
    path.write_text(SCENARIO.replace("{base_url: embedded", f"{{base_url: '{target.url('ok')}'{tls}"))
    return path


def run_in_process(tmp_path: Path, target: TracedShapeServer, ca_file: Path) -> Any:
    sc = api.load_scenario(scenario_file(tmp_path, target, ca_file))
    return api.run(sc, out=tmp_path / "run", server_metrics_period_s=0.05)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``loadgen ARGS`` with exactly the proxy variables in ``env`` (none of this process's)."""
    clean = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARIABLES}
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**clean, **env, "COLUMNS": "200"}, timeout=120)


def assert_exact_records(run_dir: Path, target: TracedShapeServer) -> None:
    """Every request completed with its tokens counted right, each record matching a response the target sent."""
    requests = pl.read_parquet(run_dir / "requests.parquet")
    assert requests.height == REQUESTS and requests["error_kind"].null_count() == REQUESTS, requests
    assert requests["output_tokens"].to_list() == [OUTPUT_TOKENS] * REQUESTS
    assert sorted(requests["request_id"].to_list()) == sorted(e["id"] for e in target.generation("ok"))


def assert_all_through(proxy: ProxyServer, target: TracedShapeServer) -> None:
    """The generation requests, the preflight's and the /metrics scrapes reached the target from the proxy."""
    assert {"/v1/models", "/v1/chat/completions", "/metrics"} <= target.paths()
    assert [s for s in target.seen if s[1] not in proxy.upstream_ports] == []


def test_https_target_goes_through_a_CONNECT_tunnel(no_proxy_env, proxy, https_target, ca_file, tmp_path):
    no_proxy_env.setenv("HTTPS_PROXY", proxy.url())
    result = run_in_process(tmp_path, https_target, ca_file)
    assert result.exit_code == 0, result.reasons
    assert proxy.log and set(proxy.log) == {f"CONNECT 127.0.0.1:{https_target.port} HTTP/1.1"}
    assert_all_through(proxy, https_target)
    assert_exact_records(tmp_path / "run", https_target)
    assert pl.read_parquet(tmp_path / "run" / "server_metrics.parquet").height > 0
    assert f"requests went through the proxy {proxy.url()} (HTTPS_PROXY); the figures include it" in result.notes


def test_http_target_goes_to_the_proxy_in_absolute_form(no_proxy_env, proxy, http_target, ca_file, tmp_path):
    no_proxy_env.setenv("HTTP_PROXY", proxy.url())
    no_proxy_env.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # for https only: never used here
    result = run_in_process(tmp_path, http_target, ca_file)
    assert result.exit_code == 0, result.reasons
    origin = f"http://127.0.0.1:{http_target.port}/ok"
    generations = [line for line in proxy.log if line == f"POST {origin}/v1/chat/completions HTTP/1.1"]
    posts = [path for path, _ in http_target.seen if path == "/v1/chat/completions"]
    assert len(generations) == len(posts) > REQUESTS  # the preflight's one-token probe, then the run's
    assert {f"GET {origin}/v1/models HTTP/1.1", f"GET {origin}/metrics HTTP/1.1"} <= set(proxy.log)
    assert all(line.split(" ")[1].startswith(origin + "/") for line in proxy.log), proxy.log
    assert_all_through(proxy, http_target)
    assert_exact_records(tmp_path / "run", http_target)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_NO_PROXY_sends_direct(no_proxy_env, proxy, http_target, https_target, ca_file, tmp_path, scheme):
    target = https_target if scheme == "https" else http_target
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        no_proxy_env.setenv(name, proxy.url())
    no_proxy_env.setenv("NO_PROXY", "127.0.0.1")
    result = run_in_process(tmp_path, target, ca_file)
    assert result.exit_code == 0, result.reasons
    assert proxy.log == [] and {"/v1/models", "/v1/chat/completions", "/metrics"} <= target.paths()
    assert_exact_records(tmp_path / "run", target)
    assert not [n for n in result.notes if "proxy" in n]


def test_the_embedded_simulator_is_never_proxied(no_proxy_env, proxy, tmp_path):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        no_proxy_env.setenv(name, proxy.url())
    (tmp_path / "embedded.yaml").write_text(SCENARIO)
    result = api.run(api.load_scenario(tmp_path / "embedded.yaml"), out=tmp_path / "run")
    assert result.requests["completed"] == REQUESTS and proxy.log == []


def test_a_proxy_refusing_CONNECT_is_exit_2_naming_it_before_any_load(https_target, ca_file, tmp_path):
    with ProxyServer(refuse_connect=True) as refusing:
        res = cli("run", str(scenario_file(tmp_path, https_target, ca_file)), "--out", str(tmp_path / "r"),
                  "--no-progress", env={"HTTPS_PROXY": refusing.url()})
        line = one_line_exit_2(res)
        assert refusing.log == [f"CONNECT 127.0.0.1:{https_target.port} HTTP/1.1"]
    assert f"the proxy {refusing.url()} (HTTPS_PROXY) refused CONNECT 127.0.0.1:{https_target.port}" in line
    assert "403" in line and https_target.seen == [] and not (tmp_path / "r").exists()


@pytest.mark.parametrize("variable,value", [("HTTPS_PROXY", "socks5://127.0.0.1:1080"),
                                            ("ALL_PROXY", "socks5h://127.0.0.1:1080"),
                                            ("HTTPS_PROXY", "https://127.0.0.1:3128")])
def test_a_proxy_scheme_loadgen_cannot_use_is_exit_2_naming_the_variable(https_target, ca_file, tmp_path,
                                                                        variable, value):
    res = cli("run", str(scenario_file(tmp_path, https_target, ca_file)), "--out", str(tmp_path / "r"),
              "--no-progress", env={variable: value})
    line = one_line_exit_2(res)
    scheme = value.split(":")[0]
    assert line.startswith(f"error: {variable}: a {scheme}:// proxy is not supported"), line
    assert https_target.seen == [] and not (tmp_path / "r").exists()


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_proxy_password_is_sent_to_the_proxy_and_shown_nowhere(http_target, https_target, ca_file, tmp_path,
                                                                 scheme):
    """In the Proxy-Authorization of each tunnel (https) or request (http), never inside the tunnel to the target;
    in no output, file or record."""
    target = https_target if scheme == "https" else http_target
    password = "pr0xy-" + base64.b32encode(os.urandom(15)).decode()
    with ProxyServer(credentials=f"alice:{password}") as guarded:
        out = tmp_path / "run"
        res = cli("run", str(scenario_file(tmp_path, target, ca_file)), "--out", str(out), "--no-progress",
                  "--no-png", "--capture", "2", env={f"{scheme.upper()}_PROXY": guarded.url(f"alice:{password}@")})
        assert res.returncode == 0, res.stdout + res.stderr
        assert set(guarded.authorizations) == {guarded.expected} and len(guarded.log) > 1
    basic = base64.b64encode(f"alice:{password}".encode()).decode()
    for secret in (password, basic):
        assert_no_piece(secret, res.stdout + res.stderr, out)
    assert_exact_records(out, target)
    assert not [h for e in target.generation() for h in e["headers"] if h.lower().startswith("proxy-")]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_proxy_that_cannot_be_reached_is_exit_2_naming_it(http_target, https_target, ca_file, tmp_path, scheme):
    """Not "cannot reach the target: connection refused" when the target is up and the proxy is what is down."""
    target = https_target if scheme == "https" else http_target
    with socket.socket() as closed:  # bound, not listening: connections to it are refused
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
        res = cli("run", str(scenario_file(tmp_path, target, ca_file)), "--out", str(tmp_path / "r"),
                  "--no-progress", env={f"{scheme.upper()}_PROXY": dead})
    line = one_line_exit_2(res)
    assert f"cannot connect to the proxy {dead} ({scheme.upper()}_PROXY)" in line, line
    assert target.seen == [] and not (tmp_path / "r").exists()


def test_a_wrong_proxy_password_is_exit_2_without_showing_it(https_target, ca_file, tmp_path):
    password = "wr0ng-" + base64.b32encode(os.urandom(15)).decode()
    with ProxyServer(credentials="alice:right") as guarded:
        res = cli("run", str(scenario_file(tmp_path, https_target, ca_file)), "--out", str(tmp_path / "r"),
                  "--no-progress", env={"HTTPS_PROXY": guarded.url(f"alice:{password}@")})
    line = one_line_exit_2(res)
    assert "(HTTPS_PROXY) refused CONNECT" in line and "407" in line, line
    assert_no_piece(password, res.stdout + res.stderr, tmp_path)


def test_check_goes_through_the_same_CONNECT_tunnel_and_says_so(no_proxy_env, proxy, https_target, ca_file):
    """loadgen check reaches the target as a run does: through the environment's proxy, named in its notes."""
    no_proxy_env.setenv("HTTPS_PROXY", proxy.url())
    sc = api.load_scenario(ROOT / "scenarios/smoke.yaml", {"target.base_url": https_target.url("ok"),
                                                             "target.tls": {"ca_bundle": str(ca_file)}})
    result = api.check(sc)
    assert proxy.log and set(proxy.log) == {f"CONNECT 127.0.0.1:{https_target.port} HTTP/1.1"}
    assert [s for s in https_target.seen if s[1] not in proxy.upstream_ports] == []
    assert f"requests went through the proxy {proxy.url()} (HTTPS_PROXY); the figures include it" in result.notes
