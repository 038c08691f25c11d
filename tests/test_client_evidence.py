"""The raw evidence the SLO-miss ledger needs for the network and client causes (issue 39): what the lean
transport measures of each request — how long its connection took to open (TCP, TLS handshake; 0 on a pooled
one) and when its response head came (RFC 9112 §2.1) — and loadgen's own loop lag and CPU share, sampled while
a run goes and written as client_metrics.parquet, also when the run fails part-way."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path
from typing import Any, Iterator, cast

import httpx
import polars as pl
import pytest
import trustme

from loadgen import api
from loadgen.drivers.lean_transport import CONTEXT_KEY, LeanTransport, StreamContext
from loadgen.drivers.loop_sampler import LoopSampler
from loadgen.records.client_metrics import FILE, SCHEMA, client_metrics_frame, read_client_metrics, write_client_metrics
from loadgen.records.scan import load_records
from loadgen.records.schema import CHUNK_SCHEMA, REQUEST_SCHEMA
from loadgen.run.runner import Run
from tests.conftest import scenario_file
from tests.shape_server import ShapeServer
from tests.test_lean_transport import _against_idle_closer

BODY = b'{"model": "m", "max_tokens": 4, "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
HOG_S = 0.3


def hog() -> tuple[int, int, int]:
    """Block the calling loop for HOG_S (the test's own injected CPU hog); its start and end (monotonic ns) and
    the process CPU time it took (ns: less than HOG_S on a busy machine)."""
    start, cpu = time.monotonic_ns(), time.process_time_ns()
    while time.monotonic_ns() - start < HOG_S * 1e9:
        pass
    return start, time.monotonic_ns(), time.process_time_ns() - cpu


async def _posts(lean: LeanTransport, url: str, n: int, fresh: bool) -> list[tuple[StreamContext, list[int]]]:
    """``n`` streamed POSTs one after another; each one's context and its reads' arrival stamps."""
    out = []
    prepared = lean.prepare_post(url, {"content-type": "application/json"})
    for _ in range(n):
        reads: list[int] = []
        ctx = StreamContext(feed=lambda _data, t_ns, reads=reads: reads.append(t_ns))  # type: ignore[misc]
        assert await lean.post(prepared, BODY, ctx, fresh=fresh) == 200
        out.append((ctx, reads))
    await lean.aclose()
    return out


# ---- the transport's measurements ------------------------------------------------------------------------
def test_a_fresh_connection_has_its_opening_time_and_a_pooled_one_zero(shapes: ShapeServer) -> None:
    (first, reads1), (second, reads2) = asyncio.run(_posts(LeanTransport(), shapes.url("ok") + "/chat/completions",
                                                           2, fresh=False))
    assert first.connect_ns is not None and first.connect_ns > 0
    assert second.connect_ns == 0  # the same connection, from the pool
    for ctx, reads in ((first, reads1), (second, reads2)):
        assert ctx.t_headers_ns is not None and ctx.t_sent_ns <= ctx.t_headers_ns <= reads[0]


def test_a_request_retried_after_an_idle_close_has_the_fresh_connections_opening_time() -> None:
    """The server closes the pooled connection as the second GET goes out (ClosedIdle): it is sent again on a
    new connection, and its record's opening time is that new connection's, not the pooled one's 0."""
    async def two_gets(port: int) -> list[StreamContext]:
        contexts = [StreamContext(), StreamContext()]
        async with httpx.AsyncClient(transport=LeanTransport()) as client:
            for ctx in contexts:
                resp = await client.get(f"http://127.0.0.1:{port}/v1/models", extensions={CONTEXT_KEY: ctx})
                assert resp.json() == {"ok": 1}
        return contexts

    closer, contexts = asyncio.run(_against_idle_closer(two_gets))
    first, retried = cast(list[StreamContext], contexts)
    assert closer.connections == 2 and len(closer.requests) == 3  # the second GET went twice
    assert first.connect_ns is not None and first.connect_ns > 0
    assert retried.connect_ns is not None and retried.connect_ns > 0


def test_the_head_is_stamped_when_it_came_not_with_the_body() -> None:
    """A server that sends its head, then the first body bytes 20 ms later: the head's stamp is the first read's."""
    async def go() -> tuple[StreamContext, list[int]]:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            await reader.readexactly(len(BODY))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.02)
            writer.write(b"6\r\ndata: \r\n0\r\n\r\n")
            await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            [(ctx, reads)] = await _posts(LeanTransport(), f"http://127.0.0.1:{port}/v1/chat/completions", 1, False)
        finally:
            server.close()
            await server.wait_closed()
        return ctx, reads

    ctx, reads = asyncio.run(go())
    assert ctx.t_headers_ns is not None and ctx.t_sent_ns <= ctx.t_headers_ns < reads[0]


@pytest.fixture(scope="module")
def tls_shapes() -> Iterator[tuple[ShapeServer, ssl.SSLContext]]:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    client_ctx = ssl.create_default_context()
    ca.configure_trust(client_ctx)
    with ShapeServer(server_ctx) as srv:
        yield srv, client_ctx


def test_a_tls_connections_opening_time_includes_its_handshake(
        shapes: ShapeServer, tls_shapes: tuple[ShapeServer, ssl.SSLContext]) -> None:
    """Fresh connections each time: over TLS the opening takes the handshake too, so even the quickest TLS
    opening is slower than the quickest plain one (loopback, same machine)."""
    tls_server, client_ctx = tls_shapes
    plain = asyncio.run(_posts(LeanTransport(), shapes.url("ok") + "/chat/completions", 4, fresh=True))
    tls = asyncio.run(_posts(LeanTransport(ssl_context=client_ctx), tls_server.url("ok") + "/chat/completions", 4,
                             fresh=True))
    plain_ns = [ctx.connect_ns or 0 for ctx, _ in plain]
    tls_ns = [ctx.connect_ns or 0 for ctx, _ in tls]
    assert min(plain_ns) > 0 and min(tls_ns) > min(plain_ns)
    assert all(ctx.t_headers_ns is not None and ctx.t_sent_ns <= ctx.t_headers_ns <= reads[0] for ctx, reads in tls)


# ---- the loop sampler, alone -------------------------------------------------------------------------------
def test_a_blocked_loop_is_one_lag_sample_covering_the_block() -> None:
    async def go() -> tuple[LoopSampler, list[tuple[int, int, int]]]:
        sampler, hogs = LoopSampler(), []
        task = asyncio.create_task(sampler.run())
        asyncio.get_running_loop().call_later(0.12, lambda: hogs.append(hog()))
        await asyncio.sleep(0.6)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return sampler, hogs

    t_before_ns = time.monotonic_ns()
    sampler, [(start, end, hog_cpu_ns)] = asyncio.run(go())
    frame = client_metrics_frame(sampler.t_ns, sampler.names(), sampler.values)
    lags = frame.filter(pl.col("name") == "loop_lag_ms")
    blocked = lags.filter(pl.col("value") >= (HOG_S - 0.05) * 1e3)
    assert blocked.height == 1  # one block, one sample (the next timer is due after it fired)
    t_ns, lag_ms = blocked["t_ns"][0], blocked["value"][0]
    assert t_ns >= end and t_ns - lag_ms * 1e6 <= start + sampler.period_ns  # [t − lag, t] covers the block
    assert lags.filter(pl.col("value") < 2.0).height <= 1  # the timer's own grain: kept once a second only
    cpu = frame.filter(pl.col("name") == "cpu_busy_share")
    assert cpu.height == 1  # under a second: one share, taken as the sampler stopped, over its whole time
    assert cpu["value"][0] * (cpu["t_ns"][0] - t_before_ns) >= hog_cpu_ns  # CPU seconds ≥ the hog's own


# ---- client_metrics.parquet ------------------------------------------------------------------------------
def test_client_metrics_are_written_and_read_back(tmp_path: Path) -> None:
    frame = client_metrics_frame([10, 20, 30], ["loop_lag_ms", "cpu_busy_share", "loop_lag_ms"], [3.5, 0.25, 280.0])
    assert write_client_metrics(tmp_path, frame) is None
    back = read_client_metrics(tmp_path)
    assert back is not None and back.schema == SCHEMA and back.equals(frame)
    assert [p.name for p in tmp_path.iterdir()] == [FILE]  # nothing left aside


def test_a_run_without_client_metrics_or_with_a_damaged_file_reads_as_none(tmp_path: Path) -> None:
    assert read_client_metrics(tmp_path) is None
    (tmp_path / FILE).write_bytes(b"PAR1 cut short by a full disk")
    assert read_client_metrics(tmp_path) is None
    pl.DataFrame({"t_ns": [1], "other": ["x"]}).write_parquet(tmp_path / FILE)
    assert read_client_metrics(tmp_path) is None


def test_an_older_runs_requests_without_the_new_columns_read_them_as_null(tmp_path: Path) -> None:
    row: dict[str, Any] = {c: None for c in REQUEST_SCHEMA}
    row.update(seq=0, class_name="c", warmup=False, t_intended_ns=1, t_sent_ns=2, t_done_ns=9, prompt_tokens_asked=4,
               prompt_tokens_source="asked", output_tokens_asked=4, output_tokens=4, output_tokens_source="local",
               chunks=0, reasoning=False, worker=0)
    old = pl.DataFrame([row], schema=REQUEST_SCHEMA).drop("connect_ns", "t_headers_ns")
    old.write_parquet(tmp_path / "requests.parquet")
    pl.DataFrame(schema=CHUNK_SCHEMA).write_parquet(tmp_path / "chunks.parquet")
    requests, _ = load_records(tmp_path, merge=False)
    assert requests.schema == REQUEST_SCHEMA
    assert requests["connect_ns"].to_list() == [None] and requests["t_headers_ns"].to_list() == [None]


# ---- a run: records and client_metrics.parquet ---------------------------------------------------------------
RUN = """\
name: evidence
target: {base_url: embedded, ttft_timeout_s: 10}
load: {arrival: concurrency, concurrency: 2, requests: 16}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 8}, output_tokens: {dist: fixed, value: 8}}]
"""


def _run_with_hog(shapes: ShapeServer, out: Path, fail: bool = False) -> list[tuple[int, int, int]]:
    """``loadgen run`` in process with a HOG_S block of its loop 0.1 s after the engine's sampler starts (and,
    ``fail``, a fault in the run's progress loop once the block was sampled); the hog's figures."""
    hogs: list[tuple[int, int, int]] = []
    samplers: list[LoopSampler] = []
    real_run = LoopSampler.run

    async def hogged(self: LoopSampler) -> None:
        samplers.append(self)
        asyncio.get_running_loop().call_later(0.1, lambda: hogs.append(hog()))
        await real_run(self)

    async def failing(self: Run, run_task: asyncio.Task[Any], *args: Any) -> None:  # once the block is sampled
        while not run_task.done() and not (samplers and max(samplers[0].values, default=0) >= 250):
            await asyncio.sleep(0.05)
        raise RuntimeError("injected: the run fails part-way")

    mp = pytest.MonkeyPatch()
    mp.setattr(LoopSampler, "run", hogged)
    if fail:
        mp.setattr(Run, "_tick", failing)
    try:
        scenario = api.load_scenario(scenario_file(out.parent, RUN, f"{out.name}.yaml"))
        api.run(scenario, base_url=shapes.url("ok"), out=out, server_metrics=False, png=False)
    except RuntimeError:
        assert fail
    finally:
        mp.undo()
    return hogs


@pytest.fixture(scope="module")
def hogged_run(shapes: ShapeServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[int, int, int]]:
    out = tmp_path_factory.mktemp("evidence") / "run"
    [block] = _run_with_hog(shapes, out)
    return out, block


@pytest.mark.slow
def test_a_runs_records_carry_the_transports_measurements(hogged_run: tuple[Path, tuple[int, int, int]]) -> None:
    out, _ = hogged_run
    requests = pl.read_parquet(out / "requests.parquet")
    assert requests.height == 16 and requests["error_kind"].null_count() == 16
    assert requests["connect_ns"].null_count() == 0 and requests["t_headers_ns"].null_count() == 0
    assert (requests["connect_ns"] == 0).sum() >= 14  # two streams: pooled connections, after at most two opened
    ordered = requests.filter((pl.col("t_sent_ns") <= pl.col("t_headers_ns"))
                              & (pl.col("t_headers_ns") <= pl.col("t_first_token_ns")))
    assert ordered.height == 16


@pytest.mark.slow
def test_a_blocked_loop_during_a_run_is_in_client_metrics(hogged_run: tuple[Path, tuple[int, int, int]]) -> None:
    out, (start, end, _) = hogged_run
    metrics = read_client_metrics(out)
    assert metrics is not None and metrics.schema == SCHEMA
    lags = metrics.filter((pl.col("name") == "loop_lag_ms") & (pl.col("value") >= 250))
    assert lags.height == 1
    t_ns, lag_ms = lags["t_ns"][0], lags["value"][0]
    assert t_ns >= end and t_ns - lag_ms * 1e6 <= start + 50e6
    assert metrics.filter(pl.col("name") == "cpu_busy_share").height >= 1


@pytest.mark.slow
def test_a_run_that_fails_part_way_still_keeps_its_client_metrics(shapes: ShapeServer, tmp_path: Path) -> None:
    [_] = _run_with_hog(shapes, tmp_path / "run", fail=True)
    metrics = read_client_metrics(tmp_path / "run")
    assert metrics is not None
    assert metrics.filter((pl.col("name") == "loop_lag_ms") & (pl.col("value") >= 250)).height == 1
    assert load_records(tmp_path / "run", merge=False)[0].height >= 1  # the records taken are kept too
