"""The transport's own exceptions, beside httpx's: what a request's error kind is made of (``timing.error_kind``)."""

from __future__ import annotations

import httpx


class FeedError(Exception):
    """The response's reader raised (a bug in loadgen's parsing, not a fault of the server): ``internal``."""


class RedirectError(httpx.HTTPError):
    """A redirect that was not followed (``redirects.py``): the status and where it pointed; ``http_3xx``."""

    def __init__(self, status: int, location: str | None, message: str) -> None:
        super().__init__(message)
        self.status, self.location = status, location


class ClosedIdle(httpx.ReadError):
    """A reused keep-alive connection that the server closed before any byte of the response came: it closed the
    connection for idleness as the request went out (RFC 9112 §9.6: either side may close an idle connection at
    any time). A request known to be idempotent is retried once on a new connection (§9.3.1.1); a generation
    request is not (the server may have started it), and counts as a ``protocol`` error (``timing.error_kind``)."""
