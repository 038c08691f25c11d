"""Secrets that gateways send back (issue 50): a key a server echoes JSON-escaped (``\\/`` as PHP writes it,
``\\u002B`` as .NET does) never reaches a ``--capture`` file; a key a server echoes in a chunk's ``id`` or
``finish_reason`` never reaches requests.parquet or any report; and ``loadgen shrink`` replays a secret from the
environment, as the run took it, never the masked value run.json holds."""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from hypothesis import given, strategies as st
from typer.testing import CliRunner

from loadgen import api
from loadgen.cli.app import app
from loadgen.core.secrets import CUT, Redactor, masked_fields
from tests.shape_server import SSE_HEAD, ShapeServer, chunk, event

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
KEY_ENV = "LOADGEN_GATEWAY_TEST_KEY"


def php(text: str) -> str:
    """As PHP's json_encode writes a string's inside: every / as \\/."""
    return json.dumps(text)[1:-1].replace("/", "\\/")


def dotnet(text: str) -> str:
    """As .NET's System.Text.Json writes it by default: + (and other HTML-sensitive characters) as \\u002B."""
    return "".join(f"\\u{ord(c):04X}" if c in "+<>&'`" else c for c in json.dumps(text)[1:-1])


def spellings(key: str) -> list[str]:
    """The key as a text may hold it: raw, and each escaped spelling a server or a writer gives it."""
    return [key, php(key), dotnet(key), php(dotnet(key)), json.dumps(key)[1:-1], key.replace("+", "%2B")]


def pieces(text: str, n: int = 8) -> set[str]:
    return {text[i:i + n] for i in range(len(text) - n + 1)}


# ---- the redactor: every spelling, any mix -------------------------------------------------------------------
def _spell(char: str, how: int) -> str:
    forms = [char, f"\\u{ord(char):04x}", f"\\u{ord(char):04X}", f"&#{ord(char)};", f"&#x{ord(char):X};",
             f"%{ord(char):02X}", "\\/" if char == "/" else char]
    return forms[how % len(forms)]


keys = st.text(alphabet=B64, min_size=8, max_size=48).map(lambda k: "sk-proj/" + k + "+A=")


@given(key=keys, hows=st.lists(st.integers(0, 6), min_size=60, max_size=60), before=st.text(max_size=20),
       after=st.text(max_size=20))
def test_a_key_is_masked_in_every_spelling_of_its_characters_in_any_mix(key: str, hows: list[int], before: str,
                                                                       after: str) -> None:
    """Each character of a base64-style key (``/``, ``+``, ``=``) as itself, JSON-escaped (``\\/``, ``\\u002B``
    in either case), an HTML reference or percent-encoded, chosen per character: the key is masked whole."""
    spelled = "".join(_spell(c, h) for c, h in zip(key, hows))
    text = Redactor([key])(f"{before} {spelled} {after}") or ""
    assert spelled not in text and "***" in text
    assert not {p for p in pieces(key) if p in text.replace(before, "").replace(after, "")}


@given(key=keys, hows=st.lists(st.integers(0, 6), min_size=60, max_size=60), cut=st.integers(1, 200))
def test_a_key_cut_inside_its_escaped_spelling_leaves_no_head_before_the_mark(key: str, hows: list[int],
                                                                              cut: int) -> None:
    """A capture (or a clipped message) cut anywhere inside the key's escaped spelling, an escape split too:
    what is left of the key before the cut mark is masked, and the partial escape with it (a cut inside the
    first character's escape leaves no character of the key: nothing to mask)."""
    spelled = "".join(_spell(c, h) for c, h in zip(key, hows))
    cut = min(cut, len(spelled) - 1)
    text = Redactor([key])(f"error: {spelled[:cut]}{CUT}") or ""
    whole = cut >= len(_spell(key[0], hows[0]))  # at least the key's first character before the cut
    assert text == f"error: {'***' if whole else spelled[:cut]}{CUT}", (spelled[:cut], text)


# ---- servers that echo the key ---------------------------------------------------------------------------
class GatewayServer(ShapeServer):
    """The shape server with gateways that echo the API key (its Authorization header): ``echo-php`` and
    ``echo-dotnet`` answer generation requests 401 with a JSON error whose message holds the key as PHP and
    .NET escape it; ``echo-id`` streams an answer whose every chunk ``id``, ``finish_reason`` and ``model``
    are the key. Every generation request's JSON body is kept (``bodies``)."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []

    async def _shape(self, writer: asyncio.StreamWriter, shape: str, req: dict[str, Any], headers: dict[str, str],
                     t_received_ns: int, log: bool = True) -> bool:
        if log:
            self.bodies.append(req)
        return await super()._shape(writer, shape, req, headers, t_received_ns, log)

    async def _error(self, writer: asyncio.StreamWriter, key: str, spell: Any) -> bool:
        body = ('{"error":{"message":"Incorrect API key provided: ' + spell(key) + '. You can find your API key '
                'at https:\\/\\/example.com\\/keys","code":"invalid_api_key"}}').encode()
        writer.write(b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                     % len(body) + body)
        return True

    async def _echo_php(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return await self._error(writer, _key(e), php)

    async def _echo_dotnet(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        return await self._error(writer, _key(e), dotnet)

    async def _echo_id(self, writer: asyncio.StreamWriter, e: dict[str, Any]) -> bool:
        key = _key(e)
        writer.write(SSE_HEAD)
        for i in range(e["max_tokens"]):
            writer.write(chunk(event({"id": key, "model": key, "choices": [{"index": 0, "delta": {"content": " t"}}]})))
        writer.write(chunk(event({"id": key, "model": key, "choices": [{"index": 0, "delta": {},
                                                                        "finish_reason": key}]})))
        writer.write(chunk(event({"id": key, "choices": [], "usage": {"prompt_tokens": 8,
                                                                      "completion_tokens": e["max_tokens"]}})))
        writer.write(chunk(b"data: [DONE]\n\n") + chunk(b""))
        return True


def _key(e: dict[str, Any]) -> str:
    return e["headers"].get("authorization", "").removeprefix("Bearer ")


@pytest.fixture(scope="module")
def gateway() -> Any:
    with GatewayServer() as srv:
        yield srv


SCENARIO = f"""\
name: gateway
target: {{base_url: embedded, api_key_env: {KEY_ENV}, ttft_timeout_s: 10}}
load: {{arrival: constant, rate_per_s: 20, requests: 3, duration_s: 5, drain_timeout_s: 5, fail_fast_requests: 0}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: fixed, value: 4}}}}]
"""


def base64_key() -> str:
    """A key with every character a JSON writer may escape in it: / + = (as base64 keys have)."""
    return "sk-proj/" + secrets.token_urlsafe(18).replace("-", "+").replace("_", "/") + "+Ab/Cd=="


def run_against(gateway: GatewayServer, shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                capture: int = 0) -> tuple[str, Path]:
    key = base64_key()
    monkeypatch.setenv(KEY_ENV, key)
    scenario = tmp_path / "gateway.yaml"
    scenario.write_text(SCENARIO)
    result = api.run(scenario, base_url=gateway.url(shape), out=tmp_path / "r", server_metrics=False,
                     capture=capture)
    assert [_key(e) for e in gateway.generation(shape)][-3:] == [key] * 3  # it was sent, and echoed
    assert result.run_dir is not None
    return key, result.run_dir


def leaks(key: str, run_dir: Path) -> list[str]:
    """Every file of the run directory that holds the key, or a piece of it, in any spelling: the Parquet files
    read as tables (every string column), the others as text."""
    found = []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        if path.suffix == ".parquet":
            frame = pl.read_parquet(path)
            text = "\n".join(str(v) for c in frame.columns if frame[c].dtype == pl.String for v in frame[c].to_list())
        else:
            text = path.read_bytes().decode("utf-8", "replace")
        if any(p in text for s in spellings(key) for p in pieces(s, 12)):
            found.append(path.name)
    return found


@pytest.mark.parametrize("shape", ["echo-php", "echo-dotnet"])
def test_a_key_echoed_json_escaped_leaves_no_file_of_a_captured_run_holding_it(gateway, tmp_path, monkeypatch,
                                                                                shape):
    """The server echoes the key in its 401's JSON, ``/`` written ``\\/`` (PHP) or ``+`` written ``\\u002B``
    (.NET): the captures hold the body as received, the key masked in its escaped spelling too."""
    key, run_dir = run_against(gateway, shape, tmp_path, monkeypatch, capture=3)
    captures = sorted((run_dir / "captures").iterdir())
    assert captures and all("Incorrect API key provided: ***. You can find" in p.read_text() for p in captures)
    assert leaks(key, run_dir) == []


def test_a_key_echoed_in_chunk_ids_and_finish_reason_is_in_no_output_file(gateway, tmp_path, monkeypatch):
    """Every string a server sends passes the redactor before it is written: requests.parquet's request_id and
    finish_reason, the model, the summary, report and JUnit files."""
    key, run_dir = run_against(gateway, "echo-id", tmp_path, monkeypatch)
    requests = pl.read_parquet(run_dir / "requests.parquet")
    assert requests["error_kind"].is_null().all() and requests["finish_reason"].to_list() == ["***"] * 3
    assert requests["request_id"].to_list() == ["***"] * 3
    assert {"summary.json", "summary.md", "junit.xml", "report.html", "run.json"} <= \
        {p.name for p in run_dir.iterdir()}
    assert leaks(key, run_dir) == []


# ---- loadgen shrink: secrets from the environment, never the masked record ----------------------------------
HELICONE_ENV = "LOADGEN_GATEWAY_TEST_HELICONE"
SHRINK_SCENARIO = f"""\
name: helicone
target:
  base_url: embedded
  api_key_env: {KEY_ENV}
  ttft_timeout_s: 10
  headers: {{Helicone-Auth: "Bearer ${{{HELICONE_ENV}}}", X-Team: infra}}
  extra_body: {{user: "${{{KEY_ENV}}}"}}
load: {{arrival: constant, rate_per_s: 20, requests: 4, duration_s: 5, drain_timeout_s: 5}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: fixed, value: 6}}}}]
"""


@pytest.fixture
def shrinkable(gateway: GatewayServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str, str]:
    """A run whose Helicone-Auth header and extra_body.user come from environment variables (run.json masks
    both: "Bearer ***" by the Bearer pattern, the user as the API key it is)."""
    key, helicone = base64_key(), "sk-helicone-" + secrets.token_hex(12)
    monkeypatch.setenv(KEY_ENV, key)
    monkeypatch.setenv(HELICONE_ENV, helicone)
    (tmp_path / "s.yaml").write_text(SHRINK_SCENARIO.replace("embedded", gateway.url("ok"), 1))
    result = api.run(tmp_path / "s.yaml", out=tmp_path / "r", server_metrics=False)
    assert result.run_dir is not None
    scenario = json.loads((result.run_dir / "run.json").read_text())["scenario"]
    assert scenario["target"]["headers"]["Helicone-Auth"] == "Bearer ***"  # as the issue found it
    assert scenario["target"]["extra_body"]["user"] == "***"
    return result.run_dir, key, helicone


def test_shrink_replays_a_masked_header_and_body_field_from_the_environment(gateway, shrinkable):
    run_dir, key, helicone = shrinkable
    gateway.bodies.clear()
    sent = len(gateway.log)
    res = CliRunner().invoke(app, ["shrink", str(run_dir), "--request", "0", "--confirmations", "1",
                                   "--max-tries", "5", "--no-png"])
    assert res.exit_code in (0, 1), res.output
    confirmation = gateway.log[sent:]
    assert confirmation, "the confirmation ran on the target"
    assert {e["headers"].get("helicone-auth") for e in confirmation} == {f"Bearer {helicone}"}
    assert {b.get("user") for b in gateway.bodies} == {key}
    out = next(run_dir.glob("shrink-*"))
    target = yaml.safe_load((out / "scenario.yaml").read_text())["target"]
    assert target["headers"] == {"Helicone-Auth": f"Bearer ${{{HELICONE_ENV}}}", "X-Team": "infra"}
    assert target["extra_body"] == {"user": f"${{{KEY_ENV}}}"}
    script = (out / "repro.py").read_text()
    assert f"Bearer ${{{HELICONE_ENV}}}" in script and f"${{{KEY_ENV}}}" in script and "***" not in script
    assert leaks(key, out) == [] and leaks(helicone, out) == []


def test_repro_py_reads_the_masked_values_from_the_environment(gateway, shrinkable, monkeypatch):
    from tests.test_shrink import script_module

    run_dir, key, helicone = shrinkable
    res = CliRunner().invoke(app, ["shrink", str(run_dir), "--request", "0", "--confirmations", "0",
                                   "--max-tries", "5", "--no-png"])
    assert res.exit_code in (0, 1), res.output
    repro = script_module(next(run_dir.glob("shrink-*")) / "repro.py")
    assert repro.request_headers([], KEY_ENV)["Helicone-Auth"] == f"Bearer {helicone}"
    assert {b["user"] for b in repro.loadgen_bodies()} == {key}
    monkeypatch.delenv(HELICONE_ENV)
    assert f"set {HELICONE_ENV}" in repro.request_headers([], KEY_ENV)


@pytest.mark.parametrize("record", ["no source", "no record"])
def test_shrink_refuses_a_masked_value_with_no_known_source_naming_it(shrinkable, record):
    """run.json that masks a field the reproduction sends but does not say where it came from (a literal in the
    scenario; or a run.json from before loadgen recorded it): one line naming the field, exit 2, nothing sent."""
    run_dir = shrinkable[0]
    info = json.loads((run_dir / "run.json").read_text())
    info.pop("masked", None)
    if record == "no source":
        info["masked"] = [{"field": ["target", "extra_body", "user"], "from": None}]
    (run_dir / "run.json").write_text(json.dumps(info))
    res = CliRunner().invoke(app, ["shrink", str(run_dir), "--request", "0", "--confirmations", "0", "--no-png"])
    assert res.exit_code == 2 and "target.extra_body.user" in res.output, res.output
    assert not list(run_dir.glob("shrink-*"))


def test_the_source_run_json_keeps_for_a_masked_value_is_its_variable_never_a_default_or_a_literal():
    """run.json's ``masked`` names where each masked value came from: ``${VAR}`` alone, its ``:-default`` dropped
    (a default may be the key itself), and nothing where a literal stood beside the reference."""
    default = "sk-defaultsecret12345"
    sent = {"headers": {"Helicone-Auth": f"Bearer {default}", "X-Org": "Bearer sk-lit-abcdef123456-x"},
            "extra_body": {"user": "u-42"}}
    shown = {"headers": {"Helicone-Auth": "Bearer ***", "X-Org": "Bearer ***"}, "extra_body": {"user": "***"}}
    refs = {("headers", "Helicone-Auth"): f"Bearer ${{NOPE_UNSET:-{default}}}",
            ("headers", "X-Org"): "Bearer sk-lit-abcdef123456${SUFFIX}", ("extra_body", "user"): "${USER_ID}"}
    got = {tuple(m["field"]): m["from"] for m in masked_fields(sent, shown, refs)}
    assert got == {("headers", "Helicone-Auth"): "Bearer ${NOPE_UNSET}", ("headers", "X-Org"): None,
                   ("extra_body", "user"): "${USER_ID}"}
    assert default not in json.dumps(list(got.values())) and "sk-lit" not in json.dumps(list(got.values()))
