"""Reads stamped by the kernel (drivers/kernel_stamps.py, drivers/stamped_socket.py): the clock mapping, the
control-message parsing and its fallback, the transport, and stamps that stay right while the loop is kept busy."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

from loadgen.drivers import kernel_stamps
from loadgen.drivers.kernel_stamps import ClockMap, StampStats, count_events, read_stamp
from loadgen.drivers.lean_transport import LeanTransport, StreamContext
from loadgen.drivers.stamped_socket import open_stamped
from loadgen.run.client_faults import ClientBlocks

needs_kernel_stamps = pytest.mark.skipif(not kernel_stamps.supported(), reason="no kernel receive timestamps here")


def test_the_offset_comes_from_the_narrowest_bracket():
    """Realtime is monotonic + 1 s exactly; the brackets around its reads are 900, 20, 500, 40, 60 ns wide: the
    20-ns one is kept, its midpoint taken, so the offset is off by at most 10 ns."""
    widths = [900, 20, 500, 40, 60]
    mono, real, t = [], [], 10_000
    for w in widths:
        mono += [t, t + w]
        real.append(t + w // 4 + 1_000_000_000)  # the realtime read lies somewhere inside its bracket
        t += 1_000
    m, r = iter(mono), iter(real)
    stats = StampStats()
    cmap = ClockMap(lambda: next(m), lambda: next(r), stats=stats)
    cmap.sample()
    assert cmap.bracket_ns == 20
    assert abs(cmap.offset_ns - 1_000_000_000) <= 10
    assert stats.max_bracket_ns == 20


def test_the_offset_is_sampled_again_after_the_refresh_interval_and_a_step_is_seen():
    now = [0]
    real_offset = [5_000_000_000]
    stats = StampStats()
    cmap = ClockMap(lambda: now[0], lambda: now[0] + real_offset[0], refresh_ns=1_000_000_000, stats=stats)
    now[0] = 100
    assert cmap.to_monotonic(2_000 + 5_000_000_000, now_ns=3_000) == 2_000
    real_offset[0] += 7_000  # CLOCK_REALTIME stepped 7 µs forward
    now[0] = 500_000_000  # within the refresh interval: the old offset is still used
    assert cmap.to_monotonic(400_000_000 + real_offset[0], now_ns=500_000_000) == 400_007_000
    now[0] = 1_200_000_000  # past it: sampled again, the step is caught and counted
    assert cmap.to_monotonic(1_100_000_000 + real_offset[0], now_ns=1_200_000_000) == 1_100_000_000
    assert stats.refreshes == 2 and stats.max_step_ns == 7_000


def test_a_mapped_stamp_after_the_reads_return_is_clamped_and_counted():
    stats = StampStats()
    cmap = ClockMap(lambda: 1_000, lambda: 1_000, stats=stats)  # offset 0
    assert cmap.to_monotonic(5_000, now_ns=4_000) == 4_000
    assert cmap.to_monotonic(3_000, now_ns=4_000) == 3_000
    assert stats.clamped == 1


def test_the_real_clocks_map_within_the_bracket():
    cmap = ClockMap(stats=StampStats())
    cmap.sample()
    m1 = time.monotonic_ns()
    mapped = cmap.to_monotonic(time.time_ns(), now_ns=time.monotonic_ns() + 10**9)
    m2 = time.monotonic_ns()
    assert m1 - cmap.bracket_ns <= mapped <= m2 + cmap.bracket_ns


def test_a_read_without_the_kernels_stamp_falls_back_to_the_clock_and_is_counted(monkeypatch):
    monkeypatch.setattr(kernel_stamps, "STATS", StampStats())
    kind = (kernel_stamps.SO_TIMESTAMPNS_NEW, struct.Struct("qq"))
    assert read_stamp([], kind, now_ns=123) == 123
    assert read_stamp([(socket.SOL_SOCKET, 99, b"x" * 16)], kind, now_ns=456) == 456
    assert read_stamp([], None, now_ns=789) == 789
    real = time.time_ns()
    now = time.monotonic_ns()
    cmsg = (socket.SOL_SOCKET, kind[0], struct.pack("qq", real // 10**9, real % 10**9))
    assert abs(read_stamp([cmsg], kind, now_ns=now + 10**6) - now) < 100_000
    stats = kernel_stamps.STATS
    assert (stats.as_dict()["reads"], stats.kernel, stats.fallback) == (4, 1, 3)


def test_events_sharing_a_read_are_counted(monkeypatch):
    monkeypatch.setattr(kernel_stamps, "STATS", StampStats())
    for body in (b"data: 1\n\n", b"data: 2\n\ndata: 3\n\ndata: 4\n\n", b"data: partial", b"data: 5\n\n"):
        count_events(body)
    share = kernel_stamps.STATS.as_dict()
    assert (share["body_reads"], share["multi_event_reads"], share["events"]) == (3, 1, 5)
    assert share["multi_event_share"] == pytest.approx(1 / 3)
    assert share["events_sharing_a_stamp_share"] == pytest.approx(3 / 5)


@needs_kernel_stamps
def test_a_loopback_read_carries_the_kernels_receive_time():
    """The stamp lies between the send and the read's return, though the read came 20 ms after the send."""
    srv = socket.create_server(("127.0.0.1", 0))
    with srv, socket.create_connection(srv.getsockname()) as client:
        peer, _ = srv.accept()
        with peer:
            kind = kernel_stamps.enable(client)
            assert kind is not None
            before = time.monotonic_ns()
            peer.sendall(b"hello")
            after = time.monotonic_ns()
            time.sleep(0.02)  # the read is late on purpose: its stamp must not be
            data, anc, _, _ = client.recvmsg(100, kernel_stamps.ANC_BYTES)
            t_ns = read_stamp(anc, kind, time.monotonic_ns())
    assert data == b"hello"
    assert before - 50_000 <= t_ns <= after + 50_000  # the mapping's error: well under 50 µs


def test_the_stamped_transport_writes_what_the_socket_did_not_take_and_reads_to_the_close():
    """8 MiB written at once (more than a socket buffer takes) reach an echo server whole; its close ends the
    connection with connection_lost(None)."""
    payload = bytes(range(256)) * (32 * 1024)

    async def scenario() -> tuple[bytes, object]:
        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            got = await reader.readexactly(len(payload))
            writer.write(got)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        got, lost = bytearray(), asyncio.get_running_loop().create_future()

        class Sink:
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                transport.write(payload)  # type: ignore[attr-defined]

            def received(self, data: bytes, t_ns: int) -> None:
                got.extend(data)

            def connection_lost(self, exc: Exception | None) -> None:
                lost.set_result(exc)

        await open_stamped("127.0.0.1", port, Sink)
        exc = await asyncio.wait_for(lost, 20)
        server.close()
        return bytes(got), exc

    got, exc = asyncio.run(scenario())
    assert got == payload and exc is None


def test_a_refused_connection_is_an_oserror():
    port = socket.create_server(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    with pytest.raises(OSError):
        asyncio.run(open_stamped("127.0.0.1", free, lambda: None))  # type: ignore[arg-type,return-value]


# ---- stamps while the loop is kept busy -----------------------------------------------------------------------
EMITTER = r"""
import json, socket, sys, time
CHUNKS, EVERY_NS = int(sys.argv[1]), int(sys.argv[2])
srv = socket.create_server(("127.0.0.1", 0)); print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept(); conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
if len(sys.argv) > 3:  # TLS: a PEM with the server's key and certificate chain
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(sys.argv[3])
    conn = ctx.wrap_socket(conn, server_side=True)
head = b""
while b"\r\n\r\n" not in head:
    head += conn.recv(65536)
conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
writes, t0 = [], time.monotonic_ns() + 20_000_000
for i in range(CHUNKS):
    due = t0 + i * EVERY_NS
    while time.monotonic_ns() < due - 200_000:
        time.sleep(0.0001)
    while time.monotonic_ns() < due:
        pass
    event = b"data: %d\n\n" % i
    before = time.monotonic_ns()
    conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
    writes.append((before, time.monotonic_ns()))
conn.sendall(b"0\r\n\r\n"); conn.close()
print(json.dumps(writes), flush=True)
"""


def _stream_under_blocks(port: int, blocks: ClientBlocks, run: Callable[[Any], Any] = asyncio.run,
                         tls: ssl.SSLContext | None = None) -> list[tuple[list[int], int, int]]:
    """Each read of one streamed response as (its events' numbers, its stamp, the clock when it was fed)."""
    reads: list[tuple[list[int], int, int]] = []

    def feed(data: bytes, t_ns: int) -> None:
        fed_ns = time.monotonic_ns()
        numbers = [int(line[6:]) for line in data.split(b"\n") if line.startswith(b"data: ")]
        reads.append((numbers, t_ns, fed_ns))

    async def go() -> None:
        transport = LeanTransport(use_proxy_env=False, ssl_context=tls)
        prepared = transport.prepare_post(f"http{'s' if tls else ''}://127.0.0.1:{port}/v1/completions", {})
        with blocks.running():
            await transport.post(prepared, b"{}", StreamContext(feed=feed))
        await transport.aclose()

    run(go())
    return reads


def _loops() -> list[Any]:
    """asyncio's loop, and uvloop's (what ``loadgen run`` uses where it is installed)."""
    loops = [pytest.param(asyncio.run, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, pytest.param(uvloop.run, id="uvloop")]


@pytest.fixture(scope="module")
def tls_pem(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ssl.SSLContext]:
    """A server's key and certificate (for 127.0.0.1) as a PEM file, and a client context that trusts it."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    pem = tmp_path_factory.mktemp("tls") / "server.pem"
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(pem))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return str(pem), client


@pytest.mark.timing
@needs_kernel_stamps
@pytest.mark.parametrize("scheme", ["http", "https"])
@pytest.mark.parametrize("run", _loops())
def test_chunk_stamps_stay_on_the_servers_writes_while_the_loop_is_blocked(run: Callable[[Any], Any], scheme: str,
                                                                           request: pytest.FixtureRequest):
    """A server in another process writes an SSE event every 7 ms (300 of them), logging each write; the client's
    loop busy-waits 5 ms in every 8, so most events arrive while it is blocked, one at a time. Each read's stamp
    is checked against the write of the last event it carries (a TCP read's timestamp is that of its last
    segment): p99 within 0.5 ms, every one within 1 ms. A stamp taken when the loop got to the read (the clock
    read in ``feed``, as ``data_received`` did) is off by up to the block: more than 2 ms for many reads, so
    the check tells the two apart."""
    chunks, every_ns = 300, 7_000_000
    pem, client_tls = request.getfixturevalue("tls_pem") if scheme == "https" else ("", None)
    proc = subprocess.Popen([sys.executable, "-c", EMITTER, str(chunks), str(every_ns), *([pem] if pem else [])],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        reads = _stream_under_blocks(port, ClientBlocks(block_ms=5.0, every_s=0.008), run, client_tls)
        writes = json.loads(proc.communicate(timeout=30)[0])
    finally:
        proc.kill()
    assert sorted(n for numbers, _, _ in reads for n in numbers) == list(range(chunks))
    # a write the emitter's own process was descheduled in (the send took > 0.2 ms) has no exact truth
    clean = [(numbers[-1], t_ns, fed_ns) for numbers, t_ns, fed_ns in reads
             if numbers and writes[numbers[-1]][1] - writes[numbers[-1]][0] < 200_000]
    errors_ms = sorted(abs(t_ns - writes[last][0]) / 1e6 for last, t_ns, _ in clean)
    loop_late_ms = [(fed_ns - writes[last][0]) / 1e6 for last, _, fed_ns in clean]
    assert len(clean) >= 0.9 * len(reads)
    assert sum(late > 2.0 for late in loop_late_ms) >= 0.15 * len(clean), "the blocks did not delay the reads"
    assert errors_ms[int(0.99 * (len(errors_ms) - 1))] <= 0.5, errors_ms[-10:]
    assert errors_ms[-1] <= 1.0, errors_ms[-10:]


@pytest.mark.timing
@needs_kernel_stamps
@pytest.mark.parametrize("run", _loops())
def test_events_that_queue_behind_a_blocked_loop_keep_their_own_stamps(run: Callable[[Any], Any]):
    """An event every 2 ms while the loop busy-waits 5 ms in every 8: two or three events wait in the socket at
    each block's end. Once a read comes late (> 1 ms) reads are split at events (stamped_socket._read_split), so
    each event's read carries the stamp of the segment that ended it: at least 90 % of the 400 events within
    0.5 ms of their write, leaving out writes the emitter was descheduled in, as the 7 ms test does (read whole,
    50–86 % were; what is left is the kernel merging a segment into the one still queued before it, which keeps
    the later stamp)."""
    chunks, every_ns = 400, 2_000_000
    proc = subprocess.Popen([sys.executable, "-c", EMITTER, str(chunks), str(every_ns)], stdout=subprocess.PIPE,
                            text=True)
    split_before = kernel_stamps.STATS.split_reads
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]
        reads = _stream_under_blocks(port, ClientBlocks(block_ms=5.0, every_s=0.008), run)
        writes = json.loads(proc.communicate(timeout=30)[0])
    finally:
        proc.kill()
    assert sorted(n for numbers, _, _ in reads for n in numbers) == list(range(chunks))
    # a write the emitter's own process was descheduled in (the send took > 0.2 ms) has no exact truth
    errors_ms = [abs(t_ns - writes[n][0]) / 1e6 for numbers, t_ns, _ in reads for n in numbers
                 if writes[n][1] - writes[n][0] < 200_000]
    assert len(errors_ms) >= 0.9 * chunks
    assert kernel_stamps.STATS.split_reads - split_before >= chunks // 2
    assert sum(e <= 0.5 for e in errors_ms) >= 0.9 * len(errors_ms), sorted(errors_ms)[-20:]


@pytest.mark.slow
@needs_kernel_stamps
def test_a_runs_summary_carries_its_own_read_stamp_counts(tmp_path):
    """summary.json's generator.read_stamps: this run's reads, every one stamped by the kernel, the clock map's
    bracket set (under a microsecond on a quiet machine; 50 µs allows a VM whose clock reads are system calls)."""
    from tests.run_helpers import run_cli, summary

    out = tmp_path / "run"
    res = run_cli("run", "scenarios/smoke.yaml", "--out", str(out), "--no-progress", "--no-png", "--duration", "2")
    assert res.returncode in (0, 1, 3), res.stdout + res.stderr
    stamps = summary(out)["generator"]["read_stamps"]
    assert stamps["kernel"] > 0 and stamps["fallback"] == 0 and stamps["reads"] == stamps["kernel"]
    assert stamps["body_reads"] <= stamps["reads"] and 0 < stamps["max_bracket_ns"] < 50_000


def test_a_reset_zeroes_every_count():
    """``loadgen run`` resets the counts as it starts sending: a run's figures are its own, not the process's."""
    stats = StampStats(kernel=5, fallback=1, body_reads=4, multi_event_reads=2, events=7, max_bracket_ns=90,
                       split_reads=3)
    stats.reset()
    assert stats.as_dict() == StampStats().as_dict() and stats.as_dict()["kernel"] == 0
