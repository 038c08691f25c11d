"""A Prometheus text exposition (a server's ``/metrics``) → the series of ``engines.py``'s one vocabulary.
Pure: the scraper (drivers/scrape.py) fetches the text, this reads it."""

from __future__ import annotations

from loadgen.core.engines import PREFIXES, SERIES
from loadgen.core.secrets import clip


def parse(text: str) -> dict[str, float]:
    """The series above from one text exposition, summed over label sets (e.g. per model or engine).

    A line scan rather than prometheus_client's parser: vLLM's exposition is ~55 kB, mostly histogram buckets,
    which that parser takes ~12 ms to read (holding the GIL); this takes well under a millisecond, so it runs on
    the loop itself. Raises ValueError on a sample line of ours whose value is not a number."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(PREFIXES):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.rfind("}") + 1:]
        else:
            name, rest = line[:space], line[space:]
        key = SERIES.get(name)
        if key is None:
            continue
        try:
            value = float(rest.split()[0])  # an optional timestamp may follow
        except (ValueError, IndexError):
            raise ValueError(f"bad sample line: {clip(line, 120)}") from None
        out[key] = out.get(key, 0.0) + value
    return out


def parse_or_none(text: str) -> dict[str, float] | None:
    try:
        return parse(text)
    except ValueError:
        return None
