"""Keep secrets (API keys, sensitive header values) out of logs, records and reports."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

SENSITIVE_HEADER = re.compile(r"authorization|api[-_]?key|token|secret|cookie|password", re.IGNORECASE)
MASK = "***"


class Redactor:
    def __init__(self, secrets: list[str] | None = None) -> None:
        self.secrets = sorted({s for s in secrets or [] if len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str | None) -> str | None:
        if text is None:
            return None
        for secret in self.secrets:
            text = text.replace(secret, MASK)
        return text


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if SENSITIVE_HEADER.search(k) else v) for k, v in headers.items()}


def url_secrets(url: str | None) -> list[str]:
    """The secret parts of a URL: the password of ``user:password@`` and sensitive query values (``?api_key=``)."""
    if not url or "://" not in url:
        return []
    parts = urlsplit(url)
    found = [parts.password] if parts.password else []
    return found + [v for k, v in parse_qsl(parts.query) if SENSITIVE_HEADER.search(k) and v]


def redact_url(url: str | None) -> str | None:
    """``url`` with its secret parts masked, for run.json, reports and the console."""
    if url is None:
        return None
    for secret in sorted(url_secrets(url), key=len, reverse=True):
        url = url.replace(secret, MASK)
    return url
