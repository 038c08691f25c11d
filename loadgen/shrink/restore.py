"""Where a reproduction takes each value run.json masked (docs/shrink.md, "A target that authenticates").

run.json never holds a secret: a sensitive header's value, a URL's password, anything the redactor knows or
that reads as one (``Bearer …`` in a header of any name, a registered key in ``extra_body``) is masked there
(``***``), and run.json's ``masked`` lists each field it masked with the ``${VAR}`` text the scenario gave it
(``core.secrets.masked_fields``). A reproduction (scenario.yaml, its confirmation runs, repro.py) takes each such
value from the environment as the run did: the field's ``${VAR}`` text goes back in its place, never the masked
record. A masked header with no such text (a literal in the scenario file, or a run.json written before
``masked`` was kept) is read from ``LOADGEN_HEADER_<NAME>``; any other masked value the reproduction sends with
no known source is refused (``ShrinkError``: exit 2), naming the field.
"""

from __future__ import annotations

import copy
import os
import re
from typing import Any

from pydantic import BaseModel

from loadgen.core.secrets import MASK, register
from loadgen.plan.scenario import Scenario
from loadgen.shrink.event import ShrinkError

Path_ = tuple[str | int, ...]
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")  # as plan/scenario_file.py expands them


def header_env(name: str) -> str:
    """The environment variable a masked header's value is read from when the scenario gave it no ``${VAR}``."""
    return "LOADGEN_HEADER_" + re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_").upper()


def dotted(field: Path_) -> str:
    return ".".join(str(part) for part in field)


def sources(info: dict[str, Any], scenario: Scenario) -> dict[Path_, str]:
    """Each field of the target run.json masked (``("target", "headers", "Helicone-Auth")``) → the ``${VAR}``
    text a reproduction takes its value from; ShrinkError naming a field whose source is not known."""
    entries = info.get("masked")
    if not isinstance(entries, list):  # a run.json from before ``masked`` was kept: what shows the mask
        entries = [{"field": ["target", *p], "from": None}
                   for p, text in _strings(scenario.target.model_dump(mode="json")).items() if MASK in text]
    out: dict[Path_, str] = {}
    for entry in entries:
        field: Path_ = tuple(entry.get("field") or ()) if isinstance(entry, dict) else ()
        if field[:1] != ("target",) or len(field) < 2:
            continue  # a field the reproduction does not send (its workload is the trace's own)
        if isinstance(entry.get("from"), str):
            out[field] = entry["from"]
        elif field[1] == "headers" and len(field) == 3:
            out[field] = "${" + header_env(str(field[2])) + "}"
        else:
            raise ShrinkError(f"run.json masks {dotted(field)} (it held a secret) and does not say which "
                              "environment variable it came from, so a reproduction cannot send it: give it as "
                              "${VAR} in the scenario and run it again")
    return out


def restored(scenario: Scenario, found: dict[Path_, str]) -> Scenario:
    """``scenario`` (run.json's) with each masked field's ``${VAR}`` text in its place (written into
    scenario.yaml as is: loadgen expands it when a confirmation loads the file)."""
    updates: dict[str, Any] = {}
    for field, text in found.items():
        name = str(field[1])
        current = getattr(scenario.target, name, None)
        if isinstance(current, BaseModel) or (current is None and len(field) > 2):
            raise ShrinkError(f"run.json masks {dotted(field)}: a reproduction cannot put its ${{VAR}} back there")
        if len(field) == 2:
            updates[name] = text
            continue
        value = updates.setdefault(name, copy.deepcopy(current))
        for key in field[2:-1]:
            value = value[key]
        value[field[-1]] = text
    return scenario.model_copy(update={"target": scenario.target.model_copy(update=updates)})


def variables(found: dict[Path_, str]) -> dict[str, list[str]]:
    """Each variable the reproduction reads that has no default → the fields it fills."""
    out: dict[str, list[str]] = {}
    for field, text in found.items():
        for m in ENV_REF.finditer(text):
            if m.group(2) is None:
                out.setdefault(m.group(1), []).append(dotted(field))
    return out


def check_and_register(found: dict[Path_, str], confirming: bool) -> None:
    """The variables' values registered with the redactor (they are secrets: nothing the shrink writes or prints
    shows them); when ``confirming``, ShrinkError naming each one that is not set."""
    needed = variables(found)
    register(*(os.environ.get(v) for v in needed))
    missing = [f"{v} ({', '.join(fields)})" for v, fields in needed.items() if not os.environ.get(v)]
    if confirming and missing:  # the confirmations would all fail with 401 (or unexpanded ${VAR})
        raise ShrinkError(f"the run's target takes secrets run.json masked: set {', '.join(missing)} to their values "
                          "(the written scenario.yaml refers to them), or --confirmations 0")


def body_templates(found: dict[Path_, str]) -> list[tuple[list[str | int], str]]:
    """Where in each request body a masked ``target.extra_body`` value goes (extra_body is merged into the body)
    and its ``${VAR}`` text: repro.py expands it there when it runs."""
    return [(list(field[2:]), text) for field, text in found.items() if field[1] == "extra_body" and len(field) > 2]


def unexpanded(bodies: list[dict[str, Any]], found: dict[Path_, str]) -> list[dict[str, Any]]:
    """The bodies (built from scenario.yaml, so each ``${VAR}`` expanded) with each masked value's ``${VAR}`` text
    back in its place: repro.py embeds them compressed, where the redactor cannot see a secret."""
    for body in bodies:
        for path, text in body_templates(found):
            _put(body, path, text)
    return bodies


def _put(node: Any, path: list[str | int], text: str) -> None:
    """``text`` in place of the value at ``path``, where there is one."""
    try:
        for key in path[:-1]:
            node = node[key]
        if path[-1] in node or isinstance(node, list):
            node[path[-1]] = text
    except (KeyError, IndexError, TypeError):
        pass


def env_fields(scenario: Scenario) -> dict[Path_, str]:
    """Each string of a (restored) scenario's target that a reproduction expands from the environment."""
    return {("target", *p): t for p, t in _strings(scenario.target.model_dump(mode="json")).items()
            if ENV_REF.search(t)}


def _strings(value: Any, path: Path_ = ()) -> dict[Path_, str]:
    if isinstance(value, str):
        return {path: value}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return {p: t for k, v in items for p, t in _strings(v, (*path, k)).items()}
