"""A plain-TCP ``asyncio.Transport`` of loadgen's own that stamps each read with the kernel's receive time.

asyncio's and uvloop's transports read with ``recv`` and hand a protocol bytes only, never the control messages
that carry a receive timestamp. Here the connection's socket is loadgen's: opened non-blocking, connected with
``loop.sock_connect``, receive timestamps turned on (``kernel_stamps.enable``), read with ``recvmsg`` from a
``loop.add_reader`` callback. Each read goes to the protocol as ``received(data, t_ns)`` with its stamp
(``kernel_stamps.read_stamp``: when its last packet reached the kernel, on CLOCK_MONOTONIC). Writes go out with
``send`` at once; what the socket does not take waits for ``loop.add_writer``.

It keeps what ``http_conn.Connection`` relies on of an asyncio transport: ``connection_made`` on creation;
``connection_lost(None)`` after the peer's close, ``close()`` or ``abort()``, ``connection_lost(exc)`` after a
failed read or write, always from a later loop callback; ``get_extra_info("socket")``; ``is_closing()``.
``stamped_tls.py`` runs TLS over it (``ssl.SSLObject`` on memory BIOs): a read's stamp is its raw bytes'.
"""

from __future__ import annotations

import _socket
import asyncio
import socket
import struct
import time
from typing import Any, Callable, Protocol

from loadgen.drivers import kernel_stamps
from loadgen.drivers.kernel_stamps import ANC_BYTES, CLOCK as _CLOCK, STATS as _STATS, read_stamp

_monotonic_ns = time.monotonic_ns

READ_BYTES = 64 * 1024  # per recvmsg (below glibc's mmap threshold: the buffer is a plain heap block)
LATE_NS = 1_000_000  # a read taken this long after its bytes came, or one of several SSE events: reads are split ...
SPLIT_FOR_NS = 100_000_000  # ... for this long after the last such read
PEEK_BYTES = 16 * 1024  # looked at per split read (what lies beyond is read as one)
_late_until_ns = [0]  # until when reads are split (0: not now); one loop per process in practice, any is fine


def _queued(data: bytes) -> bool:
    """Whether a read holds more than one SSE event, not counting ``[DONE]`` (sent with the last one)."""
    ends = data.count(b"\n\n")
    return ends > 1 and ends - data.count(b"data: [DONE]") > 1


class StampedProtocol(Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...
    def received(self, data: bytes, t_ns: int) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...


class StampedTransport(asyncio.Transport):
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: StampedProtocol,
                 kind: tuple[int, struct.Struct] | None) -> None:
        super().__init__()
        self._loop, self._sock, self._protocol, self._kind = loop, sock, protocol, kind
        self._fd = sock.fileno()
        self._recvmsg = sock.recvmsg
        self._received: Callable[[bytes, int], None] = protocol.received  # a read, stamped (TLS: decrypts first)
        self._ctype, self._unpack = (kind[0], kind[1].unpack_from) if kind is not None else (-1, None)
        self._out = bytearray()  # what send did not take yet
        self._closing = self._lost = False
        self._splits = True  # split late reads at SSE events (not TLS: its bytes are records)
        self._peek: bytearray | None = None
        self._extra: dict[str, Any] = {"socket": sock}
        try:
            self._extra["peername"], self._extra["sockname"] = sock.getpeername(), sock.getsockname()
        except OSError:
            pass
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._read_ready)

    def _read_ready(self) -> None:
        if _late_until_ns[0] and self._splits:
            if _monotonic_ns() < _late_until_ns[0]:
                return self._read_split()
            _late_until_ns[0] = 0
        self._read_one(READ_BYTES)

    def _read_one(self, size: int) -> None:
        """One ``recvmsg``: the hot path (``kernel_stamps.read_stamp`` inlined for the common case: one control
        message of the expected type, the offset fresh)."""
        try:
            data, ancdata, _, _ = self._recvmsg(size, ANC_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            return self._force_close(exc)
        now_ns = _monotonic_ns()
        if not data:  # the peer closed its side: asyncio's default for a protocol without eof_received
            return self.close()
        clock = _CLOCK
        if len(ancdata) == 1 and ancdata[0][1] == self._ctype and now_ns - clock.sampled_ns <= clock.refresh_ns:
            sec, nsec = self._unpack(ancdata[0][2])
            t_ns = sec * 1_000_000_000 + nsec - clock.offset_ns
            _STATS.kernel += 1
            if t_ns > now_ns:
                t_ns = clock.to_monotonic(t_ns + clock.offset_ns, now_ns)
            elif now_ns - t_ns > LATE_NS or _queued(data):  # the loop is late, or events queued up
                _late_until_ns[0] = now_ns + SPLIT_FOR_NS  # split the reads for a while
            self._received(data, t_ns)
        else:
            self._received(data, read_stamp(ancdata, self._kind, now_ns))

    def _read_split(self) -> None:
        """While the loop is late: a peek at what waits, then one read per SSE event (each ending where an event
        ends, ``\n\n``), so that each carries the stamp of the segment that ended its event instead of all
        sharing the last one's."""
        if self._peek is None:
            self._peek = bytearray(PEEK_BYTES)
        try:
            n = self._sock.recv_into(self._peek, PEEK_BYTES, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            return self._force_close(exc)
        peek, start = self._peek, 0
        end = peek.find(b"\n\n", 0, n)
        while end >= 0 and not self._closing:
            end += 4 if peek[end + 2:end + 4] == b"\r\n" else 2  # with its HTTP chunk's CRLF (RFC 9112 §7.1)
            _STATS.split_reads += 1
            self._read_one(min(end, n) - start)
            start = end
            end = peek.find(b"\n\n", start, n)
        if not self._closing and (start < n or n == 0):
            self._read_one(n - start if n else READ_BYTES)  # what was peeked beyond the last event (or the close)

    # ---- writing ---------------------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        if not self._out:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                return self._force_close(exc)
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
            self._loop.add_writer(self._fd, self._write_ready)
        self._out += data

    def _write_ready(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            return self._force_close(exc)
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._fd)
            if self._closing:
                self._loop.call_soon(self._finish, None)

    def get_write_buffer_size(self) -> int:
        return len(self._out)

    def can_write_eof(self) -> bool:
        return False

    # ---- closing ---------------------------------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """After what is buffered has gone out."""
        if self._closing:
            return
        self._closing = True
        self._loop.remove_reader(self._fd)
        if not self._out:
            self._loop.call_soon(self._finish, None)

    def abort(self) -> None:
        self._force_close(None)

    def _force_close(self, exc: Exception | None) -> None:
        if self._lost:
            return
        if self._out:
            self._out.clear()
            self._loop.remove_writer(self._fd)
        if not self._closing:
            self._closing = True
            self._loop.remove_reader(self._fd)
        self._loop.call_soon(self._finish, exc)

    def _finish(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)


async def open_stamped(host: str, port: int, factory: Callable[[], StampedProtocol]) -> StampedProtocol:
    """A connection to ``host:port`` read by a ``StampedTransport``; the protocol ``factory`` made."""
    sock, kind = await connected_socket(host, port)
    protocol = factory()
    StampedTransport(asyncio.get_running_loop(), sock, protocol, kind)
    return protocol


async def connected_socket(host: str, port: int) -> tuple[socket.socket, tuple[int, struct.Struct] | None]:
    """A non-blocking socket connected to ``host:port`` (each address getaddrinfo gives, in order, as asyncio's
    create_connection tries them), receive timestamps on from before the first byte can come
    (``kernel_stamps.enable``: their control message's type and layout). OSError when none connects."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    errors: list[OSError] = []
    for family, kind, proto, _, address in infos:
        # the C class: under gevent (the Locust engine's process) socket.socket is gevent's, a Python wrapper
        sock: socket.socket = _socket.socket(family, kind, proto)  # type: ignore[assignment]
        try:
            sock.setblocking(False)
            stamps = kernel_stamps.enable(sock)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            errors.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        return sock, stamps
    if not errors:
        raise OSError(f"getaddrinfo({host!r}) gave no address")
    if len({str(e) for e in errors}) == 1:
        raise errors[0]
    raise OSError(f"Multiple exceptions: {', '.join(str(e) for e in errors)}")
