"""Two guards on a run's records as they come, for every driver: stopping a run that cannot succeed, and keeping
the evidence of what the server sent.

- ``FailFast``: when the first ``load.fail_fast_requests`` requests to end have all failed (cancelled ones do not
  count; one success disarms it), the run stops with the first error's message instead of running its whole
  duration against a server that fails everything. What was sent keeps its records.
- ``Captures``: ``--capture N`` keeps the raw bytes (status line, headers, body: up to 64 KiB each) of the first
  N failed responses as ``captures/NNN-seq<seq>.txt`` in the run directory, redacted: the values of sensitive
  headers (Set-Cookie, anything naming a key, token or password) masked, and every known secret masked in the
  rest (``core/secrets.py``), so a user can see what the server really sent.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Callable

from loadgen.core.records import RequestRecord
from loadgen.core.secrets import MASK, SENSITIVE_HEADER, write_text

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


_HEADER = re.compile(r"^([!#$%&'*+.^_`|~0-9A-Za-z-]+):(.*)$")


def redact_raw(raw: bytes) -> str:
    """A response's raw bytes as text: bytes that are not UTF-8 escaped, sensitive header values masked (the
    known secrets are masked when the text is written)."""
    text = raw.decode("utf-8", errors="backslashreplace")
    head, sep, body = text.partition("\r\n\r\n")
    lines = []
    for line in head.split("\r\n"):
        found = _HEADER.match(line)
        lines.append(f"{found.group(1)}: {MASK}" if found and SENSITIVE_HEADER.search(found.group(1)) else line)
    return "\r\n".join(lines) + sep + body


class Captures:
    """Writes the raw bytes of the first ``limit`` failed responses into ``run_dir/captures/`` (thread-safe: the
    Locust driver calls it from its engine thread)."""

    def __init__(self, run_dir: Path, limit: int) -> None:
        self.dir, self.limit = run_dir / CAPTURE_DIR, limit
        self.written: list[Path] = []
        self._lock = threading.Lock()

    def __call__(self, record: RequestRecord, raw: bytes) -> None:
        with self._lock:
            if len(self.written) >= self.limit:
                return
            path = self.dir / f"{len(self.written) + 1:03d}-seq{record.seq}.txt"
            self.written.append(path)
        head = (f"# loadgen capture: request seq {record.seq} ({record.class_name}), {record.error_kind}: "
                f"{record.error_message}\n# the response as received ({len(raw)} bytes"
                f"{', cut at 64 KiB' if len(raw) >= 64 * 1024 else ''}; nothing received: empty)\n")
        try:
            self.dir.mkdir(exist_ok=True)
            write_text(path, head + redact_raw(raw))
        except OSError:
            pass  # a full disk: the records matter more; the run's flush reports it
