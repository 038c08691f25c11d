"""Redirects of the requests a run sends (RFC 9110 §15.4).

A redirect is never the answer. By default it is a counted error (``http_3xx``) whose message names the status
and the URL to use instead (the preflight finds one before any load and stops with exit 2). With
``target.follow_redirects: true``, 307 and 308 are followed with the method and the body kept (§15.4.8, §15.4.9:
"the user agent MUST NOT change the request method"); 301, 302 and 303 are not, since a user agent may turn a
POST into a GET there (§15.4.2-4), which would not be the request that was planned. Following one:

- the Location is resolved against the request's URL (RFC 3986 §5); one that does not parse (``http://[bad/x``,
  a port that is not a number, a host httpx refuses) or is not http(s) is a ``RedirectError`` naming it, as any
  redirect not followed (a counted ``http_3xx`` in a run, exit 2 in the preflight), never loadgen's crash;
- to another origin (scheme, host, port: RFC 6454 §4), no Authorization, x-api-key, cookie or other sensitive
  header of the scenario is sent (§15.4: "Consider removing header fields ... where there are security
  implications; this includes but is not limited to Authorization and Cookie"): loadgen removes every one on
  any change of origin, the upgrade of the same host from http to https included (the Fetch standard strips
  Authorization on every cross-origin redirect; credentials are never sent to an origin the user did not name);
- from https to http it is refused (the prompts would travel in clear);
- at most ``MAX_REDIRECTS`` hops.

The request's send time stays the first send's: its TTFT includes the extra round trips, as a user's would.
"""

from __future__ import annotations

from urllib.parse import urljoin, urlsplit

import httpx

from loadgen.core.secrets import SENSITIVE_HEADER, clip
from loadgen.drivers.errors import RedirectError
from loadgen.drivers.http_request import default_port

MAX_REDIRECTS = 5
FOLLOWED = (307, 308)


def origin(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    port = parts.port if parts.port is not None else default_port(parts.scheme)  # 0 stays 0: no server's port
    return parts.scheme, (parts.hostname or "").lower(), port


def describe(status: int, url: str, location: str | None, follow: bool) -> str:
    """The message of a redirect of ``url`` that is not followed, naming the base URL to use instead where
    the Location keeps the request's path after ``/v1``."""
    if location is None:
        return f"HTTP {status} redirect without a Location header"
    tail = url[url.rfind("/v1") + 3:] if "/v1" in url else ""
    base = location[:-len(tail)] if tail and location.endswith(tail) else location
    use = f"use --base-url {base} instead" if base != location else "point the target there"
    if status in FOLLOWED and not follow:
        return f"HTTP {status} redirect to {location}: {use}, or set target.follow_redirects: true to follow it"
    return (f"HTTP {status} redirect to {location}: {use} (a POST is not re-sent after a {status}, RFC 9110 "
            "§15.4; only 307 and 308 are followed)")


def next_hop(url: str, status: int, location: str | None, follow: bool,
             headers: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Where a followed redirect goes and the headers sent there; RedirectError when it is not followed (a
    malformed Location included)."""
    target = resolve(url, status, location) if location else None
    if target is None or not follow or status not in FOLLOWED:
        raise RedirectError(status, target, describe(status, url, target, follow))
    if urlsplit(url).scheme == "https" and urlsplit(target).scheme != "https":
        raise RedirectError(status, target, f"HTTP {status} redirect from https to {target} refused: the "
                            "request would travel unencrypted")
    if origin(url) != origin(target):  # another origin: no credentials of the scenario go there
        headers = {k: v for k, v in headers.items() if not SENSITIVE_HEADER.search(k)}
    return target, headers


def resolve(url: str, status: int, location: str) -> str:
    """The absolute URL a redirect's ``location`` names, resolved against ``url``; RedirectError when it does not
    parse (urllib and httpx both must take it: the request would go through either) or is not http(s)."""
    try:
        target = urljoin(url, location)
        scheme, host, _ = origin(target)  # urlsplit's port: a ValueError when not a number or out of range
        parsed = httpx.URL(target)
        parsed.host, parsed.port  # noqa: B018 - decoded when read: an IDNA host can fail only here ("xn--a")
    except (ValueError, httpx.InvalidURL) as exc:  # idna's errors are ValueErrors too
        raise RedirectError(status, location, f"HTTP {status} redirect to a malformed Location "
                            f"{clip(location, 200)!r} ({clip(str(exc), 200)})") from None
    if scheme not in ("http", "https") or not host:
        raise RedirectError(status, location, f"HTTP {status} redirect to {clip(location, 200)!r}: not an "
                            "http(s) URL with a host")
    return target


def too_many(status: int, location: str | None) -> RedirectError:
    return RedirectError(status, location, f"more than {MAX_REDIRECTS} redirects (the last to {location})")
