"""Keep secrets (API keys, sensitive header values, passwords in URLs) out of everything that leaves the process.

One choke point, ``REDACTOR``: every secret the run knows is registered with it (``register``: the API key read
from the environment, sensitive header values, a URL's password and key-like query values), and it also masks
what looks like a secret before anything is registered (``user:password@`` in any URL, ``?api_key=…`` query
values, ``Bearer …`` tokens). Everything leaving the process passes through it:

- the console, stderr and log handlers: ``install_output_redaction()`` wraps ``sys.stdout`` and ``sys.stderr``
  at start-up (rich, print, logging and the crash handler all write through them);
- files: every text file loadgen writes goes through ``write_text`` (run.json, summary.json/md, junit.xml,
  report.html, compare, history, crash reports);
- records: ``RecordSink.add`` redacts each request's ``error_message`` before it is buffered (and clips it
  after: redaction always sees the whole message), and every other string of the record (a server's chunk
  ``id`` and ``finish_reason`` are the server's to choose: one may echo the key there).

A secret is masked in every spelling a text may give it: as itself, or with any of its characters escaped as
JSON writes them (``\\/`` as PHP does, ``\\u002B`` as .NET does, a UTF-16 pair), as HTML's numeric references
(``&#43;``) or URL percent-encoding (``%2B``) write them, in any mix (``spelled``): a captured body that echoes a
base64-style key (``/``, ``+``, ``=``) escaped is masked, and so is the head of one cut inside an escape.

Text that is cut short anywhere in loadgen is cut with ``clip``, which marks the cut with ``CUT`` (…): a secret
cut in two leaves its head before the mark, and the redactor masks the longest head of any known secret there, so
not even a piece of a key survives a cut (a message that echoes the key is clipped in the core, before the
redactor sees it).
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qsl, urlsplit

# a header (or query parameter) whose value is a secret: any authorization, an API key, a header named "key" as a
# whole word (Ocp-Apim-Subscription-Key, X-Functions-Key, X-Auth-Key), tokens, secrets, cookies, passwords,
# credentials; Keep-Alive, X-Hotkey and the like are not
SENSITIVE_HEADER = re.compile(
    r"authori[sz]ation|api[-_]?key|(?:^|[-_])key(?:[-_]|$)|token|secret|cookie|passw(?:or)?d|credential", re.IGNORECASE)
MASK = "***"
CUT = "\u2026"  # …: where ``clip`` cut a text
# The mark as json.dumps writes it by default (ensure_ascii: summary.json, run.json, check --json, the report's
# inlined data): the redactor sees the text after serialisation, so a cut key's head must be masked there too.
CUT_ESCAPED = "\\u2026"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")  # patterns are masked inside URLs only
_URL_PASSWORD = re.compile(r"^([^:/]+://[^/@:]*:)[^@/]+@")
_QUERY_SECRET = re.compile(r"([?&](?:[^=&#]*[-_])?(?:api[-_]?key|key|token|secret|password|passwd|sig|signature|"
                           r"auth)=)[^&#]+", re.IGNORECASE)
_BEARER = re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]{4,}")


class Redactor:
    """Masks registered secrets and secret-looking patterns in text."""

    def __init__(self, secrets: list[str] | None = None) -> None:
        self.secrets: list[str] = []
        self._spelled: dict[str, re.Pattern[str]] = {}  # each secret in any of its spellings (``spelled``)
        self.register(*(secrets or []))

    def register(self, *secrets: str | None) -> None:
        """Remember these (values shorter than 4 characters are ignored: masking them would garble text)."""
        known = set(self.secrets) | {s for s in secrets if s and len(s) >= 4}
        self.secrets = sorted(known, key=len, reverse=True)
        self._spelled = {s: self._spelled.get(s) or spelled(s) for s in self.secrets}

    def __call__(self, text: str | None) -> str | None:
        if not text:
            return text
        escaped = _ESCAPED.search(text) is not None
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
            if escaped:  # as JSON, HTML or a URL may spell it: ``\/``, ``\u002B``, ``&#43;``, ``%2B``, any mix
                text = self._spelled[secret].sub(MASK, text)
        if "://" in text:
            text = _URL.sub(_mask_url, text)
        if "Bearer" in text:
            text = _BEARER.sub(rf"\1{MASK}", text)
        for mark in (CUT, CUT_ESCAPED):
            if mark in text and self.secrets:
                pieces = text.split(mark)
                text = mark.join([*(self._mask_head(piece) for piece in pieces[:-1]), pieces[-1]])
        return text

    def _mask_head(self, piece: str) -> str:
        """``piece`` (a text that was cut right after it) with the longest head of any known secret at its end
        masked. The longest over all the secrets: another secret that merely shares the last character or two
        must not win and leave the real key's head in place (every match ends where the piece ends, so the
        longest covers the others). Any length counts, one character too: a short accidental match masks a
        character or two of ordinary text, which is ugly but safe; a key's head left in place is a leak."""
        tail, starts = _decoded_tail(piece, max((len(s) for s in self.secrets), default=0))
        longest = max((_head_length(tail, secret) for secret in self.secrets), default=0)
        return piece[:starts[-longest]] + MASK if longest else piece


def _head_length(piece: str, secret: str) -> int:
    """The length of the longest head (proper prefix) of ``secret`` that ``piece`` ends with; 0: none."""
    for k in range(min(len(secret) - 1, len(piece)), 0, -1):
        if piece.endswith(secret[:k]):
            return k
    return 0


# Where a text may spell a character other than as itself: JSON's escapes (RFC 8259 §7: ``\uXXXX``, a UTF-16
# pair past U+FFFF, ``\/`` as PHP writes it, ``\"``, ``\\``, ``\n``…), HTML's numeric character references
# (``&#43;``, ``&#x2B;``: WHATWG HTML §13.1.4) and URL percent-encoding (``%2B``: RFC 3986 §2.1).
_ESCAPED = re.compile(r"\\[u\"\\/bfnrt]|&#|%[0-9A-Fa-f]{2}")  # only these can spell a character otherwise
_JSON_SHORT = {"\\b": "\b", "\\f": "\f", "\\n": "\n", "\\r": "\r", "\\t": "\t"}
_ONE_SPELLING = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}"
                           r"|\\[\"\\/bfnrt]|&#[xX][0-9a-fA-F]{1,6};|&#[0-9]{1,7};|(?:%[0-9a-fA-F]{2})+|.", re.S)
_PARTIAL = re.compile(r"(?:\\(?:u[0-9a-fA-F]{0,3})?|&(?:#(?:[xX][0-9a-fA-F]{0,6}|[0-9]{0,7}))?|%[0-9a-fA-F]?)\Z")


def spelled(secret: str) -> re.Pattern[str]:
    """A pattern matching ``secret`` however a text spells each of its characters: as itself, or escaped as
    JSON, HTML or a URL would escape it (``_ESCAPED``; hexadecimal digits in either case), in any mix."""
    return re.compile("".join(_char_spellings(c) for c in secret))


def _char_spellings(char: str) -> str:
    units = char.encode("utf-16-be")
    forms = [re.escape(char), "(?i:" + "".join(rf"\\u{units[k:k + 2].hex()}" for k in range(0, len(units), 2)) + ")",
             f"&#0*{ord(char)};", f"&#[xX]0*(?i:{ord(char):x});",
             "(?i:" + "".join(f"%{b:02x}" for b in char.encode("utf-8", "surrogatepass")) + ")"]
    forms += [re.escape(k) for k, v in _JSON_SHORT.items() if v == char]
    if char in '"\\/':
        forms.append(re.escape("\\" + char))
    return "(?:" + "|".join(forms) + ")"


def _decoded_tail(piece: str, chars: int) -> tuple[str, list[int]]:
    """The last ``chars`` characters ``piece`` spells (its escapes undone, a partial escape at its very end
    left out), and where each begins in ``piece``: the head of a secret cut in its escaped spelling is found
    as its characters, and masked from where its first one begins."""
    partial = _PARTIAL.search(piece, max(0, len(piece) - 10))  # the longest partial escape: 9 (&#x10FFFF)
    end = partial.start() if partial else len(piece)
    start = max(0, end - 12 * chars - 12)  # the longest spelling of a character: 12 (a pair of \uXXXX)
    chars_out, starts = [], []
    for found in _ONE_SPELLING.finditer(piece, start, end):
        text = _unescape(found.group(0))
        chars_out.append(text)
        starts += [found.start()] * len(text)
    return "".join(chars_out), starts


def _unescape(spelling: str) -> str:
    if len(spelling) == 1:
        return spelling
    if spelling.startswith("\\u"):
        return bytes.fromhex(spelling.replace("\\u", "")).decode("utf-16-be", "surrogatepass")
    if spelling.startswith("\\"):
        return _JSON_SHORT.get(spelling, spelling[1])
    if spelling.startswith("&#"):
        code = int(spelling[3:-1], 16) if spelling[2] in "xX" else int(spelling[2:-1])
        return chr(code) if code < 0x110000 else spelling
    return bytes.fromhex(spelling.replace("%", "")).decode("utf-8", "surrogateescape")


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the cut marked with ``CUT`` (the redactor then masks the head of
    a secret left before it)."""
    return text if len(text) <= limit else text[:limit] + CUT


def _mask_url(found: re.Match[str]) -> str:
    """A URL with its password and key-like query values masked (``user:pw@``, ``?api_key=``, ``&token=``)."""
    url = _URL_PASSWORD.sub(rf"\1{MASK}@", found.group(0))
    return _QUERY_SECRET.sub(rf"\1{MASK}", url) if "=" in url else url


REDACTOR = Redactor()


def register(*secrets: str | None) -> None:
    REDACTOR.register(*secrets)


def redact(text: str | None) -> str | None:
    return REDACTOR(text)


def redact_headers(headers: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if SENSITIVE_HEADER.search(k) else v) for k, v in headers.items()}


def url_secrets(url: str | None) -> list[str]:
    """The secret parts of a URL: the password of ``user:password@`` and sensitive query values (``?api_key=``)."""
    if not url or "://" not in url:
        return []
    try:
        parts = urlsplit(url)
        found = [parts.password] if parts.password else []
    except ValueError:
        return []
    return found + [v for k, v in parse_qsl(parts.query) if SENSITIVE_HEADER.search(k) and v]


def redact_url(url: str | None) -> str | None:
    """``url`` with its secret parts masked, for run.json, reports and the console."""
    if url is None:
        return None
    for secret in sorted(url_secrets(url), key=len, reverse=True):
        url = url.replace(secret, MASK)
    return REDACTOR(url)


def write_text(path: Path, text: str) -> None:
    """Write a text file that leaves the process (every report and record-side text file), redacted; whole or
    not at all (written aside, then renamed: a reader or a crash never sees half a run.json)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(REDACTOR(text) or "", encoding="utf-8")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes(path: Path, data: bytes) -> None:
    """``write_text`` for UTF-8 bytes (junit.xml)."""
    write_text(path, data.decode("utf-8"))


class RedactingStream(io.TextIOBase):
    """A text stream that redacts every write before passing it on (stdout/stderr)."""

    def __init__(self, inner: IO[str]) -> None:
        self._inner = inner

    def write(self, text: str | bytes) -> int:
        if isinstance(text, (bytes, bytearray)):  # click's echo probes for a binary writer with bytes
            self._inner.write(REDACTOR(bytes(text).decode("utf-8", errors="replace")) or "")
            return len(text)
        self._inner.write(REDACTOR(text) or "")
        return len(text)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._inner, "encoding", "utf-8")

    @encoding.setter
    def encoding(self, value: str) -> None:  # read-only, as on io's own streams (typeshed declares it writable)
        raise AttributeError("readonly attribute")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def install_output_redaction() -> None:
    """Route stdout and stderr through the redactor (once, before anything holds a reference to them)."""
    if not isinstance(sys.stdout, RedactingStream):
        sys.stdout = RedactingStream(sys.stdout)
    if not isinstance(sys.stderr, RedactingStream):
        sys.stderr = RedactingStream(sys.stderr)


def masked_fields(sent: Any, shown: Any, refs: dict[tuple[str | int, ...], str],
                  path: tuple[str | int, ...] = ()) -> list[dict[str, Any]]:
    """Each string of ``sent`` (a scenario as loaded, a JSON-like tree) that ``shown`` (the same tree as run.json
    writes it: sensitive headers and URLs' secrets masked) shows masked, or that the redactor masks: its path
    and the ``${VAR}`` text the scenario gave it (``refs``; None: none), for a replay to take it from the
    environment as the run did (loadgen shrink), never from the masked record."""
    if isinstance(sent, str):
        written = REDACTOR(shown) if isinstance(shown, str) else None  # as run.json will hold it
        return [{"field": list(path), "from": _source(refs.get(path), written)}] if written != sent else []
    if isinstance(sent, dict) and isinstance(shown, dict):
        return [m for k, v in sent.items() for m in masked_fields(v, shown.get(k), refs, (*path, k))]
    if isinstance(sent, list) and isinstance(shown, list) and len(sent) == len(shown):
        return [m for i, (v, w) in enumerate(zip(sent, shown)) for m in masked_fields(v, w, refs, (*path, i))]
    return []


_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")  # ${VAR}, ${VAR:-default} (plan/scenario_file.py)


def _source(ref: str | None, shown: Any) -> str | None:
    """The ``${VAR}`` text a masked value came from, its defaults dropped (a default may be the secret itself);
    None unless masking left nothing but its references (a literal beside them may be a secret too)."""
    if ref is None:
        return None
    bare = _REF.sub(lambda m: "${" + m.group(1) + "}", ref)
    return bare if _REF.sub(MASK, bare) == shown else None
