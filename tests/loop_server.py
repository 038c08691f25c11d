"""What the tests' own servers share: an asyncio TCP server on 127.0.0.1 (TLS with ``ssl_context``) on an event
loop in a thread of the test process, started and stopped as a context manager; each connection handled by the
subclass's ``_connection`` and closed after it, whatever it raised of the faults a misbehaving peer causes."""

from __future__ import annotations

import asyncio
import ssl
import threading
from typing import Any

import h11

QUIET = (ConnectionError, asyncio.CancelledError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
         h11.ProtocolError, ssl.SSLError)  # a peer that goes away or speaks nonsense ends its connection only


class LoopServer:
    name = "the test server"

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context  # serve https with it
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def __enter__(self) -> Any:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"{self.name} did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._shutdown)
        self._thread.join(10)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        serving = asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.ssl_context)
        self._server = self._loop.run_until_complete(serving)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        self._loop.close()

    def _shutdown(self) -> None:
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        self._loop.call_later(0.2, self._loop.stop)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._connection(reader, writer)
        except QUIET:
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


async def read_request(conn: h11.Connection, reader: asyncio.StreamReader) -> tuple[Any, bytes]:
    """The next request on the connection and its whole body; (None, b"") when the client closed it."""
    request, body = None, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await reader.read(65536)
            if not data:
                return None, b""
            conn.receive_data(data)
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return request, body
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None, b""
