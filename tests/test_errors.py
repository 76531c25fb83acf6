"""The one-line form every message gives an exception or untrusted text."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from pointpillars_trt.errors import one_line, safe_repr, shell_word


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


def test_safe_repr_escapes_and_shortens() -> None:
    shown = safe_repr(Path("/tmp/\x1b[31mred\n\u202eevil.bin"))
    assert "\x1b" not in shown and "\n" not in shown and "\u202e" not in shown
    assert "\\x1b[31mred\\n" in shown and "\\u202e" in shown
    long = safe_repr("a" * 1000, limit=50)
    assert len(long) <= 50 and "..." in long
    assert safe_repr(b"\xff") == repr("\udcff")


def test_safe_repr_of_a_huge_or_nested_value_is_bounded_and_quick() -> None:
    """A value that is not a name is shown by its first items, two levels deep: a million-item list,
    a 100,000-deep nesting and a 5,000-digit int cost no whole repr."""
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    start = time.perf_counter()
    shown = [safe_repr(list(range(10**6))), safe_repr(deep), safe_repr(10**5000), safe_repr({"k": [1, [2, [3]]]})]
    assert time.perf_counter() - start < 0.5
    assert shown[0].startswith("[0, 1, 2") and shown[0].endswith("...]") and len(shown[0]) <= 160
    assert shown[1] == "[[[...]]]" and len(shown[2]) <= 160 and shown[3] == "{'k': [1, [...]]}"


def test_safe_repr_of_a_value_whose_repr_raises_or_holds_control_characters() -> None:
    class Hostile:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    class Loud:
        def __repr__(self) -> str:
            return "\x1b[2J\nboom"

    assert safe_repr(Hostile()).startswith("<Hostile instance at 0x")
    assert safe_repr(Loud()) == "\\x1b[2J\\nboom"


@pytest.mark.parametrize("text", ["plain.pth", "with space/and'quote", "tab\there", "\udcff\u202e\\x", "a\n\x1b[31mb"])
def test_shell_word_is_one_printable_word_bash_reads_back_as_the_text(text: str) -> None:
    """A path in a command a message shows (an undecodable byte as os.fsdecode holds it, a bidi override, ESC)."""
    word = shell_word(text)
    assert word.isprintable(), word
    out = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True).stdout
    assert out == os.fsencode(text)


def test_a_count_of_one_names_its_noun_in_the_singular() -> None:
    """Messages said '1 frames' and '1 boxes': one takes the singular, any other count the plural."""
    from pointpillars_trt.errors import counted

    assert [counted(n, "frame") for n in (0, 1, 2)] == ["0 frames", "1 frame", "2 frames"]
    assert [counted(n, "box", "boxes") for n in (0, 1, 12)] == ["0 boxes", "1 box", "12 boxes"]


def test_a_fraction_is_counted_as_ray_counts_gpus_and_its_words_agree_as_the_noun() -> None:
    """Fractional GPU counts had a formatter of their own beside ``counted``: one rule now serves both, a float
    without a trailing '.0', and ``agree`` picks a message's verbs and pronouns as ``counted`` picks its noun."""
    from pointpillars_trt.errors import agree, counted

    assert [counted(n, "GPU") for n in (0.0, 0.5, 1.0, 2.0, 1.5)] == ["0 GPUs", "0.5 GPUs", "1 GPU", "2 GPUs",
                                                                    "1.5 GPUs"]
    assert counted(10 ** 20, "byte") == "100000000000000000000 bytes"  # an int is never put in exponent form
    assert [agree(n, "has", "have") for n in (0, 1, 2, 0.5, 1.0)] == ["have", "has", "have", "have", "has"]
    assert agree(1, ("its", "it"), ("their", "them")) == ("its", "it")


def test_a_fraction_printed_as_one_is_counted_and_agreed_with_as_one() -> None:
    """A float is printed to 6 significant digits, so 3 x 0.3333333 GPUs read '1 GPUs' and 'need 1 GPUs': the noun
    and the words agree with the count as printed, and a count printed as another number stays plural."""
    from pointpillars_trt.apps.distributed import check_resources
    from pointpillars_trt.errors import InputError, agree, counted

    assert [counted(n, "GPU") for n in (0.9999999, 1.0000001, 0.999999, 1.00001)] == [
        "1 GPU", "1 GPU", "0.999999 GPUs", "1.00001 GPUs"]
    assert [agree(n, "needs", "need") for n in (0.9999999, 1.0000001, 0.999999)] == ["needs", "needs", "need"]
    assert [counted(n, "frame") for n in (np.float32(1.0), np.int64(1), np.int64(1234567))] == [
        "1 frame", "1 frame", "1234567 frames"]  # NumPy's numbers as Python's: an integer never in exponent form
    with pytest.raises(InputError, match=r"^3 workers x 0.333333 GPU need 1 GPU; the Ray cluster has 0.9: lower "):
        check_resources({"GPU": 0.9, "CPU": 64.0}, 3, 0.3333333)
    with pytest.raises(InputError, match=r"^--gpus-per-worker 2: the Ray cluster has 1 GPU; give at most 1$"):
        check_resources({"GPU": 0.9999999, "CPU": 64.0}, 1, 2.0)


def test_the_only_thing_a_message_counts_is_named_without_e_g() -> None:
    """Messages named the one file they counted 'e.g.' it ('1 hidden file left out (e.g. ...)'): ``example`` names
    the only one as it is, and one of several after 'e.g.'."""
    from pointpillars_trt.errors import example

    assert [example(n, "'a.bin'") for n in (1, 2, 10)] == ["'a.bin'", "e.g. 'a.bin'", "e.g. 'a.bin'"]


def test_a_frames_picture_is_titled_with_its_boxes_in_the_singular_for_one() -> None:
    """infer --viz titled a picture of one box '000000.bin: 1 boxes'."""
    from pointpillars_trt.apps.outputs import bev_title

    assert bev_title("/data/velodyne/000000.bin", 1) == "000000.bin: 1 box"
    assert bev_title("000001.bin", 3) == "000001.bin: 3 boxes"
