"""What gateways and proxies send, and what the transport does with it (issue 50): bytes past a response's
Content-Length close its connection instead of failing the next request on it (RFC 9112 §9.6, §11.2); a base
URL or proxy URL with port 0 is refused before anything is sent; a transfer coding loadgen did not ask for is
named (RFC 9112 §7); a run through a proxy opens its connections before its first send, as a direct run does.

Each server is the tests' own, on 127.0.0.1 (tests/shape_server.py, tests/proxy_server.py)."""

from __future__ import annotations

import asyncio
import json
import ssl
from pathlib import Path
from typing import Any, Iterator

import httpx
import polars as pl
import pytest
import trustme

from loadgen import api
from loadgen.drivers.asyncio_engine import AsyncioEngine
from loadgen.drivers.lean_transport import LeanTransport
from loadgen.errors import TargetError
from tests.proxy_server import ProxyServer
from tests.run_helpers import run_cli
from tests.shape_server import SSE_HEAD, ShapeServer, _head, _write, chunk, event, tail
from tests.test_preflight_shapes import one_line_exit_2
from tests.test_proxy import ca, ca_file  # noqa: F401 (fixtures: one throwaway CA for the https cases)

REQUESTS = 12
SCENARIO = f"""\
name: gateway
target: {{base_url: embedded, ttft_timeout_s: 10, idle_timeout_s: 2}}
load: {{arrival: constant, rate_per_s: 20, requests: {REQUESTS}, duration_s: 5, drain_timeout_s: 5}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: fixed, value: 4}}}}]
"""
CJK_MESSAGE = "配额已用尽，请稍后再试。请求过多。"  # 3 UTF-8 bytes a character


class GatewayServer(ShapeServer):
    """The shape server with the gateways' shapes of this file:

    | shape | the generation answer |
    | --- | --- |
    | ``cjk-error`` | every other request (the 1st, 3rd, ...): 429 with a JSON error whose Content-Length counts
      characters, not UTF-8 bytes (the rest of the body follows it on the connection); the others: ``ok`` |
    | ``gzip-chunked`` | ``Transfer-Encoding: gzip, chunked`` (a transfer coding loadgen never asked for) |

    ``/metrics`` answers vLLM's series; ``paths`` holds each request's path.
    """

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        super().__init__(ssl_context)
        self.paths: list[str] = []

    async def _route(self, writer: asyncio.StreamWriter, shape: str, path: str, *args: Any) -> bool:
        self.paths.append(path)
        if path == "/metrics":  # vLLM's, so that a run keeps scraping it
            text = b"vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
            return _write(writer, _head(200, {"content-type": "text/plain", "content-length": str(len(text))}) + text)
        return await super()._route(writer, shape, path, *args)

    async def _cjk_error(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        if len(self.generation("cjk-error")) % 2 == 0:
            return await self._ok(writer, e)
        text = json.dumps({"error": {"message": CJK_MESSAGE, "type": "rate_limit"}}, ensure_ascii=False)
        head = _head(429, {"content-type": "application/json", "content-length": str(len(text))})
        return _write(writer, head + text.encode())  # len(text) characters: fewer than its bytes

    async def _gzip_chunked(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        import zlib

        z = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        head = SSE_HEAD.replace(b"transfer-encoding: chunked", b"transfer-encoding: gzip, chunked")
        body = event({"id": e["id"], "choices": [{"index": 0, "delta": {"content": " t"}}]}) + tail(e["id"], 1)
        return _write(writer, head + chunk(z.compress(body) + z.flush()) + chunk(b""))


@pytest.fixture
def gateway() -> Iterator[GatewayServer]:
    with GatewayServer() as srv:
        yield srv


@pytest.fixture
def tls_gateway(ca: trustme.CA) -> Iterator[GatewayServer]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    with GatewayServer(ctx) as srv:
        yield srv


def scenario_file(tmp_path: Path, base_url: str, ca_file: Path | None = None) -> Path:
    path = tmp_path / "gateway.yaml"
    tls = f", tls: {{ca_bundle: '{ca_file}'}}" if ca_file is not None else ""
    path.write_text(SCENARIO.replace("{base_url: embedded", f"{{base_url: '{base_url}'{tls}"))
    return path


def gateway_run(tmp_path: Path, base_url: str, ca_file: Path | None = None) -> tuple[Any, pl.DataFrame]:
    result = api.run(api.load_scenario(scenario_file(tmp_path, base_url, ca_file)), out=tmp_path / "run",
                     server_metrics=False)
    return result, pl.read_parquet(tmp_path / "run" / "requests.parquet")


# ---- 1: bytes past a response's Content-Length ------------------------------------------------------------
@pytest.mark.parametrize("scheme,stamps", [("http", True), ("http", False), ("https", True)],
                         ids=["kernel-stamped", "asyncio-transport", "https-stamped"])
def test_bytes_past_a_content_length_close_the_connection_not_fail_the_next_request(
        gateway, tls_gateway, ca_file, tmp_path, monkeypatch, scheme, stamps):
    """A gateway's CJK error counted in characters leaves bytes on the kept-alive connection: that response is the
    error it is (429), and the next request, a healthy stream, completes on a fresh connection (RFC 9112 §9.6,
    §11.2). On every read path: kernel-stamped reads, asyncio's transports, TLS."""
    monkeypatch.setattr("loadgen.drivers.lean_transport.kernel_stamps_supported", lambda: stamps)
    server = tls_gateway if scheme == "https" else gateway
    result, requests = gateway_run(tmp_path, server.url("cjk-error"), ca_file if scheme == "https" else None)
    received = server.generation("cjk-error")
    assert requests.height == len(received) == REQUESTS
    good = {e["id"] for i, e in enumerate(received) if i % 2 == 1}  # the 2nd, 4th, ...: streams
    completed = requests.filter(pl.col("error_kind").is_null())
    assert sorted(completed["request_id"].to_list()) == sorted(good), requests.select("error_kind", "error_message")
    assert set(completed["output_tokens"]) == {4}
    failed = requests.filter(pl.col("error_kind").is_not_null())
    assert failed.height == REQUESTS // 2 and set(failed["error_kind"]) == {"http_429"}
    assert set(failed["http_status"]) == {429}
    assert result.requests["completed"] == REQUESTS // 2


# ---- 2: port 0 ----------------------------------------------------------------------------------------------
PORT_RULE = "the port must be a number from 1 to 65535"


def test_a_base_url_with_port_0_is_exit_2_naming_the_port_before_anything_is_sent(tmp_path):
    """Port 0 asks the OS for any port: no server listens there, and it is not the default port 80."""
    res = run_cli("run", str(scenario_file(tmp_path, "embedded")), "--base-url", "http://127.0.0.1:0/v1",
                  "--out", str(tmp_path / "r"), "--no-progress", timeout=120)
    line = one_line_exit_2(res)
    assert line.startswith("error: --base-url: target.base_url") and PORT_RULE in line, line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("url", ["http://127.0.0.1:0/v1", "https://gw.example:00/v1"])
def test_a_scenario_or_api_base_url_with_port_0_is_a_scenario_error(tmp_path, url):
    with pytest.raises(api.ScenarioError, match=f"target.base_url.*{PORT_RULE}"):
        api.load_scenario(scenario_file(tmp_path, url))
    with pytest.raises(api.ScenarioError, match=PORT_RULE):
        api.run(api.load_scenario(scenario_file(tmp_path, "embedded")), base_url=url, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "ALL_PROXY"])
def test_a_proxy_url_with_port_0_is_refused_naming_its_variable(gateway, tmp_path, monkeypatch, variable):
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv(variable, "http://127.0.0.1:0")
    with pytest.raises(TargetError, match=f"^{variable}: the proxy's port is not a number from 1 to 65535$"):
        gateway_run(tmp_path, gateway.url("ok"))
    assert gateway.paths == [] and not (tmp_path / "run").exists()


# ---- 3: a transfer coding loadgen did not ask for ---------------------------------------------------------
UNASKED = ("server used transfer coding 'gzip' that loadgen did not ask for (RFC 9112 §7: it sends no TE, so "
           "chunked is the only transfer coding a server may use)")


def test_a_transfer_coding_other_than_chunked_is_named_not_parsed_as_events(gateway, tmp_path):
    """``Transfer-Encoding: gzip, chunked``: each request fails naming the coding, none of its bytes read as events
    (they were "ended mid-event" before)."""
    result, requests = gateway_run(tmp_path, gateway.url("gzip-chunked"))
    assert requests.height == len(gateway.generation("gzip-chunked")) > 0  # (a run failing whole may stop early)
    assert set(requests["error_kind"]) == {"protocol"} and set(requests["error_message"]) == {UNASKED}
    assert set(requests["chunks"]) == {0} and set(requests["http_status"]) == {200}
    assert result.exit_code == 1


def test_check_names_the_transfer_coding_in_its_streaming_finding(gateway):
    sc = api.load_scenario("smoke", {"target.base_url": gateway.url("gzip-chunked")})
    streaming = next(f for f in api.check(sc).findings if f.name == "streaming")
    assert streaming.status == "fail" and streaming.summary.endswith(UNASKED), streaming.summary


# ---- 4: a run through a proxy sends on time ---------------------------------------------------------------
@pytest.mark.parametrize("through_proxy", [True, False], ids=["HTTP_PROXY", "direct"])
def test_the_first_scrape_and_every_connection_are_ready_before_the_first_send(gateway, tmp_path, monkeypatch,
                                                                               through_proxy):
    """The first request through HTTP_PROXY went out 66 ms late: the /metrics scraper's first scrape (its client's
    SSL context, httpcore's first-use imports, its connection to the proxy) ran on the run's loop as the first
    sends fell due. It is over before the engine starts, and no request opens a connection on its send path."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    events: list[str] = []

    class Recorded(httpx.AsyncClient):
        async def get(self, url: Any, **kwargs: Any) -> httpx.Response:
            resp = await super().get(url, **kwargs)
            if str(url).endswith("/metrics"):
                events.append("metrics answered")
            return resp

    engine_run = AsyncioEngine.run

    async def run(self: AsyncioEngine) -> Any:
        events.append("engine started")
        return await engine_run(self)

    monkeypatch.setattr(httpx, "AsyncClient", Recorded)
    monkeypatch.setattr(AsyncioEngine, "run", run)
    with ProxyServer() as proxy:
        if through_proxy:
            monkeypatch.setenv("HTTP_PROXY", proxy.url())
        api.run(api.load_scenario(scenario_file(tmp_path, gateway.url("ok"))), out=tmp_path / "run",
                server_metrics_period_s=0.05)
        assert (f"GET {gateway.url('ok').removesuffix('/v1')}/metrics HTTP/1.1" in proxy.log) == through_proxy
    assert events[:2] == ["metrics answered", "engine started"], events
    requests = pl.read_parquet(tmp_path / "run" / "requests.parquet")
    assert requests.height == REQUESTS and requests["error_kind"].null_count() == REQUESTS
    assert set(requests["connect_ns"]) == {0}  # each went out on a connection opened before its send


def test_the_transport_never_reads_port_0_as_the_default_port():
    """A URL that reaches the transport another way (a redirect's Location) with port 0: refused, not sent to 80."""
    async def get() -> None:
        async with httpx.AsyncClient(transport=LeanTransport(use_proxy_env=False)) as client:
            await client.get("http://127.0.0.1:0/v1/models")

    with pytest.raises(httpx.ConnectError, match="^127.0.0.1:0: port 0 is no server's port; give one from 1 to 65535$"):
        asyncio.run(get())
