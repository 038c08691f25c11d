"""The lean transport's direct POST path: the request head it prepares once a run, and when it steps aside."""

from __future__ import annotations

import httpx

from loadgen.drivers.lean_transport import LeanTransport, direct_post


def test_a_prepared_post_is_a_well_formed_http_request():
    post = LeanTransport().prepare_post("http://127.0.0.1:8123/v1/chat/completions?x=1",
                                        {"authorization": "Bearer k", "User-Agent": "mine", "content-type": "application/json"})
    assert post.origin == ("http", "127.0.0.1", 8123)
    raw = post.request(b'{"a": 1}')
    head, body = raw.split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions?x=1 HTTP/1.1" and body == b'{"a": 1}'
    fields = [tuple(line.split(b": ", 1)) for line in lines[1:]]
    names = [k.lower() for k, _ in fields]
    assert (b"host", b"127.0.0.1:8123") in fields and (b"content-length", b"8") in fields
    assert names.count(b"user-agent") == 1 and (b"User-Agent", b"mine") in fields  # the scenario's wins
    assert len(names) == len(set(names))
    assert LeanTransport().prepare_post("https://h.example/v1/x", {}).origin == ("https", "h.example", 443)


def test_the_direct_path_steps_aside_for_another_transport_or_a_bad_header():
    lean = httpx.AsyncClient(transport=LeanTransport())
    assert direct_post(lean, "http://127.0.0.1:9/v1/x", {"a": "b"}) is not None
    assert direct_post(lean, "http://127.0.0.1:9/v1/x", {"a": "b\r\nInjected: 1"}) is None  # h11 refuses it
    assert direct_post(httpx.AsyncClient(), "http://127.0.0.1:9/v1/x", {}) is None
