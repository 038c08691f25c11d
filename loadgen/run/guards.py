"""Two guards on a run's records as they come, for every driver: stopping a run that cannot succeed, and keeping
the evidence of what the server sent.

- ``FailFast``: when the first ``load.fail_fast_requests`` requests to end have all failed (cancelled ones do not
  count; one success disarms it), the run stops with the first error's message instead of running its whole
  duration against a server that fails everything. What was sent keeps its records.
- ``Captures``: ``--capture N`` keeps the first N failed responses as ``captures/NNN-seq<seq>.txt`` in the run
  directory, as text a person reads: the status line and headers as received (interim 1xx heads too), then the
  body as loadgen read it, de-chunked and decoded (Transfer-Encoding and Content-Encoding undone:
  ``drivers/http_conn.py``), up to ``CAPTURE_BYTES`` (64 KiB) each, a longer one cut with the ``CUT`` mark (…).
  Redacted: the values of sensitive headers (Set-Cookie, anything naming a key, token or password) masked, and
  every known secret masked in the rest (``core/secrets.py``), the head of one that the cut split too, in any
  spelling the body gives it (raw, JSON-escaped as ``\\/`` or ``\\u002B``, an HTML reference, percent-encoded,
  any mix: a gateway's JSON escapes a base64 key's ``/`` and ``+``). On the wire bytes the redactor could miss
  a key: split by chunk-size lines, or compressed.
"""

from __future__ import annotations

import codecs
import re
import threading
from pathlib import Path
from typing import Callable

from loadgen.core.records import RequestRecord
from loadgen.core.secrets import CUT, MASK, SENSITIVE_HEADER, write_text
from loadgen.drivers.wire_capture import CAPTURE_BYTES

CAPTURE_DIR = "captures"


class FailFast:
    """Trips (calls ``stop`` once, with the reason) when the first ``first_n`` requests to end all failed."""

    def __init__(self, first_n: int, stop: Callable[[str], None]) -> None:
        self.first_n, self.stop = first_n, stop
        self.failed = 0
        self.first_error: str | None = None
        self.reason: str | None = None  # set when it tripped
        self._armed = first_n > 0

    def observe(self, record: RequestRecord) -> None:
        if not self._armed or record.error_kind == "cancelled":
            return
        if record.error_kind is None:
            self._armed = False  # a request succeeded: the server can answer
            return
        self.failed += 1
        if self.first_error is None:
            status = f" (HTTP {record.http_status})" if record.http_status and record.http_status != 200 else ""
            self.first_error = f"{record.error_kind}{status}: {record.error_message}"
        if self.failed >= self.first_n:
            self._armed = False
            self.reason = (f"stopped early: the first {self.failed} requests all failed "
                           f"(load.fail_fast_requests); the first: {self.first_error}")
            self.stop(self.reason)


_FIELD = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):[^\r\n]*", re.MULTILINE)  # a header field line (RFC 9112 §5)
_HEAD_END = re.compile(r"\r?\n\r?\n")  # the blank line that ends a head


def redact_raw(raw: bytes) -> str:
    """A captured response (``StreamContext.raw``: its heads as received, then its body) as text: bytes that are
    not UTF-8 escaped, sensitive header values masked in every head (a 1xx's, a redirect's that was followed, the
    final one's); the known secrets are masked when the text is written. More than ``CAPTURE_BYTES``: cut there,
    the cut marked with ``CUT`` (the redactor masks the head of a secret left before it)."""
    cut = len(raw) > CAPTURE_BYTES  # the transport keeps one byte more than it may: there was more
    text = codecs.getincrementaldecoder("utf-8")("backslashreplace").decode(raw[:CAPTURE_BYTES], final=not cut)
    out, rest = [], text  # a character the cut split is left out (not escaped: a key's head stays whole)
    while True:
        head, end, rest = _split_head(rest)
        out.append(_FIELD.sub(_mask_field, head) + end)
        if not end or not rest.startswith("HTTP/"):  # the final head: the body follows
            return "".join(out) + rest + (CUT if cut else "")


def _split_head(text: str) -> tuple[str, str, str]:
    found = _HEAD_END.search(text)
    return (text[:found.start()], found.group(0), text[found.end():]) if found else (text, "", "")


def _mask_field(found: re.Match[str]) -> str:
    return f"{found.group(1)}: {MASK}" if SENSITIVE_HEADER.search(found.group(1)) else found.group(0)


class Captures:
    """Writes the first ``limit`` failed responses (as captured: ``redact_raw``) into ``run_dir/captures/``
    (thread-safe: the Locust driver calls it from its engine thread); ``written``: the files that were written."""

    def __init__(self, run_dir: Path, limit: int) -> None:
        self.dir, self.limit = run_dir / CAPTURE_DIR, limit
        self.written: list[Path] = []  # only files that were written (the run's note names them)
        self._taken = 0  # numbers handed out (a capture that could not be written keeps its number)
        self._lock = threading.Lock()

    def __call__(self, record: RequestRecord, raw: bytes) -> None:
        with self._lock:
            if self._taken >= self.limit:
                return
            self._taken += 1
            path = self.dir / f"{self._taken:03d}-seq{record.seq}.txt"
        kept = f"its first {CAPTURE_BYTES // 1024} KiB, the cut marked" if len(raw) > CAPTURE_BYTES else "whole"
        head = (f"# loadgen capture: request seq {record.seq} ({record.class_name}), {record.error_kind}: "
                f"{record.error_message}\n# the response ({kept}; nothing received: empty): the status line and "
                "headers as received (interim 1xx responses too), then the body as loadgen read it: de-chunked "
                "and decoded (Transfer-Encoding, Content-Encoding undone), not its bytes on the wire\n")
        try:
            self.dir.mkdir(exist_ok=True)
            write_text(path, head + redact_raw(raw))
        except OSError:
            return  # a full disk: the records matter more; the run's flush reports it
        with self._lock:
            self.written.append(path)
