"""What servers and gateways answer before any load, and keys they echo: redirects found by the preflight, model
lists without ids, an API key echoed in a long error or read with a final newline. Through the command line
(``loadgen run``), where exit codes and stdout redaction live."""

from __future__ import annotations

import secrets
from pathlib import Path

import polars as pl
import pytest

from loadgen import api
from tests.conftest import scenario_file
from tests.run_helpers import run_cli

SCENARIO = """\
name: preflight
target: {base_url: embedded, ttft_timeout_s: 10}
load: {arrival: constant, rate_per_s: 20, requests: 4, duration_s: 5, drain_timeout_s: 5}
workload:
  classes: [{name: c, prompt_tokens: {dist: fixed, value: 16}, output_tokens: {dist: fixed, value: 6}}]
# These runs judge what the server's answers do, not timing: 4 requests' p99 queue delay is their worst one,
# which a busy CI core (the default tier runs on every core) pushed to 33 ms once, making a FAIL INCONCLUSIVE.
slo: {max_generator_lag_ms: 1000}
"""


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    return scenario_file(tmp_path, SCENARIO, "preflight.yaml")


def one_line_exit_2(res) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stdout + res.stderr, res.stderr
    return res.stderr


def test_a_301_at_the_preflight_is_exit_2_naming_the_base_url_to_use(shapes, scenario, tmp_path):
    """8: found before any load (the /models request), with the base URL the Location points at."""
    res = run_cli("run", str(scenario), "--base-url", shapes.url("redirect-301"), "--out", str(tmp_path / "r"),
                  "--no-progress", timeout=120)
    line = one_line_exit_2(res)
    new = f"https://127.0.0.1:{shapes.port}/ok/v1"
    assert f"HTTP 301 redirect to {new}/models: use --base-url {new} instead" in line
    assert not (tmp_path / "r").exists() and shapes.generation("redirect-301") == []


def test_a_307_at_the_preflight_names_the_url_or_is_followed_when_asked(shapes, scenario, tmp_path):
    res = run_cli("run", str(scenario), "--base-url", shapes.url("redirect-307"), "--out", str(tmp_path / "r"),
                  "--no-progress", timeout=120)
    new = f"http://127.0.0.1:{shapes.port}/ok/v1"
    assert (f"HTTP 307 redirect to {new}/models: use --base-url {new} instead, or set target.follow_redirects: "
            "true to follow it") in one_line_exit_2(res)
    res = run_cli("run", str(scenario), "--base-url", shapes.url("redirect-307"), "--out", str(tmp_path / "f"),
                  "--no-progress", "--no-png", "--set", "target.follow_redirects=true", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert pl.read_parquet(tmp_path / "f" / "requests.parquet")["error_kind"].null_count() == 4


@pytest.mark.parametrize("model", [None, "m"])
def test_a_model_list_without_ids_is_exit_2_naming_it(shapes, scenario, tmp_path, model):
    """9: model unset (it was 'model: null' in run.json) and set (it was exit 4)."""
    res = run_cli("run", str(scenario), "--base-url", shapes.url("models-noid"), "--out", str(tmp_path / "r"),
                  "--no-progress", *(["--model", model] if model else []), timeout=120)
    assert "/models lists 1 entry but none with an \"id\" string" in one_line_exit_2(res)


def pieces(key: str, size: int = 6) -> set[str]:
    return {key[i:i + size] for i in range(len(key) - size + 1)}


def assert_no_piece(key: str, printed: str, run_dir: Path) -> None:
    """No six characters of ``key`` in what was printed, in any text file, or in any string of the Parquet
    records (decoded, not grepped: a column's bytes may be compressed)."""
    found = pieces(key)
    assert not [p for p in found if p in printed]
    for path in run_dir.rglob("*"):
        if path.suffix == ".parquet":
            frame = pl.read_parquet(path)
            for column in (c for c, t in frame.schema.items() if t == pl.String):
                text = "\n".join(v for v in frame[column].to_list() if v)
                assert not [p for p in found if p in text], (path.name, column)
        elif path.is_file() and path.suffix != ".png":
            text = path.read_text(errors="replace")
            assert not [p for p in found if p in text], path.name


@pytest.mark.parametrize("shape", ["echo-key", "echo-key-2k"])
def test_a_key_echoed_in_a_long_error_message_leaves_no_piece_anywhere(shapes, scenario, tmp_path, shape):
    """10: the message is cut (at 300 characters in the record; at 2,000 in the core) where the key sits."""
    key = "sk-" + secrets.token_urlsafe(30)
    out = tmp_path / "r"
    res = run_cli("run", str(scenario), "--base-url", shapes.url(shape), "--out", str(out), "--no-progress",
                  "--no-png", "--api-key-env", "SHAPE_KEY", "--capture", "2", env={"SHAPE_KEY": key}, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert_no_piece(key, res.stdout + res.stderr, out)
    messages = pl.read_parquet(out / "requests.parquet")["error_message"].to_list()
    assert len(messages) == 4 and all("invalid api key" in m or m.endswith("\u2026") for m in messages)
    assert len(list((out / "captures").iterdir())) == 2  # kept, redacted


@pytest.mark.slow
@pytest.mark.parametrize("api_name", ["messages", "chat"])
def test_a_key_read_with_a_final_newline_is_sent_stripped_and_never_printed(tmp_path, scenario, api_name):
    """10: a Kubernetes secret file's key ends in a newline (it was exit 4, printing the whole key)."""
    key = "sk-ant-" + secrets.token_urlsafe(30)
    out = tmp_path / "r"
    res = run_cli("run", str(scenario), "--out", str(out), "--no-progress", "--no-png", "--set",
                  f"target.api={api_name}", "--api-key-env", "SHAPE_KEY", env={"SHAPE_KEY": key + "\n"}, timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_no_piece(key, res.stdout + res.stderr, out)


@pytest.mark.slow
def test_a_key_with_a_final_newline_reaches_the_server_stripped(shapes, tmp_path, scenario):
    """10: what the server receives is the key without its newline (RFC 9110 §5.5: no line break in a field
    value), on every request of the run (the server logs those, not the preflight's probe)."""
    key = "sk-" + secrets.token_urlsafe(30)
    before = len(shapes.log)
    res = run_cli("run", str(scenario), "--base-url", shapes.url("ok"), "--out", str(tmp_path / "r"),
                  "--no-progress", "--no-png", "--api-key-env", "SHAPE_KEY", env={"SHAPE_KEY": key + "\n"},
                  timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    received = shapes.log[before:]
    assert received and all(e["headers"]["authorization"] == f"Bearer {key}" for e in received)
    assert_no_piece(key, res.stdout + res.stderr, tmp_path / "r")


def test_a_header_value_with_a_line_break_is_refused_without_showing_it(shapes, scenario):
    sc = api.load_scenario(scenario, {"target.headers": {"X-Token": "abc\r\nInjected: 1"}})
    with pytest.raises(api.TargetError, match=r"^target.headers.X-Token holds a control or non-ASCII character"):
        api.run(sc, base_url=shapes.url("ok"))
