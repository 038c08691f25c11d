"""A Prometheus text exposition (a server's ``/metrics``) → the series of ``engines.py``'s one vocabulary.
Pure: the scraper (drivers/scrape.py) fetches the text, this reads it."""

from __future__ import annotations

from typing import Mapping

from loadgen.core.engines import POWER_SCALE, POWER_SERIES, PREFIXES, SERIES
from loadgen.core.secrets import clip


def parse(text: str, series: Mapping[str, str] = SERIES, prefixes: tuple[str, ...] = PREFIXES,
          scale: Mapping[str, float] | None = None) -> dict[str, float]:
    """The series above (or ``series``: family → column, each sample times ``scale[family]`` where given) from one
    text exposition, summed over label sets (e.g. per model, engine or GPU).

    A line scan rather than prometheus_client's parser: vLLM's exposition is ~55 kB, mostly histogram buckets,
    which that parser takes ~12 ms to read (holding the GIL); this takes well under a millisecond, so it runs on
    the loop itself. Raises ValueError on a sample line of ours whose value is not a number."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(prefixes):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace != -1 and (space == -1 or brace < space):
            name, rest = line[:brace], line[line.rfind("}") + 1:]
        else:
            name, rest = line[:space], line[space:]
        key = series.get(name)
        if key is None:
            continue
        try:
            value = float(rest.split()[0])  # an optional timestamp may follow
        except (ValueError, IndexError):
            raise ValueError(f"bad sample line: {clip(line, 120)}") from None
        out[key] = out.get(key, 0.0) + value * (scale.get(name, 1.0) if scale else 1.0)
    return out


def parse_or_none(text: str) -> dict[str, float] | None:
    try:
        return parse(text)
    except ValueError:
        return None


def parse_power(text: str) -> dict[str, float] | None:
    """``gpu_power_w`` and ``gpu_energy_j`` of one GPU exporter's exposition, summed over its GPUs (label sets);
    None when a sample of theirs is not a number."""
    try:
        return parse(text, POWER_SERIES, tuple(POWER_SERIES), POWER_SCALE)
    except ValueError:
        return None
