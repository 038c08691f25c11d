"""What a person sees of each chart, read from the page in chromium: the boxes of every axis's tick labels and
of the marks in every plot area (Vega's SVG renderer: ``g.role-axis``, ``g.role-axis-label text``,
``g.role-mark``), and the two checks made on them — no two labels of one axis overlap or run together (less
than a digit's width apart on one line), no plot area is empty.

``GEOMETRY_JS`` runs in the page (``page.evaluate``); ``problems`` judges its answer. Labels Vega hid itself
(``labelOverlap``: opacity 0) do not count; a mark counts when its box has a width or a height (a rule is a
line)."""

from __future__ import annotations

import re
from typing import Any

GEOMETRY_JS = """() => {
  const shown = el => {
    for (let n = el; n && n.tagName !== 'svg'; n = n.parentElement) {
      const o = n.getAttribute && n.getAttribute('opacity');
      if (o !== null && o !== undefined && parseFloat(o) === 0) return false;
      const cs = getComputedStyle(n);
      if (cs.display === 'none' || cs.visibility === 'hidden' || parseFloat(cs.opacity) === 0) return false;
    }
    return true;
  };
  const box = el => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return Array.from(document.querySelectorAll('div.chart')).map(div => {
    const svg = div.querySelector('svg');
    if (!svg) return {id: div.id, svg: false, axes: [], views: [], texts: [], dashes: []};
    const axes = Array.from(svg.querySelectorAll('g.role-axis')).map(ax => {
      const title = ax.querySelector('g.role-axis-title text');
      const labels = Array.from(ax.querySelectorAll('g.role-axis-label text'))
        .filter(t => t.textContent.trim() !== '' && shown(t));
      return {title: title ? title.textContent : '', aria: ax.getAttribute('aria-label') || '',
              labels: labels.map(t => ({text: t.textContent, box: box(t)}))};
    });
    const views = new Map();
    svg.querySelectorAll('g.role-mark:not(.mark-group)').forEach(m => {
      const view = m.parentElement && m.parentElement.parentElement;
      if (!views.has(view)) views.set(view, {marks: 0, name: []});
      const v = views.get(view);
      v.name.push(m.getAttribute('class'));
      Array.from(m.children).forEach(item => {
        const r = item.getBoundingClientRect();
        if ((r.width > 0 || r.height > 0) && shown(item)) v.marks += 1;
      });
    });
    const texts = Array.from(svg.querySelectorAll('g.role-mark.mark-text text')).filter(shown)
      .map(t => ({text: t.textContent, box: box(t)}));
    const dashes = Array.from(svg.querySelectorAll('g.role-mark.mark-line path'))
      .map(l => l.getAttribute('stroke-dasharray') || 'solid');
    return {id: div.id, svg: true, axes: axes, views: Array.from(views.values()), texts: texts, dashes: dashes};
  });
}"""


def _gap(a: list[float], b: list[float], lo: int) -> float:
    """The gap between two boxes along one direction (lo 0: x, 1: y); negative where they overlap."""
    return max(a[lo], b[lo]) - min(a[lo + 2], b[lo + 2])


def run_together(a: list[float], b: list[float]) -> bool:
    """Two labels read as one: side by side (their heights overlap) with less than a digit's width between
    them (half the text's height), or stacked on top of each other."""
    height = max(a[3] - a[1], b[3] - b[1])
    if _gap(a, b, 1) < 0:  # on one line
        return _gap(a, b, 0) < 0.5 * height
    return _gap(a, b, 0) < 0 and _gap(a, b, 1) < 0


def overlapping_labels(axis: dict[str, Any]) -> list[tuple[str, str]]:
    labels = axis["labels"]
    return [(p["text"], q["text"]) for i, p in enumerate(labels) for q in labels[i + 1:]
            if run_together(p["box"], q["box"])]


def problems(charts: list[dict[str, Any]]) -> list[str]:
    """One line per fault: a chart without an SVG, two labels of one axis on top of each other, a plot area
    with no visible mark."""
    out = []
    for chart in charts:
        if not chart["svg"]:
            out.append(f"{chart['id']}: no svg")
            continue
        for axis in chart["axes"]:
            for a, b in overlapping_labels(axis):
                out.append(f"{chart['id']}: axis {axis['title']!r}: tick labels {a!r} and {b!r} run together")
        out += [f"{chart['id']}: empty plot area ({', '.join(v['name'])})" for v in chart["views"] if not v["marks"]]
        if not chart["views"]:
            out.append(f"{chart['id']}: no plot area")
    return out


def axis_labels(charts: list[dict[str, Any]], chart_id: str, title: str) -> list[list[str]]:
    """The visible tick labels of every axis titled ``title`` in chart ``chart_id`` (one list per axis)."""
    return [[lab["text"] for lab in axis["labels"]] for c in charts if c["id"] == chart_id
            for axis in c["axes"] if axis["title"] == title]


def mark_texts(charts: list[dict[str, Any]], chart_id: str) -> list[str]:
    """The text marks drawn in the chart (labels on lines and rules), not its axes or legends."""
    return [t["text"] for c in charts if c["id"] == chart_id for t in c["texts"]]


def line_dashes(charts: list[dict[str, Any]], chart_id: str) -> list[str]:
    """Each line's stroke-dasharray ("solid" for none)."""
    return [d for c in charts if c["id"] == chart_id for d in c["dashes"]]


def mark_boxes(charts: list[dict[str, Any]], chart_id: str, pattern: str) -> dict[str, list[float]]:
    """The boxes of the chart's text marks whose whole text matches ``pattern``."""
    return {t["text"]: t["box"] for c in charts if c["id"] == chart_id for t in c["texts"]
            if re.fullmatch(pattern, t["text"])}


def domains(charts: list[dict[str, Any]], chart_id: str, which: str) -> list[tuple[float, float]]:
    """The domain of each linear ``which`` ("X" or "Y") axis of the chart, from the axis's own description
    ("Y-axis ... for a linear scale with values from 99.5 to 100.5"): what the panel spans, whatever the
    ticks."""
    out = []
    for c in charts:
        for axis in c["axes"] if c["id"] == chart_id else []:
            m = re.search(rf"^{which}-axis.*linear scale with values from (\S+) to (\S+)$", axis["aria"])
            if m:
                out.append((_number(m.group(1)), _number(m.group(2))))
    return out


def _number(text: str) -> float:
    return float(text.replace(",", "").replace("−", "-"))
