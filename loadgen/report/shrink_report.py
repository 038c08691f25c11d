"""report.html's "Smallest reproduction" section: one entry per ``loadgen shrink`` of the run (RUN/shrink-*/
shrink.json, read by run/reporting.py ``load_shrinks``): the event, the final set, the replay's and the
confirmations' values and rate, relative links to the reproduction's files, and its before/after figure (the
Vega-Lite spec embedded as the page's other charts are, or figure.png where no spec could be read). Text only."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from loadgen.report.html import e, json_for_script


@dataclass(frozen=True)
class ShrinkEntry:
    folder: str  # the shrink's directory, relative to the run directory (report.html's links start there)
    doc: dict[str, Any]  # its shrink.json
    figure_spec: dict[str, Any] | None = None  # figure.vl.json, where readable
    has_png: bool = False  # figure.png is there


def _ms(value: Any) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:,.0f} ms"


def _link(folder: str, name: str) -> str:
    return f"<a href=\"{e(folder + '/' + name)}\">{e(name)}</a>"


def _final_set(rows: list[dict[str, Any]]) -> str:
    head = "<tr><th>seq</th><th>role</th><th>offset</th><th>prompt tokens</th><th>output tokens</th></tr>"
    body = "".join(f"<tr><td>{e(r.get('seq'))}</td><td>{e(r.get('role'))}</td><td>+{float(r.get('offset_s', 0)):.3f} s"
                   f"</td><td>{e(r.get('prompt_tokens'))}</td><td>{e(r.get('output_tokens'))}</td></tr>"
                   for r in rows)
    return f"<table>{head}{body}</table>"


def _confirmations(conf: dict[str, Any] | None, what: str) -> str:
    if not conf:
        return "not confirmed on the target (--confirmations 0): the virtual-time replay only"
    gaps = ", ".join(f"{g:,.0f}" for g in conf.get("gaps_ms") or [])
    rate = conf.get("rate")
    rate_txt = f" (rate {rate:.0%})" if isinstance(rate, (int, float)) else ""
    return (f"reproduced in {e(conf.get('reproduced'))} of {e(conf.get('runs'))} runs{rate_txt}, needs "
            f"{e(conf.get('needed'))} of {e(conf.get('asked'))}; victim's {what}: {e(gaps) or '–'} ms")


def _figure(entry: ShrinkEntry, key: str) -> str:
    if entry.figure_spec is not None:
        return (f"<div id=\"{key}\" class=\"chart\"></div><script type=\"application/json\" data-chart=\"{key}\">"
                f"{json_for_script(entry.figure_spec)}</script>")
    if entry.has_png:
        return f"<img src=\"{e(entry.folder + '/figure.png')}\" alt=\"before/after figure\">"
    return "<p class=\"note\">no figure was written</p>"


def _entry(entry: ShrinkEntry, index: int) -> str:
    doc = entry.doc
    ev = doc.get("event") or {}
    what = "TTFT" if ev.get("metric") == "ttft_ms" else "gap"
    victim = (ev.get("victim") or {}).get("seq")
    verdict = "reproduced" if doc.get("reproduced") else "NOT reproduced"
    files = [_link(entry.folder, n) for n in ("scenario.yaml", "repro.py", "shrink.json")]
    if entry.has_png:
        files.append(_link(entry.folder, "figure.png"))
    if entry.figure_spec is not None:
        files.append(_link(entry.folder, "figure.vl.json"))
    key = "shrink-" + re.sub(r"[^A-Za-z0-9_-]", "-", entry.folder) + f"-{index}"
    return (f"<section><h3>{e(ev.get('label', entry.folder))}: {verdict}</h3>"
            f"<p>request {e(victim)}'s {_ms(ev.get('gap_ms'))} {what} ({e(ev.get('cause') or 'no cause')}); "
            f"{e(len(doc.get('final_set') or []))} of {e(doc.get('seed_set'))} requests kept, "
            f"{e(doc.get('tries'))} replays ({e(doc.get('stopped'))}), threshold {_ms(doc.get('threshold_ms'))}.</p>"
            + _final_set(doc.get("final_set") or [])
            + f"<p>virtual-time replay: victim's {what} {_ms(doc.get('replay_gap_ms'))}; on the target: "
            f"{_confirmations(doc.get('confirmations'), what)}.</p>"
            f"<p>files: {', '.join(files)}</p>" + _figure(entry, key) + "</section>")


def shrink_section(entries: list[ShrinkEntry]) -> str:
    """The section, or "" for a run never shrunk."""
    if not entries:
        return ""
    return ("<section><h2>Smallest reproduction</h2><p class=\"note\">loadgen shrink's reductions of this run "
            "(docs/shrink.md); scenario.yaml runs with loadgen run, repro.py alone with Python.</p>"
            + "".join(_entry(x, i) for i, x in enumerate(entries)) + "</section>")
