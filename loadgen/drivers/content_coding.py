"""Content codings of a response body (RFC 9110 §8.4), decoded as the bytes arrive.

loadgen asks for ``accept-encoding: identity``, but a proxy may compress an event stream anyway, and a user's
header may ask for compression: what is sent is decoded, whatever was asked (RFC 9110 §12.5.3 lets a server
send a coding the client did not list). ``gzip``/``x-gzip`` (RFC 9110 §8.4.1.3), ``deflate`` (§8.4.1.2: zlib's
format, RFC 1950; the raw deflate some servers send instead is accepted too) and ``br`` (RFC 7932, through the
``brotli`` module) are decoded; several codings are undone in the reverse of the order they are listed in
(§8.4: "in the order in which they were applied"). Anything else is ``UnsupportedCoding``: the request fails
with that name, rather than its bytes being parsed as events.

Each read's bytes are decoded at once, so a compressing proxy that flushes per event keeps each event's read
time; one that buffers shows as chunks arriving together (``loadgen check`` reports compression).

``BodyDecoder.complete`` says whether every coding's stream reached its end (zlib's ``eof``: gzip's trailer,
deflate's final block; brotli's ``is_finished``; a brotli module that cannot tell is taken at its word). A body
whose framing ended (its Content-Length, the last chunk, the connection's close) before its compressed stream
did was cut short or is bad: the request fails (``http_conn.py``), rather than a truncated answer being taken as
whole. A body with no bytes at all is whole (nothing was coded: a 204, a HEAD's answer, an empty error).
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import httpx

Headers = list[tuple[bytes, bytes]]


class UnsupportedCoding(Exception):
    """A Content-Encoding loadgen cannot decode."""


class _Deflate:
    """zlib-wrapped deflate, or raw deflate when the first bytes are not zlib's header."""

    def __init__(self) -> None:
        self._obj: Any = zlib.decompressobj()
        self._started = False
        self._lead = b""  # the body's first byte, when it came alone: zlib's header is two bytes

    def decompress(self, data: bytes) -> bytes:
        if not self._started:
            data, self._lead = self._lead + data, b""
            if len(data) < 2:  # too few bytes to tell the formats apart (a read may end after one)
                self._lead = data
                return b""
            self._started = True
            try:
                return self._obj.decompress(data)
            except zlib.error:
                self._obj = zlib.decompressobj(-zlib.MAX_WBITS)
        return self._obj.decompress(data)

    @property
    def eof(self) -> bool:
        return self._started and self._obj.eof


class _Brotli:
    """``br`` (RFC 7932) through the ``brotli`` module: Google's (``process``, ``is_finished``) or brotlicffi
    (``decompress`` too). Google's hands out at most ~32 KiB per call and keeps the rest for calls with no input
    (brotli 1.2): those are made until it has nothing left, so a read's bytes are all decoded with it."""

    def __init__(self) -> None:
        try:
            import brotli
        except ImportError:
            raise UnsupportedCoding("br (install the brotli module to decode it)") from None
        self._obj: Any = brotli.Decompressor()
        self._process: Callable[[bytes], bytes] = getattr(self._obj, "process", None) or self._obj.decompress

    def decompress(self, data: bytes) -> bytes:
        parts = [self._process(data)]
        while parts[-1]:  # until a call with no input hands out nothing more
            parts.append(self._process(b""))
        return b"".join(parts)

    @property
    def eof(self) -> bool:
        finished = getattr(self._obj, "is_finished", None)
        return bool(finished()) if finished is not None else True  # a module that cannot tell: taken as whole


_FACTORIES: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), "x-gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
    "deflate": _Deflate, "br": _Brotli}


class BodyDecoder:
    """Undoes the codings of one response (``codings`` as the Content-Encoding header lists them)."""

    def __init__(self, codings: list[str]) -> None:
        steps = [c for c in codings if c != "identity"]
        unknown = [c for c in steps if c not in _FACTORIES]
        if unknown:
            raise UnsupportedCoding(", ".join(unknown))
        self.codings = ", ".join(steps)  # as listed, for messages
        self._steps = [_FACTORIES[c]() for c in reversed(steps)]
        self._fed = [False] * len(self._steps)  # which steps got bytes to decode

    def __call__(self, data: bytes) -> bytes:
        """``data`` decoded; httpx.DecodingError when the server's bytes are not what their coding says."""
        try:
            for i, step in enumerate(self._steps):
                if data:
                    self._fed[i] = True
                    data = step.decompress(data)
        except Exception as exc:  # noqa: BLE001 - zlib.error, brotli.error: the server's bytes are bad
            raise httpx.DecodingError(f"cannot decode the body: {type(exc).__name__}: {exc}") from None
        return data

    def complete(self) -> bool:
        """Whether every coding's stream reached its end (one that got no bytes at all: an empty body, whole)."""
        return all(step.eof for step, fed in zip(self._steps, self._fed) if fed)

    def cut_short(self, until_close: bool) -> httpx.HTTPError:
        """The error of a body whose framing ended before its compressed stream did (``complete`` is False):
        cut short by the connection's close (``until_close``: RFC 9112 §6.3 rule 8), or a bad response (its
        Content-Length or last chunk said it was whole)."""
        cut = f"the compressed body (Content-Encoding {self.codings}) ended before its end"
        if until_close:
            return httpx.ReadError(f"connection closed mid-response: {cut}")
        return httpx.DecodingError(f"{cut}, where its framing said it was whole: a bad response")


def unasked_transfer_coding(headers: Headers) -> httpx.DecodingError | None:
    """The error of a response framed with a transfer coding other than chunked (``Transfer-Encoding: gzip,
    chunked``), else None. loadgen sends no ``TE``, so chunked is the only transfer coding it accepts (RFC 9110
    §10.1.4; RFC 9112 §7.4: TE lists the codings "besides chunked" a client accepts) and a server must not apply
    another (RFC 9112 §6.1, §7): its bytes are not the body, and are not parsed as events. ``identity`` (an old
    no-op name) passes."""
    codings = [c.split(";", 1)[0].strip().lower() for k, v in headers if k.lower() == b"transfer-encoding"
               for c in v.decode("latin-1").split(",")]
    unasked = [c for c in codings if c and c not in ("chunked", "identity")]
    if not unasked:
        return None
    names = ", ".join(f"'{c}'" for c in unasked)
    return httpx.DecodingError(f"server used transfer coding {names} that loadgen did not ask for (RFC 9112 §7: "
                               "it sends no TE, so chunked is the only transfer coding a server may use)")


def decoder_for(header_values: list[bytes]) -> BodyDecoder | None:
    """The decoder for a response's Content-Encoding values (None: identity); UnsupportedCoding names an
    unknown one. A malformed compressed body raises ``zlib.error`` (or brotli's error) when decoded."""
    codings = [c.strip().lower() for value in header_values
               for c in value.decode("latin-1").split(",") if c.strip()]
    if all(c == "identity" for c in codings):
        return None
    return BodyDecoder(codings)


def decoding(headers: Headers) -> tuple[BodyDecoder | None, Headers]:
    """A response's decoder (None: identity) and its headers as handed on: without Content-Encoding and
    Content-Length when it lists a coding (they describe the bytes sent, not the body fed). A coding loadgen
    cannot decode, or a transfer coding it did not ask for: httpx.DecodingError naming it."""
    unasked = unasked_transfer_coding(headers)
    if unasked is not None:  # its bytes are not the body: none is fed
        raise unasked
    codings = [v for k, v in headers if k.lower() == b"content-encoding"]
    if not codings:
        return None, headers
    try:
        decoder = decoder_for(codings)
    except UnsupportedCoding as exc:
        raise httpx.DecodingError(f"Content-Encoding {exc} is not supported (loadgen asks for identity)") from None
    return decoder, [(k, v) for k, v in headers if k.lower() not in (b"content-encoding", b"content-length")]
