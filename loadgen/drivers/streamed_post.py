"""One streamed POST to its end: on the lean transport's own path (a head prepared once a run, no httpx objects)
or through any httpx client; redirects followed or reported (``redirects.py``); and the release of a read
response's stream (``drop_stream``)."""

from __future__ import annotations

import time

import h11
import httpx

from loadgen.drivers.http_conn import REDIRECTS
from loadgen.drivers.lean_transport import LeanTransport, PreparedPost
from loadgen.drivers.redirects import MAX_REDIRECTS, next_hop, too_many
from loadgen.drivers.stream_context import CONTEXT_KEY, StreamContext

__all__ = ["StreamContext", "direct_post", "drop_stream", "send_post"]


_SPENT = httpx.ByteStream(b"")


def drop_stream(resp: httpx.Response) -> None:
    """Break httpx's response ↔ stream reference cycle once a response is read and closed, so that reference
    counting frees it (and the tracker its request points to) at once: the run turns automatic GC off."""
    resp.stream = _SPENT


async def send_post(client: httpx.AsyncClient, direct: tuple[LeanTransport, PreparedPost] | None, url: str,
                    headers: dict[str, str], body: bytes, ctx: StreamContext, follow: bool = False) -> int:
    """One streaming POST to its end, its body fed to ``ctx.feed``; the status. ``direct``: the lean
    transport's own path (a prepared head, no httpx objects: ~17 % of the loop's time at 128 streams went to
    httpx's request and response); None: through the client (any other transport). A redirect is followed
    (``follow``: 307/308) or raised as ``RedirectError`` (redirects.py); the send time stays the first send's."""
    status = await _post_once(client, direct, url, headers, body, ctx)
    first_sent_ns = ctx.t_sent_ns
    for _ in range(MAX_REDIRECTS):
        if status not in REDIRECTS:
            break
        url, headers = next_hop(url, status, ctx.location, follow, headers)  # a URL httpx.URL takes, or raises
        ctx.not_before_ns = 0
        status = await _post_once(client, direct_post(client, url, headers), url, headers, body, ctx)
    else:
        if status in REDIRECTS:
            raise too_many(status, ctx.location)
    ctx.t_sent_ns = first_sent_ns or ctx.t_sent_ns
    return status


async def _post_once(client: httpx.AsyncClient, direct: tuple[LeanTransport, PreparedPost] | None, url: str,
                     headers: dict[str, str], body: bytes, ctx: StreamContext) -> int:
    if direct is not None:
        return await direct[0].post(direct[1], body, ctx)
    feed, ctx.t_headers_ns = ctx.feed, None
    async with client.stream("POST", url, content=body, headers=headers, extensions={CONTEXT_KEY: ctx}) as resp:
        if ctx.t_headers_ns is None:  # another transport: when it handed the head over
            ctx.t_headers_ns = time.monotonic_ns()
        status = resp.status_code
        ctx.location = resp.headers.get("location") if status in REDIRECTS else None
        async for data in resp.aiter_raw():  # empty with the lean transport
            if feed is not None and status not in REDIRECTS:
                feed(data, time.monotonic_ns())
    drop_stream(resp)
    return status


def direct_post(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> tuple[LeanTransport, PreparedPost] | None:
    """The lean transport's direct path for POSTs to ``url``, when the client is on it and h11 accepts the
    head; else None (``send_post`` then goes through the client, which reports a bad header per request)."""
    lean = LeanTransport.of(client)
    if lean is None:
        return None
    try:
        return lean, lean.prepare_post(url, headers)
    except (h11.LocalProtocolError, httpx.UnsupportedProtocol, UnicodeEncodeError, httpx.ConnectError):
        return None
