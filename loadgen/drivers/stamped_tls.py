"""TLS over loadgen's own stamped socket (``stamped_socket.py``): ``https://`` reads keep the kernel's stamps.

asyncio's TLS transport reads the socket itself and hands over decrypted bytes, so a stamp could only be taken
when the loop got to them. Here an ``ssl.SSLObject`` works on two memory BIOs (the ``ssl`` module's
"Memory BIO Support"): each raw read, stamped by ``StampedTransport`` with the kernel's receive time of its last
packet, goes into the incoming BIO, and the plaintext it completes goes to the protocol with that stamp (a TLS
record split over two reads is stamped with the read that completed it). Plaintext to send is encrypted and the
outgoing BIO's bytes are written at once. The handshake runs before the transport is made (as asyncio's does:
``connection_made`` after it); a failed certificate check raises ``ssl.SSLCertVerificationError`` from
``open_stamped_tls``. Closing sends ``close_notify`` (RFC 8446 §6.1); the server's ``close_notify`` is its close.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from typing import Callable

from loadgen.drivers import kernel_stamps
from loadgen.drivers.stamped_socket import READ_BYTES, StampedProtocol, StampedTransport, connected_socket


class StampedTLSTransport(StampedTransport):
    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: StampedProtocol,
                 kind: tuple[int, struct.Struct] | None,
                 tls: tuple[ssl.SSLObject, ssl.MemoryBIO, ssl.MemoryBIO]) -> None:
        self._tls, self._incoming, self._outgoing = tls
        super().__init__(loop, sock, protocol, kind)
        self._deliver = protocol.received
        self._received = self._decrypt
        self._extra["ssl_object"] = self._tls
        self._splits = False

    def _decrypt(self, data: bytes, t_ns: int) -> None:
        self._incoming.write(data)
        plain: list[bytes] = []
        closed = False
        tls, incoming = self._tls, self._incoming
        try:
            while True:  # one record a call; no call left to raise SSLWantReadError when the read ended on a record
                chunk = tls.read(READ_BYTES)
                if not chunk:
                    closed = True
                    break
                plain.append(chunk)
                if not incoming.pending and not tls.pending():
                    break
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:  # the server's close_notify
            closed = True
        except ssl.SSLError as exc:  # a bad record: the connection fails as a failed read would
            return self._force_close(exc)
        self._flush()  # what reading produced (a key update's answer)
        if plain:
            self._deliver(plain[0] if len(plain) == 1 else b"".join(plain), t_ns)
        if closed:
            self.close()

    def _flush(self) -> None:
        out = self._outgoing.read()
        if out:
            StampedTransport.write(self, out)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            return
        try:
            self._tls.write(data)
        except ssl.SSLError as exc:
            return self._force_close(exc)
        self._flush()

    def close(self) -> None:
        if self._closing:
            return
        try:
            self._tls.unwrap()  # our close_notify into the outgoing BIO; the peer's is not waited for
        except ssl.SSLError:
            pass
        self._flush()
        super().close()


async def open_stamped_tls(host: str, port: int, factory: Callable[[], StampedProtocol], context: ssl.SSLContext,
                           server_hostname: str, sock: socket.socket | None = None) -> StampedProtocol:
    """A TLS connection to ``host:port`` (or over ``sock``, a proxy's tunnel), read by a StampedTLSTransport."""
    loop = asyncio.get_running_loop()
    if sock is None:
        sock, kind = await connected_socket(host, port)
    else:  # a proxy's tunnel: nothing of the server's has come yet (the ClientHello has not gone)
        kind = kernel_stamps.enable(sock)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=False, server_hostname=server_hostname)
    try:
        await _handshake(loop, sock, tls, incoming, outgoing)
    except BaseException:
        sock.close()
        raise
    protocol = factory()
    StampedTLSTransport(loop, sock, protocol, kind, (tls, incoming, outgoing))
    return protocol


async def _handshake(loop: asyncio.AbstractEventLoop, sock: socket.socket, tls: ssl.SSLObject,
                     incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO) -> None:
    while True:
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        else:
            out = outgoing.read()
            if out:
                await loop.sock_sendall(sock, out)
            return
        out = outgoing.read()
        if out:
            await loop.sock_sendall(sock, out)
        data = await loop.sock_recv(sock, READ_BYTES)
        if not data:
            raise ConnectionResetError("the server closed the connection during the TLS handshake")
        incoming.write(data)
