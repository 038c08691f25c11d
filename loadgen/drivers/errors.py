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
