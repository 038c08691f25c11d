"""The redaction choke point: registered secrets and secret-looking patterns are masked, and nothing else is
touched (report.html inlines ~900 kB of minified JavaScript full of ``?sign=`` and ``&&token=`` shapes)."""

from __future__ import annotations

import pytest

from loadgen.core.secrets import Redactor


@pytest.mark.parametrize("text, expected", [
    ("cannot reach http://u:p4ss@h:8000/v1?api_key=k123&x=1", "cannot reach http://u:***@h:8000/v1?api_key=***&x=1"),
    ("https://h/v1?token=abc#frag and http://h/v1?keyboard=1&my_key=zz",
     "https://h/v1?token=***#frag and http://h/v1?keyboard=1&my_key=***"),
    ("Authorization: Bearer sk-abcdef123", "Authorization: Bearer ***"),
    ("registered sk-planted-9f8e appears twice: sk-planted-9f8e", "registered *** appears twice: ***"),
    ("a ?sign=1 && b&&(n.signals[e.signal]=t)", "a ?sign=1 && b&&(n.signals[e.signal]=t)"),
])
def test_secrets_and_secret_shapes_are_masked_and_nothing_else(text, expected):
    assert Redactor(["sk-planted-9f8e", "abc"])(text) == expected  # "abc": too short to register


def test_the_reports_inlined_javascript_passes_unchanged():
    vl_convert = pytest.importorskip("vl_convert")
    bundle = vl_convert.javascript_bundle()
    assert Redactor(["sk-planted-9f8e"])(bundle) == bundle
