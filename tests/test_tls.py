"""https targets: the lean transport over TLS (its send and read stamps kept), target.tls (CA bundle, verify off
with a warning, client certificates), and certificate errors as one line with exit 2. Certificates are made by
trustme (a throwaway CA) for 127.0.0.1."""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import trustme

from loadgen.drivers.lean_transport import CONTEXT_KEY, LeanTransport, StreamContext
from tests.misbehaving_server import MisbehavingServer
from tests.run_helpers import run_cli, summary
from tests.test_faults import API_KEY, HEADER_SECRET, SCENARIO, assert_clean

SECRET_ARGS = ["--api-key-env", "LOADGEN_FAULT_KEY", "--set", "target.headers={X-Api-Key: " + HEADER_SECRET + "}"]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def pki(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The CA's PEM and a client certificate (cert + key in one PEM), as files."""
    d = tmp_path_factory.mktemp("pki")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client = ca.issue_cert("loadgen-client@example.org")
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    return {"ca": d / "ca.pem", "client": d / "client.pem"}


def _server_context(ca: trustme.CA, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ca.configure_trust(ctx)
    return ctx


@pytest.fixture(scope="module")
def tls_server(ca: trustme.CA) -> Iterator[MisbehavingServer]:
    with MisbehavingServer(_server_context(ca)) as srv:
        yield srv


@pytest.fixture(scope="module")
def mtls_server(ca: trustme.CA) -> Iterator[MisbehavingServer]:
    with MisbehavingServer(_server_context(ca, require_client_cert=True)) as srv:
        yield srv


def test_the_lean_transport_streams_over_tls_with_its_own_stamps(tls_server, pki):
    """The send is stamped by the transport just before the write; each read is fed with its arrival time."""
    async def go() -> tuple[StreamContext, list[tuple[int, int]], int, int]:
        ctx_tls = ssl.create_default_context(cafile=str(pki["ca"]))
        reads: list[tuple[int, int]] = []
        ctx = StreamContext(feed=lambda data, t_ns: reads.append((len(data), t_ns)))
        async with httpx.AsyncClient(transport=LeanTransport(ssl_context=ctx_tls)) as client:
            before = time.monotonic_ns()
            async with client.stream("POST", tls_server.url("ok") + "/chat/completions", extensions={CONTEXT_KEY: ctx},
                                     json={"model": "m", "max_tokens": 20, "stream": True, "messages": []}) as resp:
                assert resp.status_code == 200
                async for _ in resp.aiter_raw():
                    pass
            return ctx, reads, before, time.monotonic_ns()

    ctx, reads, before, after = asyncio.run(go())
    assert before <= ctx.t_sent_ns <= reads[0][1] <= reads[-1][1] <= after
    assert len(reads) >= 10 and sum(n for n, _ in reads) > 20 * 50  # 20 events fed as they came, not at the end


@pytest.mark.slow
def test_an_https_run_with_a_ca_bundle_passes(tls_server, pki, tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    out = tmp_path / "run"
    res = run_cli("run", str(tmp_path / "s.yaml"), "--out", str(out), "--no-progress", "--no-png", "--base-url",
                  tls_server.url("ok", "tester:pw-fault-6e5d4c3b@"), "--set", f"target.tls.ca_bundle={pki['ca']}",
                  *SECRET_ARGS, env={"LOADGEN_FAULT_KEY": API_KEY}, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary(out)
    assert s["requests"]["completed"] == 8 and s["metrics"]["queue_delay_ms"]["max"] < 5
    assert_clean(res, out)


def test_an_untrusted_certificate_is_exit_2_naming_tls(tls_server, tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    res = run_cli("run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run"), "--no-progress",
                  "--base-url", tls_server.url("ok"), timeout=60)
    assert res.returncode == 2 and "TLS: CERTIFICATE_VERIFY_FAILED" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_verify_off_runs_with_a_warning_and_a_note(tls_server, tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    out = tmp_path / "run"
    res = run_cli("run", str(tmp_path / "s.yaml"), "--out", str(out), "--no-progress", "--no-png", "--base-url",
                  tls_server.url("ok"), "--set", "target.tls.verify=false", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "warning: TLS certificate checks are off" in res.stdout
    assert "TLS certificate checks were off (target.tls.verify: false)" in summary(out)["notes"]


@pytest.mark.slow
def test_a_client_certificate_is_presented_when_the_server_asks(mtls_server, pki, tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    base = ["run", str(tmp_path / "s.yaml"), "--no-progress", "--no-png", "--base-url", mtls_server.url("ok"),
            "--set", f"target.tls.ca_bundle={pki['ca']}"]
    without = run_cli(*base, "--out", str(tmp_path / "without"), timeout=60)
    assert without.returncode == 2 and "cannot reach" in without.stderr
    res = run_cli(*base, "--out", str(tmp_path / "with"), "--set", f"target.tls.client_cert={pki['client']}",
                  timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert summary(tmp_path / "with")["requests"]["completed"] == 8


def test_a_bad_certificate_file_is_exit_2(tmp_path):
    (tmp_path / "s.yaml").write_text(SCENARIO)
    (tmp_path / "bad.pem").write_text("not a certificate")
    res = run_cli("run", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "run"), "--no-progress",
                  "--base-url", "https://127.0.0.1:9/v1", "--set", f"target.tls.client_cert={tmp_path / 'bad.pem'}",
                  timeout=60)
    assert res.returncode == 2 and "target.tls: cannot load the certificate files" in res.stderr
