"""Incremental Server-Sent Events decoder (WHATWG EventSource parsing), fed bytes as they arrive.

Lines end in ``\\n``, ``\\r\\n`` or ``\\r``; a ``\\r`` ends its line at once, even at the very end of a feed
(the event it completes is stamped with that feed, and a stream's last event may end in one), and a ``\\n``
that starts the next feed is then the rest of that ``\\r\\n``, skipped (as browsers' parsers do). ``data:``
lines accumulate, a blank line dispatches the event, ``:`` starts a comment, one space after the colon is
dropped, other fields are ignored. Each event is returned with the ``now_ns`` of the feed that completed it.
Splitting uses ``bytes.split`` (C); only whole lines reach the Python loop. A feed of whole events of one
``data: `` line each (what servers write, and with nothing buffered) takes a shortcut: split on blank lines, no
line loop.

A UTF-8 byte order mark at the very start of the stream is dropped, as WHATWG's "UTF-8 decode" does (HTML
§9.2.6: "The stream must then be decoded using the UTF-8 decode algorithm", which strips one leading BOM);
three bytes of it may come in separate feeds.

Memory is bounded: a line, or an event's data, longer than ``max_event_bytes`` is not buffered; the decoder sets
``overflow`` (a message) and ignores the rest of the stream (a server that never ends a line would otherwise
grow the buffer without limit).
"""

from __future__ import annotations


MAX_EVENT_BYTES = 1 << 20
BOM = b"\xef\xbb\xbf"


class SseDecoder:
    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._buf = b""
        self._data: list[str] = []
        self._data_bytes = 0
        self._has_data = False
        self.max_event_bytes = max_event_bytes
        self.overflow: str | None = None  # set once a line or event went over max_event_bytes
        self._lead: bytes | None = b""  # the stream's first bytes while they may still be a BOM; None after
        self._cr = False  # the last feed ended in CR: an LF first in the next one belongs to that line ending

    def feed(self, chunk: bytes, now_ns: int) -> list[tuple[int, str]]:
        """Decode ``chunk``; return ``(now_ns, data)`` for every event it completed."""
        if self.overflow is not None:
            return []
        if self._lead is not None:
            chunk = self._past_bom(self._lead, chunk)
            if not chunk:
                return []
        if self._cr:
            chunk = self._past_cr(chunk)
            if not chunk:
                return []
        if not self._buf and not self._has_data and chunk.endswith(b"\n\n"):
            whole = self._whole_events(chunk, now_ns)
            if whole is not None:
                return whole
        buf = self._buf + chunk
        if b"\r" in buf:
            self._cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        if len(self._buf) > self.max_event_bytes:
            return self._overflow("a line")
        events: list[tuple[int, str]] = []
        for line in lines:
            if not line:
                if self._has_data:
                    events.append((now_ns, "\n".join(self._data)))
                    self._data, self._data_bytes, self._has_data = [], 0, False
            elif line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                self._data_bytes += len(value)
                if self._data_bytes > self.max_event_bytes:
                    return events + self._overflow("an event")
                self._data.append(value.decode("utf-8", errors="replace"))
                self._has_data = True
            elif line == b"data":
                self._data.append("")
                self._has_data = True
        return events

    def _past_cr(self, chunk: bytes) -> bytes:
        """``chunk`` without the LF that completes the CRLF the last feed ended in (WHATWG: one line ending)."""
        if chunk:
            self._cr = False
        return chunk[1:] if chunk[:1] == b"\n" else chunk

    def _past_bom(self, held: bytes, chunk: bytes) -> bytes:
        """``chunk`` without the stream's leading BOM (``held``: the first bytes kept while they could still be
        one); b"" while they still could."""
        lead = held + chunk
        if len(lead) < len(BOM) and BOM.startswith(lead):
            self._lead = lead
            return b""
        self._lead = None
        return lead[len(BOM):] if lead.startswith(BOM) else lead

    def _whole_events(self, chunk: bytes, now_ns: int) -> list[tuple[int, str]] | None:
        """The common case, fast: nothing buffered, and ``chunk`` is whole events of one ``data: `` line each
        (what servers write). None: anything else, for the line-by-line decoder."""
        if len(chunk) > self.max_event_bytes or b"\r" in chunk:
            return None
        if chunk.startswith(b"data: ") and chunk.find(b"\n") == len(chunk) - 2:  # one event of one line
            return [(now_ns, chunk[6:-2].decode("utf-8", errors="replace"))]
        blocks = chunk[:-2].decode("utf-8", errors="replace").split("\n\n")  # blank lines are ASCII: the
        for block in blocks:                                                   # same text as event by event
            if not block.startswith("data: ") or "\n" in block:
                return None
        return [(now_ns, block[6:]) for block in blocks]

    def _overflow(self, what: str) -> list[tuple[int, str]]:
        self.overflow = f"{what} over {self.max_event_bytes} bytes (target.max_event_bytes)"
        self._buf, self._data, self._has_data = b"", [], False
        return []

    def pending(self) -> bool:
        """Bytes or data lines not yet dispatched (a stream that ends here was cut mid-event)."""
        return bool(self._buf.strip() or self._has_data or self._lead)
