"""How deep a user's JSON or YAML may nest: MAX_NESTING levels of lists and objects (mappings), checked without
recursion, so a file nested thousands deep is one line naming the file and line (ScenarioError, exit 2), never a
RecursionError in the parser or in a later stage (the scenario's validation, ``str()`` of a value, a trace's
sub-agent walk). Real scenarios, datasets and traces nest under 20 levels (a JSON schema in ``extra_body``
among the deepest); Python's parsers recurse once or twice per level against a limit of 1,000 frames."""

from __future__ import annotations

import json
import re
from typing import Any

from loadgen.errors import ScenarioError

MAX_NESTING = 100  # levels of lists and objects in any JSON or YAML document loadgen reads from a user

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}\n]')  # a JSON string (skipped), a bracket, or a line end


def too_deep(where: str) -> ScenarioError:
    """The one error for every format: ``where`` is ``file:line`` (or a flag)."""
    return ScenarioError(f"{where}: nested more than {MAX_NESTING} levels deep (lists and objects); "
                         "flatten it")


def depth(value: Any, limit: int = MAX_NESTING) -> int:
    """Levels of lists and dicts in ``value`` (a scalar: 0), counted breadth-first without recursion; stops
    (returning ``limit + 1``) once past ``limit``, so a self-containing list ends too."""
    level, levels = [value], 0
    while True:
        level = [v for v in level if isinstance(v, (list, dict))]
        if not level:
            return levels
        levels += 1
        if levels > limit:
            return levels
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v)]


def deep_line(text: str) -> int | None:
    """The 1-based line of ``text`` (JSON) where its nesting first passes MAX_NESTING; None if it never does."""
    line, levels = 1, 0
    for m in _TOKEN.finditer(text):
        c = m.group()
        if c == "\n":
            line += 1
        elif c in "[{":
            levels += 1
            if levels > MAX_NESTING:
                return line
        elif c in "]}":
            levels -= 1
        else:
            line += c.count("\n")  # not in valid JSON, but the line count stays right
    return None


def loads(text: str, where: str, line: int | None = None) -> Any:
    """``json.loads``, refusing a document nested past MAX_NESTING: ScenarioError naming ``where`` and the line
    (``line`` when the caller knows it, a JSONL's; 0 for none, a value inside a record; None: found in
    ``text``). A document that is not JSON: json's JSONDecodeError."""
    try:
        value = json.loads(text)
    except RecursionError:
        value = None  # deeper than the parser goes: past MAX_NESTING by far
    else:
        if depth(value) <= MAX_NESTING:
            return value
    at = line if line is not None else deep_line(text)
    raise too_deep(f"{where}:{at}" if at else where)


__all__ = ["MAX_NESTING", "deep_line", "depth", "loads", "too_deep"]
