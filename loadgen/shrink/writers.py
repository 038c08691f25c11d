"""The files a shrink leaves in its output directory (``--out``, default ``RUN/shrink-<event>/``):

- ``trace.csv`` + ``scenario.yaml``: the reduced set as a loadgen trace (``load.arrival: trace``, columns
  ``timestamp_s`` from the first send, ``prompt_tokens``, ``output_tokens``: the server's own counts) against the
  run's target (the embedded simulator with the run's settings, or its URL): ``loadgen run scenario.yaml``
  replays exactly these requests. The victim is row ``victim_row`` (trace rows are sent in file order);
- ``repro.py``: the same requests from the standard library alone (``standalone.py`` with the data filled in):
  each request's body as loadgen sends it on the target (``bodies.py``, zlib + base64), generated words only
  when the target could not be prepared;
- ``shrink.json``: the event, the search (every set tried), the final set and the confirmations.
"""

from __future__ import annotations

import base64
import json
import re
import textwrap
import zlib
from pathlib import Path
from typing import Any, Sequence

import yaml

from loadgen.core.secrets import redact, write_text
from loadgen.plan.scenario import Scenario
from loadgen.plan.simulator_spec import CLIENT_FAULTS
from loadgen.shrink.bodies import Bodies
from loadgen.shrink.event import Event, Item
from loadgen.shrink.restore import ENV_REF, body_templates, dotted, env_fields, restored, sources

DATA_BLOCK = re.compile(r"# --- data \(written by loadgen shrink\) ---\n.*?# --- end of data ---\n", re.S)
PROMPTS_DOC = re.compile(r"^Prompts: .*?\n\n", re.S | re.M)
BLOB_LINE_CHARS = 100


def offsets_s(items: Sequence[Item]) -> list[float]:
    t0 = min(i.t_intended_ns for i in items)
    return [(i.t_intended_ns - t0) / 1e9 for i in items]


def role_of(item: Item, event: Event) -> str:
    return "victim" if item == event.victim else "culprit" if item.seq in event.culprits else "in flight"


def trace_csv(items: Sequence[Item]) -> str:
    rows = [f"{o:.9f},{i.prompt_tokens},{i.output_tokens}" for i, o in zip(items, offsets_s(items))]
    return "timestamp_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n"


def masked_headers(scenario: Scenario) -> dict[str, str]:
    """The headers a reproduction takes from the environment (a restored scenario's: ``restore.restored``) →
    the ``${VAR}`` text each is expanded from."""
    return {k: v for k, v in scenario.target.headers.items() if ENV_REF.search(v)}


def scenario_dict(scenario: Scenario, info: dict[str, Any], event: Event, run_dir: Path) -> dict[str, Any]:
    """The run's target (each value run.json masked as the ``${VAR}`` reference it came from: ``restore.py``),
    the trace as the load, one class forcing the trace's lengths."""
    scenario = restored(scenario, sources(info, scenario))
    target = scenario.target.model_dump(mode="json", exclude_defaults=True, exclude={"headers", "base_url"})
    embedded = bool((info.get("target") or {}).get("simulator"))
    headers = scenario.target.headers
    target = {"base_url": "embedded" if embedded else scenario.target.base_url, **target,
              **({"headers": headers} if headers else {})}
    if not embedded:
        target.pop("simulator", None)
    faults = (target.get("simulator") or {}).get("faults") or {}
    for name in CLIENT_FAULTS:  # the run's slow-client blocks are not the event: a reproduction sends on time
        faults.pop(name, None)
    load = scenario.load
    cache_bust = any(c.cache_bust for c in scenario.workload.classes)
    return {"name": f"shrink-{scenario.name}-{event.label}"[:80],
            "description": f"{event.label} of {run_dir} ({event.gap_ms:.0f} ms gap), reduced by loadgen shrink",
            "target": target, "seed": scenario.seed,
            "load": {"arrival": "trace", "trace": {"path": "trace.csv"}, "max_in_flight": load.max_in_flight,
                     "drain_timeout_s": load.drain_timeout_s, "fail_fast_requests": 0},
            "workload": {"classes": [{"name": "shrink", "prompt_tokens": {"dist": "fixed", "value": 1},
                                      "output_tokens": {"dist": "fixed", "value": 1}, "ignore_eos": True,
                                      **({"cache_bust": True} if cache_bust else {})}]}}


def write_scenario(out: Path, scenario: Scenario, info: dict[str, Any], event: Event, items: Sequence[Item],
                   run_dir: Path) -> Path:
    """trace.csv and scenario.yaml in ``out``; the scenario's path."""
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "trace.csv", trace_csv(items))
    head = (f"# Written by loadgen shrink from {run_dir} ({event.label}): {len(items)} requests; the victim is "
            f"trace row {items.index(event.victim)}.\n# Replays them against the run's target: loadgen run "
            f"{out / 'scenario.yaml'}\n")
    body = yaml.safe_dump(scenario_dict(scenario, info, event, run_dir), sort_keys=False, width=110)
    write_text(out / "scenario.yaml", head + body)
    return out / "scenario.yaml"


def script_text(info: dict[str, Any], scenario: Scenario, event: Event, items: Sequence[Item], share: float,
                url: str, bodies: Bodies | None = None) -> str:
    """repro.py: standalone.py's code with this shrink's requests in its data block, and ``bodies`` (loadgen's
    own request bodies, ``bodies.py``) where they were built; its docstring says which prompts it sends."""
    bodies = bodies or Bodies(why="not built")
    found = sources(info, scenario)
    scenario = restored(scenario, found)
    api = scenario.target.api if scenario.target.api in ("chat", "completions") else "chat"
    reqs = [{"offset_s": round(o, 9), "prompt_tokens": i.prompt_tokens, "output_tokens": i.output_tokens,
             "role": role_of(i, event)} for i, o in zip(items, offsets_s(items))]
    data = "\n".join([
        "# --- data (written by loadgen shrink) ---",
        *server_hint(scenario, info),
        f"URL = {url!r}  # the base URL, /v1 included (as loadgen's target.base_url)",
        f"MODEL = {str((info.get('target') or {}).get('model') or scenario.target.model)!r}",
        f"API = {api!r}  # chat: URL/chat/completions; completions: URL/completions",
        f"METRIC = {event.metric!r}  # chunk_gap_ms: the victim's worst chunk gap; ttft_ms: its TTFT",
        f"ORIGINAL_GAP_MS = {event.gap_ms!r}  # the victim's gap (or TTFT) in the original run ({event.label})",
        f"SHARE = {share!r}  # reproduced: the victim's worst gap >= SHARE x ORIGINAL_GAP_MS",
        f"VICTIM = {items.index(event.victim)}  # index in REQUESTS",
        f"API_KEY_ENV = {scenario.target.api_key_env!r}  # the scenario's target.api_key_env: Bearer $API_KEY_ENV",
        f"HEADERS = {_plain_headers(scenario)!r}  # the scenario's target.headers that hold no secret",
        f"HEADER_ENVS = {masked_headers(scenario)!r}  # header → its (secret) value's ${{VAR}} reference",
        f"BODY_ENVS = {body_templates(found)!r}  # a body field (its path) → its (secret) value's ${{VAR}}",
        f"TEMPLATE_TOKENS = {6 if api == 'chat' else 0}  # what the chat template adds to one user message",
        f"PROMPTS = {prompts_mode(bodies)!r}  # exact: BODIES, each prompt of its exact length on this target; "
        "approximate:",
        "# BODIES, lengths from a fit to the server's usage (no tokenizer loadgen could use); words: generated words",
        "BODIES_ZB64 = (  # zlib + base64 of a JSON list: each request's body as loadgen sent it (\"\": none)",
        *([f'    "{line}"' for line in blob_lines(bodies)] or ['    ""']),
        ")",
        "REQUESTS: list[dict[str, Any]] = [  # offset_s: from the first send; lengths as the server counted them",
        *[f"    {json.dumps(r)}," for r in reqs],
        "]",
        "# --- end of data ---", ""])
    template = (Path(__file__).parent / "standalone.py").read_text(encoding="utf-8")
    template = PROMPTS_DOC.sub(lambda _: prompts_doc(bodies), template, count=1)
    return DATA_BLOCK.sub(lambda _: data, template, count=1)


def _plain_headers(scenario: Scenario) -> dict[str, str]:
    envs = masked_headers(scenario)
    return {k: v for k, v in scenario.target.headers.items() if k not in envs}


def auth_line(scenario: Scenario) -> str | None:
    """One line for shrink's output naming the variables scenario.yaml and repro.py read a secret from."""
    names = [f"{m.group(1)} ({dotted(field)})" for field, text in sorted(env_fields(scenario).items(), key=str)
             for m in ENV_REF.finditer(text)]
    if scenario.target.api_key_env:
        names.append(f"{scenario.target.api_key_env} (the API key)")
    if not names:
        return None
    return ("the target authenticates: scenario.yaml and repro.py read " + ", ".join(names) + " from the "
            "environment (repro.py also takes --header 'Name: value'); no secret is written")


def prompts_mode(bodies: Bodies) -> str:
    return "words" if not bodies.built else "exact" if bodies.exact else "approximate"


def blob_lines(bodies: Bodies) -> list[str]:
    """The bodies as zlib + base64, cut into lines (adjacent string literals in the script)."""
    if not bodies.built:
        return []
    text = redact(json.dumps(bodies.bodies)) or ""  # compressed, no secret could be seen: none goes in
    blob = base64.b64encode(zlib.compress(text.encode(), 9)).decode("ascii")
    return [blob[k:k + BLOB_LINE_CHARS] for k in range(0, len(blob), BLOB_LINE_CHARS)]


def prompts_doc(bodies: Bodies) -> str:
    """The docstring's paragraph on this script's prompts."""
    if not bodies.built:
        return paragraph("Prompts: generated words (PROMPTS = 'words'): " + bodies.why + ", so loadgen's own bodies "
                         "are not here. Request i's user message is a unique tag then words, one per token minus the "
                         "chat template's tokens (TEMPLATE_TOKENS): exact on loadgen's simulator, only about one "
                         "token a word on a real tokenizer (a real server may count several times more).")
    how = ("each prompt has exactly its prompt_tokens" if bodies.exact else
           "the lengths are approximate, as in the run")
    return paragraph("Prompts: BODIES_ZB64 holds each request's JSON body exactly as loadgen's confirmation runs sent "
                     f"it (zlib + base64 of a JSON list); its prompts were counted by {bodies.counter}, and {how}. "
                     "The script sends each body byte for byte (--model replaces its model).")


def paragraph(text: str) -> str:
    return textwrap.fill(text, 116, break_on_hyphens=False) + "\n\n"


def prompts_line(bodies: Bodies) -> str:
    """One line for shrink's output on the prompts in repro.py."""
    if not bodies.built:
        return f"repro.py's prompts are generated words (about one token a word): {bodies.why}"
    exact = "exact lengths" if bodies.exact else "approximate lengths, as in the run"
    return f"repro.py sends loadgen's own bodies ({exact}; counted by {bodies.counter})"


def server_hint(scenario: Scenario, info: dict[str, Any]) -> list[str]:
    """Comment lines: how to start the run's target when it was the embedded simulator."""
    if not (info.get("target") or {}).get("simulator"):
        return []
    spec = scenario.target.simulator
    sets = " ".join(f"--set {k}={json.dumps(v)}" for k, v in spec.overrides().items())
    return ["# The run's target was loadgen's simulator; start it (from a loadgen checkout) with:",
            f"#   python -m local_target.sim --preset {spec.preset_name} --port 8000 {sets}".rstrip()]


def write_script(out: Path, text: str) -> Path:
    path = out / "repro.py"
    write_text(path, text)
    path.chmod(0o755)
    return path


def write_json(out: Path, doc: dict[str, Any]) -> Path:
    path = out / "shrink.json"
    write_text(path, json.dumps(doc, indent=2) + "\n")
    return path
