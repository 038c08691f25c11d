"""Keep secrets (API keys, sensitive header values) out of logs, records and reports."""

from __future__ import annotations

import re

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
