"""What a response's head says beyond its status, read by ``http_conn.py``: a header's value and how its body is
framed (RFC 9112 §6.3). Pure functions over httptools' (name, value) pairs."""

from __future__ import annotations

NO_BODY_STATUSES = (204, 304)  # RFC 9112 §6.3 rules 1-2: no body whatever the head says


def header_value(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case), decoded as RFC 9110 §5.5 allows (ISO-8859-1); None: absent."""
    found = [v for k, v in headers if k.lower() == name]
    return found[0].decode("latin-1") if found else None


def ends_at_close(status: int, headers: list[tuple[bytes, bytes]]) -> bool:
    """The body ends when the connection closes: neither Content-Length nor Transfer-Encoding framed it (RFC 9112
    §6.3 rule 8)."""
    names = {k.lower() for k, _ in headers}
    return b"content-length" not in names and b"transfer-encoding" not in names and status not in NO_BODY_STATUSES
