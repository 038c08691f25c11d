"""Incremental Server-Sent Events decoder (WHATWG EventSource parsing), fed bytes as they arrive.

Lines end in ``\\n``, ``\\r\\n`` or ``\\r`` (a ``\\r`` at the end of a feed waits for the next byte to decide);
``data:`` lines accumulate, a blank line dispatches the event, ``:`` starts a comment, one space after the
colon is dropped. Each event is returned with the ``now_ns`` of the feed that completed it.
"""

from __future__ import annotations


class SseDecoder:
    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._has_data = False

    def feed(self, chunk: bytes, now_ns: int) -> list[tuple[int, str]]:
        """Decode ``chunk``; return ``(now_ns, data)`` for every event it completed."""
        buf = self._buf + chunk
        events: list[tuple[int, str]] = []
        start = 0
        n = len(buf)
        while start < n:
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, nl if nl >= 0 else n)
            if cr >= 0:
                if cr == n - 1:  # "\r" last: it may be the first half of "\r\n"
                    break
                end, nxt = cr, cr + 2 if buf[cr + 1:cr + 2] == b"\n" else cr + 1
            elif nl >= 0:
                end, nxt = nl, nl + 1
            else:
                break
            self._line(buf[start:end], now_ns, events)
            start = nxt
        self._buf = buf[start:]
        return events

    def _line(self, raw: bytes, now_ns: int, events: list[tuple[int, str]]) -> None:
        if not raw:
            if self._has_data:
                events.append((now_ns, "\n".join(self._data)))
            self._data, self._has_data = [], False
            return
        line = raw.decode("utf-8", errors="replace")
        field, sep, value = line.partition(":")
        if field == "" and sep:  # comment
            return
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data.append(value)
            self._has_data = True

    def pending(self) -> bool:
        """Bytes or data lines not yet dispatched (a stream that ends here was cut mid-event)."""
        return bool(self._buf.strip() or self._has_data)
