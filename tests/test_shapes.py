"""What real servers, proxies and gateways send, measured right: every stream shape of tests/shape_server.py run
through loadgen (in process, the asyncio driver), each record held to its own response.

The contract for a shape that carries an answer: one row per request the server received, each with the id of
the response it was sent (nothing mixed between requests on a kept-alive connection), exactly the tokens and
chunks the server wrote, and TTFT stamped within ``TTFT_TOLERANCE_MS`` after the server's first content write
(both on this machine's monotonic clock).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import polars as pl
import pytest

from loadgen import api
from tests.shape_server import SLOW_FIRST_S, ShapeServer

TTFT_TOLERANCE_MS = 25.0  # the read of a loopback write, on a busy 2-core machine
REQUESTS = 6
SCENARIO = f"""\
name: shapes
target: {{base_url: embedded, ttft_timeout_s: 10, idle_timeout_s: 1}}
load: {{arrival: constant, rate_per_s: 20, requests: {REQUESTS}, duration_s: 5, drain_timeout_s: 5}}
workload:
  classes: [{{name: c, prompt_tokens: {{dist: fixed, value: 16}}, output_tokens: {{dist: uniform, min: 4, max: 12}}}}]
"""


@pytest.fixture(scope="module")
def shapes() -> Iterator[ShapeServer]:
    with ShapeServer() as srv, ShapeServer() as other:
        srv.other = other
        yield srv


def shape_run(shapes: ShapeServer, tmp_path: Path, shape: str, **overrides: Any) -> tuple[Any, pl.DataFrame,
                                                                                          list[dict[str, Any]]]:
    """``loadgen run`` of the shape (in process); the result, the request records and the server's log of the
    generation requests it received for this run."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "shapes.yaml"
    path.write_text(SCENARIO)
    before = len(shapes.log)
    result = api.run(api.load_scenario(path, overrides), base_url=shapes.url(shape), out=tmp_path / shape,
                     server_metrics=False)
    requests = pl.read_parquet(tmp_path / shape / "requests.parquet")
    return result, requests, shapes.log[before:]


def assert_own_responses(requests: pl.DataFrame, received: list[dict[str, Any]]) -> None:
    by_id = {e["id"]: e for e in received}
    assert requests.height == len(received) == REQUESTS
    assert sorted(requests["request_id"].to_list()) == sorted(by_id), "a record holds another request's answer"
    for row in requests.iter_rows(named=True):
        sent = by_id[row["request_id"]]
        assert row["error_kind"] is None, row["error_message"]
        assert row["output_tokens_asked"] == sent["max_tokens"]  # the answer to this very request
        assert row["output_tokens"] == row["chunks"] == sent["max_tokens"]
        late_ms = (row["t_first_token_ns"] - sent["t_first_content_ns"]) / 1e6
        assert 0 <= late_ms <= TTFT_TOLERANCE_MS, f"TTFT stamped {late_ms:.1f} ms after the first content write"


@pytest.mark.parametrize("shape", [
    "ok",
    "interim",  # 1: 100 Continue and 103 Early Hints before the final response
    "close", "close11",  # 2: a body that ends at the connection's close
    "error-null",  # 4: "error": null in every chunk
    "bom",  # 6: a byte order mark before the first event
    "tool-calls", "list-content",  # 7: no content string
    "gzip",  # 8: compressed although identity was asked
])
def test_every_stream_shape_is_measured_exactly(shapes, tmp_path, shape):
    result, requests, received = shape_run(shapes, tmp_path, shape)
    assert_own_responses(requests, received)
    assert result.verdict == "pass" and result.exit_code == 0


@pytest.mark.parametrize("shape", ["slow-first", "role-then-slow"])
def test_the_first_token_after_a_long_prefill_is_not_an_idle_timeout(shapes, tmp_path, shape):
    """3: idle_timeout_s 1 s, the first token SLOW_FIRST_S (1.5 s) after the head: the TTFT deadline (10 s) rules
    until the first token."""
    _, requests, received = shape_run(shapes, tmp_path, shape)
    assert_own_responses(requests, received)
    ttft_s = ((requests["t_first_token_ns"] - requests["t_sent_ns"]) / 1e9).to_list()
    assert all(SLOW_FIRST_S <= t < SLOW_FIRST_S + TTFT_TOLERANCE_MS / 1e3 + 0.01 for t in ttft_s), ttft_s


def test_a_stream_that_stalls_after_its_first_token_is_an_idle_timeout(shapes, tmp_path):
    """3, the other side: between reads of a started body the idle deadline applies (two tokens, then 1.5 s of
    nothing, against idle_timeout_s 1 s); a role-only chunk before a long prefill is no token."""
    _, requests, _ = shape_run(shapes, tmp_path, "stall-mid")
    assert set(requests["error_kind"]) == {"timeout_idle"} and set(requests["chunks"]) == {2}
    assert set(requests["error_message"]) == {"no bytes for 1 s"}


def test_an_in_band_error_before_a_reset_keeps_the_servers_message(shapes, tmp_path):
    """5: two tokens, an error event, a TCP reset: the record says what the server said."""
    result, requests, received = shape_run(shapes, tmp_path, "error-reset")
    assert requests.height == len(received) == REQUESTS
    assert set(requests["error_kind"]) == {"http_5xx"} and set(requests["chunks"]) == {2}
    for message in requests["error_message"]:
        assert message.startswith("CUDA error: an illegal memory access was encountered (then: connection broken")
    assert result.exit_code == 1


def test_a_json_error_sent_with_status_200_is_the_servers_error(shapes, tmp_path):
    """8: a gateway's error in a JSON body with status 200, where a stream was asked for."""
    _, requests, received = shape_run(shapes, tmp_path, "json-error-200")
    assert requests.height == len(received) == REQUESTS
    assert set(requests["error_message"]) == {"quota exceeded for this key"}
    assert set(requests["error_kind"]) == {"protocol"} and set(requests["chunks"]) == {0}


def test_a_redirect_during_the_run_is_a_counted_error_naming_the_url_to_use(shapes, tmp_path):
    """8: the probe is answered, the generation requests get 307: counted, each naming where to go."""
    result, requests, received = shape_run(shapes, tmp_path, "redirect-run")
    assert requests.height == len(received) == REQUESTS
    assert set(requests["error_kind"]) == {"http_3xx"} and set(requests["http_status"]) == {307}
    base = f"http://127.0.0.1:{shapes.port}/ok/v1"
    assert set(requests["error_message"]) == {
        f"HTTP 307 redirect to {base}/chat/completions: use --base-url {base} instead, or set "
        "target.follow_redirects: true to follow it"}
    assert result.exit_code == 1


def test_follow_redirects_keeps_method_and_body_and_no_credentials_leave_the_origin(shapes, tmp_path, monkeypatch):
    """8: target.follow_redirects follows 307 with the POST and its body; to another origin no Authorization,
    x-api-key or secret header of the scenario is sent."""
    monkeypatch.setenv("SHAPE_API_KEY", "sk-shape-4a1b9c7d")
    overrides = {"target.follow_redirects": True, "target.api_key_env": "SHAPE_API_KEY",
                 "target.headers": {"x-api-key": "hdr-secret-3f2e", "x-trace": "kept"}}
    _, requests, _ = shape_run(shapes, tmp_path, "redirect-run", **overrides)
    assert requests["error_kind"].null_count() == REQUESTS
    landed = shapes.generation("ok")[-REQUESTS:]
    assert all(e["headers"].get("x-api-key") == "hdr-secret-3f2e" for e in landed)  # the same origin: kept
    assert all(e["headers"].get("authorization") == "Bearer sk-shape-4a1b9c7d" for e in landed)
    assert sorted(requests["output_tokens"].to_list()) == sorted(e["max_tokens"] for e in landed)
    other = shapes.other
    assert other is not None
    _, requests, _ = shape_run(shapes, tmp_path / "away", "redirect-away", **overrides)
    assert requests["error_kind"].null_count() == REQUESTS
    away = other.generation("ok")[-REQUESTS:]
    assert len(away) == REQUESTS
    for e in away:
        assert "x-api-key" not in e["headers"] and "authorization" not in e["headers"]
        assert e["headers"]["x-trace"] == "kept" and e["headers"]["content-type"] == "application/json"


# ---- redirects: a malformed Location, credentials across origins, a proxy that cannot be used ------------------
from hypothesis import given, strategies as st  # noqa: E402 - the tests below were added after the rest


def test_a_redirect_to_a_malformed_location_is_a_counted_http_3xx_naming_it(shapes, tmp_path):
    """A 307 whose Location does not parse (``http://[bad/x``) is the server's fault: a counted ``http_3xx`` that
    names it, followed or not, never ``internal`` (exit 4)."""
    from tests.shape_server import BAD_LOCATION
    for follow in (False, True):
        result, requests, received = shape_run(shapes, tmp_path / str(follow), "redirect-bad",
                                               **{"target.follow_redirects": follow})
        assert requests.height == len(received) == REQUESTS
        assert set(requests["error_kind"]) == {"http_3xx"} and set(requests["http_status"]) == {307}
        assert set(requests["error_message"]) == {
            f"HTTP 307 redirect to a malformed Location {BAD_LOCATION!r} (Invalid IPv6 URL)"}
        assert result.exit_code == 1


MALFORMED = ["http://[bad/x", "http://h:abc/x", "http://h:99999/x", "//[::1/x", "http://h/\x7f", "http://xn--a.com/",
             "http://\udcff/x", "ftp://h/x", "http://:80/x"]


@pytest.mark.parametrize("location", MALFORMED)
def test_next_hop_raises_a_redirect_error_for_a_location_that_does_not_parse(location):
    from loadgen.drivers.redirects import RedirectError, next_hop
    for follow, status in ((True, 307), (False, 307), (True, 301)):
        with pytest.raises(RedirectError) as raised:
            next_hop("http://127.0.0.1:8000/v1/chat/completions", status, location, follow, {"a": "b"})
        assert raised.value.status == status and str(raised.value).startswith(f"HTTP {status} redirect to ")


def test_the_preflight_reports_a_malformed_location_as_a_target_error():
    """run/target.py's ``call`` turns a RedirectError into its TargetError (exit 2): so does a malformed Location."""
    import asyncio

    import httpx

    from loadgen.core.secrets import Redactor
    from loadgen.run.target import TargetError, call

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(307, headers={"location": "http://[bad/x"})

    async def preflight() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            await call(client, "GET", "http://127.0.0.1:9/v1/models", 5, Redactor(), follow=True)
    with pytest.raises(TargetError, match=r"malformed Location 'http://\[bad/x'"):
        asyncio.run(preflight())


@pytest.mark.parametrize("old, new, kept", [
    ("http://h.example/v1/x", "http://h.example/v2/x", True),  # the same origin
    ("http://h.example/v1/x", "http://H.EXAMPLE:80/v2/x", True),  # the same origin, spelled otherwise
    ("https://h.example/v1/x", "https://h.example:443/v2/x", True),
    ("http://h.example/v1/x", "https://h.example/v1/x", False),  # the upgrade to https: another origin
    ("http://h.example:8000/v1/x", "http://h.example:8001/v1/x", False),  # another port
    ("http://h.example/v1/x", "http://g.example/v1/x", False),  # another host
    ("https://h.example/v1/x", "https://api.h.example/v1/x", False),  # a subdomain
])
def test_credentials_never_leave_their_origin_not_even_for_https(old, new, kept):
    """RFC 6454: an origin is (scheme, host, port); any change of it drops every sensitive header (the Fetch
    standard drops Authorization on every cross-origin redirect), an http→https upgrade of the same host too."""
    from loadgen.drivers.redirects import next_hop
    headers = {"Authorization": "Bearer k", "x-api-key": "k", "Cookie": "s=1", "x-goog-api-key": "k",
               "content-type": "application/json", "x-trace": "kept"}
    target, sent = next_hop(old, 307, new, True, headers)
    assert target == new
    assert sent == (headers if kept else {"content-type": "application/json", "x-trace": "kept"})


@pytest.mark.parametrize("status, follow, followed", [
    (301, False, False), (301, True, False), (302, True, False), (303, True, False),  # a POST is never re-sent
    (307, False, False), (307, True, True), (308, False, False), (308, True, True),
])
def test_only_307_and_308_are_followed_and_only_when_asked(status, follow, followed):
    """RFC 9110 §15.4: 301/302 let a client change the POST into a GET and 303 asks for one, so they are reported
    (http_3xx, naming the URL to use); 307/308 keep method and body and are followed with target.follow_redirects."""
    from loadgen.drivers.redirects import RedirectError, next_hop
    old, new = "http://h.example/v1/chat/completions", "http://h.example/v2/chat/completions"
    if followed:
        assert next_hop(old, status, new, follow, {"x": "y"}) == (new, {"x": "y"})
        return
    with pytest.raises(RedirectError) as err:
        next_hop(old, status, new, follow, {"x": "y"})
    assert str(err.value).startswith(f"HTTP {status} redirect to {new}: ")
    assert ("target.follow_redirects" in str(err.value)) == (status in (307, 308))


@pytest.mark.parametrize("status", [307, 308])
def test_a_redirect_from_https_to_http_is_refused_even_when_following(status):
    from loadgen.drivers.redirects import RedirectError, next_hop
    with pytest.raises(RedirectError, match=r"redirect from https to http://h.example/v1/x refused"):
        next_hop("https://h.example/v1/x", status, "http://h.example/v1/x", True, {"Authorization": "Bearer k"})


def test_a_proxy_that_cannot_be_used_for_a_redirected_origin_is_a_connect_error(monkeypatch):
    """A ProxyError (a socks5:// HTTP_PROXY) for the origin a redirect leads to is httpx's ConnectError, counted
    ``connect``, from the transport's every path: never ``internal``."""
    import asyncio

    import httpx

    from loadgen.drivers.lean_transport import LeanTransport
    from loadgen.drivers.streamed_post import direct_post
    from loadgen.drivers.timing import error_kind
    monkeypatch.setenv("HTTP_PROXY", "socks5://127.0.0.1:1")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    lean = LeanTransport()
    with pytest.raises(httpx.ConnectError) as raised:
        lean._forward_proxy(("http", "h.example", 80))
    assert error_kind(raised.value)[0] == "connect" and "socks5" in str(raised.value)
    with pytest.raises(httpx.ConnectError):
        asyncio.run(lean.handle_async_request(httpx.Request("POST", "http://h.example/v1/x")))
    assert direct_post(httpx.AsyncClient(transport=lean), "http://h.example/v1/x", {}) is None  # steps aside


@given(st.text(max_size=40) | st.builds("{}{}".format, st.sampled_from(["http://", "https://", "//", "/", "?", "http://xn--", "http://["]),
                                        st.text(max_size=30)))
def test_a_location_is_followed_to_a_url_the_transport_takes_or_is_a_redirect_error(location):
    """Whatever Location a server sends, ``next_hop`` either raises RedirectError (counted ``http_3xx``) or gives
    a URL that httpx and the lean transport's direct path take: nothing else raises."""
    import h11
    import httpx

    from loadgen.drivers.lean_transport import LeanTransport
    from loadgen.drivers.redirects import RedirectError, next_hop
    try:
        target, _ = next_hop("http://127.0.0.1:8000/v1/chat/completions", 307, location, True, {})
    except RedirectError:
        return
    httpx.URL(target)
    try:
        LeanTransport(use_proxy_env=False).prepare_post(target, {})
    except (h11.LocalProtocolError, httpx.UnsupportedProtocol, UnicodeEncodeError):
        pass  # direct_post steps aside for these; the client path reports them as httpx errors
