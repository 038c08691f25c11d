"""What the user reads when the target does not answer at all: the base URL as they gave it (not the /models path
loadgen asked first), what happened (connection refused, a name that does not resolve, no connection in time)
and what to try. A proxy that cannot be reached keeps its own words (drivers/proxy.py): there the target may be
fine."""

from __future__ import annotations

import errno
import socket
from typing import Iterator
from urllib.parse import urlsplit

from loadgen.drivers.proxy import ProxyError
from loadgen.errors import TargetError
from loadgen.drivers.http_request import default_port

SIM_HINT = "`loadgen target sim` starts the bundled simulator"


class Unreachable(TargetError):
    """No connection to the target (a preflight request's httpx.ConnectError); ``error`` is that error."""

    def __init__(self, message: str, error: BaseException) -> None:
        super().__init__(message)
        self.error = error


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The error and what it was raised from or during (a transport re-raises an OSError ``from None``: the
    OSError stays its ``__context__``)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _refused(exc: BaseException) -> bool:
    """ECONNREFUSED, by type or by the words a transport kept of it (its context is not always kept)."""
    return isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED \
        or any(words in str(exc) for words in (f"[Errno {errno.ECONNREFUSED}]", "Connection refused"))


def _unresolved(exc: BaseException) -> bool:
    """A name lookup that failed (socket.gaierror), by type or by its words."""
    return isinstance(exc, socket.gaierror) or any(
        words in str(exc) for words in ("Name or service not known", "nodename nor servname", "[Errno -2]",
                                        "[Errno -3]", "[Errno -5]", "No address associated with hostname"))


def unreachable_words(base_url: str, error: BaseException) -> str | None:
    """'cannot reach URL: connection refused (nothing listens on port P). Is the server running, on that
    port? …', naming ``base_url`` (already redacted); None where the cause is not the target's (a proxy) or is
    not one of these, so the caller keeps its own words."""
    chain = list(_chain(error))
    if any(isinstance(e, ProxyError) for e in chain):
        return None
    parts = urlsplit(base_url)
    port = parts.port if parts.port is not None else default_port(parts.scheme)
    if any(_refused(e) for e in chain):
        return (f"cannot reach {base_url}: connection refused (nothing listens on port {port} of "
                f"{parts.hostname}). Is the server running, and on that port? {SIM_HINT}.")
    if any(_unresolved(e) for e in chain):
        return f"cannot reach {base_url}: the host name {parts.hostname!r} does not resolve. Is it spelled right?"
    if any(isinstance(e, TimeoutError) for e in chain):
        return (f"cannot reach {base_url}: no connection in time (target.connect_timeout_s). Is the host right, "
                "and does a firewall let the port through?")
    return None
