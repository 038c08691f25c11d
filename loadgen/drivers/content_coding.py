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
"""

from __future__ import annotations

import zlib
from typing import Any, Callable


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


def _brotli() -> Any:
    try:
        import brotli
    except ImportError:
        raise UnsupportedCoding("br (install the brotli module to decode it)") from None
    return brotli.Decompressor()


_FACTORIES: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS), "x-gzip": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
    "deflate": _Deflate, "br": _brotli}


class BodyDecoder:
    """Undoes the codings of one response (``codings`` as the Content-Encoding header lists them)."""

    def __init__(self, codings: list[str]) -> None:
        steps = [c for c in codings if c != "identity"]
        unknown = [c for c in steps if c not in _FACTORIES]
        if unknown:
            raise UnsupportedCoding(", ".join(unknown))
        self._steps = [_FACTORIES[c]() for c in reversed(steps)]

    def __call__(self, data: bytes) -> bytes:
        for step in self._steps:
            data = step.decompress(data) if data else data
        return data


def decoder_for(header_values: list[bytes]) -> BodyDecoder | None:
    """The decoder for a response's Content-Encoding values (None: identity); UnsupportedCoding names an
    unknown one. A malformed compressed body raises ``zlib.error`` (or brotli's error) when decoded."""
    codings = [c.strip().lower() for value in header_values
               for c in value.decode("latin-1").split(",") if c.strip()]
    if all(c == "identity" for c in codings):
        return None
    return BodyDecoder(codings)
