"""The one-line form every message gives an exception or untrusted text."""

from __future__ import annotations

import pytest

from pointpillars_trt.errors import one_line


@pytest.mark.parametrize(("exc", "expected"), [
    (ValueError("bad\nvalue\there"), "bad value here"),
    (ValueError(""), "ValueError"),
    (KeyError("x"), "'x'"),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("caf\u00e9 \u202eevil", "caf\u00e9 \\u202eevil"),
])
def test_one_line_folds_breaks_and_escapes_control_characters(exc: BaseException | str, expected: str) -> None:
    assert one_line(exc) == expected


def test_one_line_names_the_type_when_asked_or_when_the_message_is_empty() -> None:
    assert one_line(KeyError("x"), typed=True) == "KeyError: 'x'"
    assert one_line(RuntimeError(), typed=True) == "RuntimeError"
    assert one_line("plain text", typed=True) == "plain text"


def test_one_line_keeps_both_ends_of_a_long_message_within_the_limit() -> None:
    text = "head " + "x" * 5000 + " tail"
    got = one_line(text, limit=100)
    assert got.startswith("head ") and got.endswith(" tail") and " ... " in got and len(got) <= 100


def test_one_line_survives_an_exception_whose_str_raises() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no text")

    assert one_line(Hostile(), typed=True) == "Hostile"
