"""The redaction choke point: registered secrets and secret-looking patterns are masked, and nothing else is
touched (report.html inlines ~900 kB of minified JavaScript full of ``?sign=`` and ``&&token=`` shapes)."""

from __future__ import annotations

import pytest

import json

from loadgen.core.secrets import CUT, Redactor, clip


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


# ---- a key cut in two by ``clip``: its head before the mark is masked, whichever secrets are registered ----------
KEY = "sk-live-A1BCDEFGH"


def _pieces(key: str, n: int = 4) -> set[str]:
    return {key[i:i + n] for i in range(len(key) - n + 1)}


@pytest.mark.parametrize("others", [
    ["12345678901234567890"],  # shares the key's "1": it won, masked one character, "sk-live-A" survived
    ["12345678901234567890", "BCDE-another-secret"],  # its head "B", "BC", "BCD", "BCDE" ends the key's heads too
    ["H-z", "12345678901234567890", "E-third-secret-value"],
])
def test_a_key_cut_at_any_offset_leaves_no_piece_before_the_mark(others):
    """``_mask_head`` masks the longest head of any registered secret, not the first secret's (sorted longest
    first) that has any: cut anywhere across the key, no four characters of it survive."""
    redact = Redactor([*others, KEY])
    message = "x" * 93 + " invalid api key " + KEY + " for this deployment"
    start = message.index(KEY)
    for limit in range(start - 1, start + len(KEY) + 2):
        out = redact(clip(message, limit))
        assert out.count(CUT) == 1 and not [p for p in _pieces(KEY) if p in out], (limit, out[-30:])
        assert out.startswith("x" * 93)


def test_the_brief_repro_masks_the_whole_head():
    message = "x" * 93 + " invalid api key " + KEY + " for this deployment"
    assert clip(message, 120).endswith(KEY[:10] + CUT)  # the cut sits in the key
    assert Redactor(["12345678901234567890", KEY])(clip(message, 120)).endswith(" key ***" + CUT)


@pytest.mark.parametrize("indent", [None, 2])
def test_a_cut_key_is_masked_in_json_written_with_the_escaped_mark(indent):
    """json.dumps writes the mark as the six characters \\u2026 (summary.json, run.json, ``check --json``): the
    key's head before it is masked all the same, at every cut across the key."""
    redact = Redactor(["12345678901234567890", KEY])
    message = "x" * 93 + " invalid api key " + KEY + " for this deployment"
    start = message.index(KEY)
    for limit in range(start - 1, start + len(KEY) + 2):
        out = redact(json.dumps({"evidence": clip(message, limit)}, indent=indent))
        assert "\\u2026" in out and not [p for p in _pieces(KEY) if p in out], (limit, out[-40:])
        assert json.loads(out)["evidence"].startswith("x" * 93)


def test_a_bad_metrics_line_is_cut_with_the_mark_so_a_key_in_it_is_masked():
    from loadgen.core import prom_text
    from loadgen.core.engines import SERIES

    prefix = f"{next(iter(SERIES))} not-a-number "
    line = prefix + "y" * (120 - len(prefix) - 8) + KEY  # the cut at 120 characters lands 8 into the key
    with pytest.raises(ValueError) as err:
        prom_text.parse(line)
    message = str(err.value)
    assert message.endswith(CUT) and KEY[:6] in message  # cut inside the key: its head is there, marked
    assert not [p for p in _pieces(KEY) if p in Redactor([KEY])(message)]


def test_the_crash_line_is_cut_with_the_mark(tmp_path, monkeypatch, capsys):
    from loadgen.run import exits

    monkeypatch.setitem(exits.current, "run_dir", str(tmp_path))

    def app(standalone_mode: bool) -> int:
        raise RuntimeError("y" * 190 + " key " + KEY)
    assert exits.run_app(app) == exits.INTERNAL
    line = capsys.readouterr().err
    assert CUT in line and not [p for p in _pieces(KEY) if p in Redactor([KEY])(line)]
