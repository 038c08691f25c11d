"""A failed response kept as received (``--capture``, run/guards.py): the reads as they came until the final
response's head ends (1xx heads included, a head that fails to parse as it came), then the body as fed, up to
``CAPTURE_BYTES`` plus one byte (the one more tells that there was more). ``http_conn.py`` feeds it."""

from __future__ import annotations

import re

CAPTURE_BYTES = 64 * 1024  # of a captured response, at most (one byte more is kept: it tells that there was more)
_BLANK_LINE = re.compile(rb"\r?\n\r?\n")  # where a head ends (RFC 9112 §2.1; a bare LF is tolerated, §2.2)


class WireCapture:
    """One response's capture into ``raw`` (the request context's buffer, which may hold earlier hops)."""

    def __init__(self, raw: bytearray) -> None:
        self.raw, self.wire, self.head_end = raw, True, len(raw)  # wire: keeping reads whole, the head not ended

    def read(self, data: bytes) -> None:
        """A read off the socket, kept while the final head has not ended."""
        if self.wire:
            self.keep(data)

    def head_ended(self, interim: bool) -> None:
        """A head ended: a 1xx's stays with what follows; the final one's end cuts what was read past it (the body
        comes as fed from here on)."""
        if not self.wire:
            return
        end = _BLANK_LINE.search(self.raw, self.head_end)
        self.head_end = end.end() if end else len(self.raw)
        if not interim:
            del self.raw[self.head_end:]
            self.wire = False

    def keep(self, data: bytes) -> None:
        if len(self.raw) <= CAPTURE_BYTES:
            self.raw += data[:CAPTURE_BYTES + 1 - len(self.raw)]
