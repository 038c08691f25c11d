#!/usr/bin/env python3
"""A reproduction of one stall, written by ``loadgen shrink``: no loadgen needed, the standard library only.

It sends the requests below at their offsets (one thread and one connection each), streamed, with exactly the
given output lengths (``max_tokens`` = ``min_tokens``, ``ignore_eos``), times every content chunk of every stream,
and prints each stream's TTFT, worst chunk gap and prompt length as the server counted it. Exit 0: the victim's
worst gap (METRIC ttft_ms: its TTFT) was at least SHARE of the original (it reproduced); 1: it was not; 2: the
server could not be used.

Prompts: BODIES_ZB64 holds each request's JSON body exactly as loadgen sent it to this target (zlib + base64 of a
JSON list), its prompt built to the given token length by the target's own tokenizer: the script sends it byte
for byte (--model replaces its model). Without it (loadgen could not build them), request i's user message is a
unique tag then words, one per token minus the chat template's tokens (TEMPLATE_TOKENS): exact on loadgen's
simulator, only about one token a word on a real tokenizer.

    python3 repro.py --url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import re
import sys
import threading
import time
import urllib.parse
import zlib
from typing import Any

# --- data (written by loadgen shrink) ---
URL = "http://127.0.0.1:8000/v1"  # the base URL, /v1 included (as loadgen's target.base_url)
MODEL = "sim-llama"
API = "chat"  # chat: URL/chat/completions; completions: URL/completions
METRIC = "chunk_gap_ms"  # chunk_gap_ms: the victim's worst chunk gap; ttft_ms: its time from send to first chunk
ORIGINAL_GAP_MS = 1000.0  # the victim's gap (or TTFT) in the original run
SHARE = 0.5  # reproduced: the victim's worst gap (or TTFT) >= SHARE x ORIGINAL_GAP_MS
VICTIM = 1  # index in REQUESTS
API_KEY_ENV = None  # the scenario's target.api_key_env: sent as Authorization: Bearer $API_KEY_ENV
HEADERS: dict[str, str] = {}  # the scenario's target.headers that hold no secret
HEADER_ENVS: dict[str, str] = {}  # header → its (secret) value's ${VAR} reference, expanded from the environment
BODY_ENVS: list[tuple[list[Any], str]] = []  # a body field (its path) → its (secret) value's ${VAR} reference
TEMPLATE_TOKENS = 6  # what the chat template adds to one user message (completions: 0)
PROMPTS = "words"  # exact: BODIES, each prompt of its exact length on this target; approximate: BODIES, lengths
# from a fit to the server's usage (it has no tokenizer loadgen could use); words: no BODIES, generated words
BODIES_ZB64 = ""  # zlib + base64 of a JSON list: each request's body as loadgen sent it ("": none)
REQUESTS: list[dict[str, Any]] = [  # offset_s: from the first send; lengths as the server counted them
    {"offset_s": 0.0, "prompt_tokens": 12000, "output_tokens": 16, "role": "culprit"},
    {"offset_s": 0.0, "prompt_tokens": 200, "output_tokens": 200, "role": "victim"},
]
# --- end of data ---
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor")
LEAD_S = 0.3  # every thread is started before the first send


def prompt_text(index: int, tokens: int) -> str:
    words = max(1, tokens - (TEMPLATE_TOKENS if API == "chat" else 0))
    return " ".join([f"req{index}x"] + [WORDS[(index + k) % len(WORDS)] for k in range(words - 1)])


def expand(text: str) -> str:
    """``text`` with each ``${VAR}`` (``${VAR:-default}``) replaced as loadgen expands a scenario; KeyError naming
    a variable that is not set (a secret is never written into this file: it is read from the environment)."""
    def value(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if os.environ.get(name) or (default is None and name in os.environ):
            return os.environ[name]
        if default is None:
            raise KeyError(name)
        return default
    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}", value, text)


def loadgen_bodies() -> list[dict[str, Any]]:
    """BODIES_ZB64 unpacked: each request's body as loadgen sent it (key order kept), each BODY_ENVS field's
    value read from the environment (KeyError: a variable that is not set)."""
    bodies = json.loads(zlib.decompress(base64.b64decode(BODIES_ZB64))) if BODIES_ZB64 else []
    for body in bodies:
        for path, ref in BODY_ENVS:
            node = body
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = expand(ref)
    return bodies


def body_of(index: int, req: dict[str, Any], model: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    if bodies:
        sent = bodies[index]
        if model != MODEL:
            sent["model"] = model
        return sent
    out = req["output_tokens"]
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": out, "min_tokens": out, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    text = prompt_text(index, req["prompt_tokens"])
    if API == "chat":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def chunk_text(event: dict[str, Any]) -> str:
    choices = event.get("choices") or []
    if not choices:
        return ""
    first = choices[0]
    return (first.get("delta") or {}).get("content") or first.get("text") or ""


def request_headers(given: list[str], key_env: str | None) -> dict[str, str] | str:
    """The headers every request sends: the scenario's, the secret ones from their variables (or --header
    'Name: value'), the API key from ``key_env``; a str: what is missing (one line)."""
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream", **HEADERS}
    flags = dict((n.strip(), v.strip()) for n, _, v in (h.partition(":") for h in given))
    for name, ref in HEADER_ENVS.items():
        try:
            headers[name] = flags.get(name) or expand(ref)
        except KeyError as exc:
            return f"header {name} holds a secret: set {exc.args[0]}, or pass --header '{name}: <value>'"
    headers.update(flags)
    key = os.environ.get(key_env) if key_env else None
    given_auth = any(n.lower() == "authorization" for n in flags)
    if key_env and not key and API_KEY_ENV and not given_auth:
        return f"the target needs an API key: set {key_env} (or pass --header 'Authorization: Bearer <key>')"
    if key and not given_auth:
        headers["Authorization"] = f"Bearer {key}"
    return headers


def stream(url: str, headers: dict[str, str], body: dict[str, Any], t_send: float, out: dict[str, Any]) -> None:
    """Send at ``t_send`` (time.monotonic), then the time of every content chunk into ``out["chunks"]``."""
    parts = urllib.parse.urlsplit(url)
    conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    path = parts.path.rstrip("/") + ("/chat/completions" if API == "chat" else "/completions")
    time.sleep(max(0.0, t_send - time.monotonic()))
    out["t_sent"] = time.monotonic()
    try:
        conn = conn_cls(parts.hostname or "127.0.0.1", parts.port, timeout=600)
        conn.request("POST", path, json.dumps(body).encode(), headers)  # as loadgen encodes it
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read(200)!r}"
            return
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if chunk_text(event):
                out["chunks"].append(time.monotonic())
            if isinstance(event.get("usage"), dict):
                out["prompt_tokens"] = event["usage"].get("prompt_tokens")
        conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"


def worst_gap_ms(chunks: list[float]) -> float:
    return max(((b - a) * 1000 for a, b in zip(chunks, chunks[1:])), default=0.0)


def ttft_ms(res: dict[str, Any]) -> float:
    return (res["chunks"][0] - res["t_sent"]) * 1000 if res["chunks"] else float("inf")


def value_ms(res: dict[str, Any]) -> float:
    return ttft_ms(res) if METRIC == "ttft_ms" else worst_gap_ms(res["chunks"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default=URL, help=f"the server's base URL (default {URL})")
    ap.add_argument("--model", default=MODEL, help=f"the model to ask for (default {MODEL})")
    ap.add_argument("--share", type=float, default=SHARE, help=f"reproduced: the victim's worst gap >= this share "
                    f"of {ORIGINAL_GAP_MS:.0f} ms (default {SHARE})")
    ap.add_argument("--api-key-env", default=API_KEY_ENV or "OPENAI_API_KEY",
                    help=f"the environment variable holding the API key (default {API_KEY_ENV or 'OPENAI_API_KEY'})")
    ap.add_argument("--header", action="append", default=[], metavar="'NAME: VALUE'",
                    help="a header to send (repeatable): a secret header's value instead of its variable "
                         + (", ".join(f"{n}: ${v}" for n, v in HEADER_ENVS.items()) or "(none)"))
    args = ap.parse_args()
    headers = request_headers(args.header, args.api_key_env)
    if isinstance(headers, str):
        print(f"error: {headers}", file=sys.stderr)
        return 2
    try:
        url, bodies = expand(args.url), loadgen_bodies()
    except KeyError as exc:
        print(f"error: the requests take a secret from the environment: set {exc.args[0]}", file=sys.stderr)
        return 2
    t0 = time.monotonic() + LEAD_S
    results: list[dict[str, Any]] = [{"chunks": []} for _ in REQUESTS]
    threads = [threading.Thread(target=stream, args=(url, headers,
                                                     body_of(i, r, args.model, bodies), t0 + r["offset_s"],
                                                     results[i]))
               for i, r in enumerate(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, (req, res) in enumerate(zip(REQUESTS, results)):
        state = res.get("error") or (f"{len(res['chunks'])} chunks, TTFT {ttft_ms(res):.1f} ms, worst gap "
                                     f"{worst_gap_ms(res['chunks']):.1f} ms")
        counted = f" (the server counted {res['prompt_tokens']})" if res.get("prompt_tokens") is not None else ""
        print(f"request {i} ({req['role']}, +{req['offset_s']:.3f} s, {req['prompt_tokens']} prompt tokens{counted}, "
              f"{req['output_tokens']} output): {state}")
    if any(res.get("error") for res in results):
        print("the server could not be used: see the errors above", file=sys.stderr)
        return 2
    gap = value_ms(results[VICTIM])
    reproduced = gap >= args.share * ORIGINAL_GAP_MS
    what = "TTFT" if METRIC == "ttft_ms" else "worst gap"
    print(f"victim's {what}: {gap:.1f} ms ({gap / ORIGINAL_GAP_MS:.0%} of the original {ORIGINAL_GAP_MS:.1f} ms): "
          + ("reproduced" if reproduced else "not reproduced"))
    return 0 if reproduced else 1


if __name__ == "__main__":
    sys.exit(main())
