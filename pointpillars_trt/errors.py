"""One exception family, so callers (and the CLI) can tell user errors from bugs, and the one way
their messages show untrusted text and counts."""

import numbers
import os
import reprlib
from typing import TypeVar

_ONE_LINE_LIMIT = 600  # characters of a message line; longer text loses its middle
#: Longest escaped repr :func:`safe_repr` returns (longer ones lose their middle).
SAFE_REPR_LIMIT = 160
#: Bounds of a repr of a value that is not a name: a huge or nested one is never printed whole.
_VALUE_REPR = reprlib.Repr()
_VALUE_REPR.maxlevel, _VALUE_REPR.maxstring, _VALUE_REPR.maxother, _VALUE_REPR.maxlong = 2, 50, 50, 30
_Words = TypeVar("_Words")  # a word, or a tuple of the words a message puts with one count


class PointPillarsError(Exception):
    """Base of every error this package raises on purpose."""


class InputError(PointPillarsError):
    """A lidar frame (file or array) that cannot be used."""


class InputErrors(InputError):
    """Several inputs that cannot be used, found together (e.g. every path given to ``infer``): the CLI
    says each on its own ``error:`` line, so one run shows every typo, not the first only."""

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = list(messages)


class ConfigError(PointPillarsError):
    """A model config that is missing, malformed or inconsistent."""


class CheckpointError(PointPillarsError):
    """A .pth file that cannot be read or whose layout is not a supported one."""


class ModelDirError(PointPillarsError):
    """A model directory (ONNX graphs, plans, metadata) that is missing or stale."""


class BackendError(PointPillarsError):
    """An engine backend (CUDA, CuPy, ONNX Runtime, TensorRT) that is absent or failed."""


class DetectorLost(BackendError):
    """A detector that can run no more frames: a served model's server that stopped answering (a request
    failed on its side and it answered no liveness probe either). Every frame after fails at once with it,
    rather than waiting out a request timeout each; a run counts those frames into one line."""

    #: Words every message of it carries: a frame's error line (text, once it left the runner) is told by them.
    MARK = " is down: "


#: What a command says as one ``error:`` line (exit code 2) rather than a traceback: this package's errors and the
#: operating system's, values and memory a bad input exhausted.
USER_ERRORS = (PointPillarsError, ValueError, RecursionError, MemoryError, OSError)


class CpuFallbackWarning(RuntimeWarning):
    """``device="auto"`` ran a detector on the CPU (said once per call site; the CLI says it in its own
    ``running on`` line instead)."""


class InputWarning(UserWarning):
    """Frames that are probably read wrong (e.g. 0-255 intensities for a model trained on 0-1)."""


class PrecisionWarning(RuntimeWarning):
    """A model's precision that does not suit where it runs: fp16 graphs on the CPU, no faster than fp32 and rounded
    more (a setting's advice, apart from ``InputWarning``'s frames, so that filtering one keeps the other)."""


class Notice(RuntimeWarning):
    """Something run otherwise than named or given, said once; the CLI says each kind below as a ``note:`` line
    instead of a warning with a source line."""


class LibraryNotice(Notice):
    """A backend runs on another library than its name says (TensorRT for RTX for ``tensorrt``): said once
    per process."""


class CheckpointNotice(Notice):
    """A checkpoint read one of two ways it allows (the same state dict under two keys: the one taken), said
    once per read."""


class CacheNotice(Notice):
    """A model cache entry that is there but cannot be used (damaged, or written by an older version) is rebuilt:
    said once per entry and reason."""


class SettingNotice(Notice):
    """A setting taken otherwise than it was given: from the environment (``OMP_NUM_THREADS`` past this machine's
    cores, or no thread count at all), from an OpenPCDet config (its test-time point shuffle, which runs off), from
    the built-in config of OpenPCDet's published YAML (an OpenPCDet checkpoint built without its own), or cut to the
    frames a run has (``infer --batch-size``, ``--pipelines`` or ``--ray --workers`` beyond what they keep busy):
    said once per value."""


def escape_text(text: str, limit: int | None = None) -> str:
    """``text`` safe for a one-line message: every character that is not printable ASCII (newline, ESC,
    bidi overrides, non-ASCII) escaped, and cut to ``limit`` characters with ``...``. Only the first
    ``limit`` + 1 characters are looked at, so a huge value costs nothing."""
    cut = text if limit is None else text[: limit + 1]
    out = "".join(c if c.isprintable() and c.isascii() else c.encode("unicode_escape").decode("ascii") for c in cut)
    return out if limit is None or len(out) <= limit else out[: max(limit - 3, 0)] + "..."


def one_line(exc: BaseException | str, limit: int = _ONE_LINE_LIMIT, typed: bool = False) -> str:
    """An exception (or text) as one terminal-safe line: control characters escaped, line breaks
    folded, text longer than ``limit`` characters shortened in the middle; an empty message becomes the
    exception's type. ``typed`` puts the type first (``KeyError: 'x'``), for exceptions nobody raised
    on purpose, whose type is half the story."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - e.g. a KeyError holding a 5000-digit int
        text = ""
    if len(text) > 8 * limit:  # a huge message: only its ends can show, so only they are looked at
        text = text[: 4 * limit] + " " + text[-4 * limit:]
    text = _cut_middle(printable_text(" ".join(text.split())), limit, " ... ")
    if isinstance(exc, BaseException) and (typed or not text):
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def agree(count: float, one: _Words, other: _Words) -> _Words:
    """The words of a message that agree with ``count``: ``one`` for exactly one, ``other`` for any other count (0
    frames, 0.5 GPUs, 2 frames), as :func:`counted` picks its noun, so that every message puts the verbs and pronouns
    of a count by one rule: ``f"{counted(n, 'frame')} {agree(n, 'has', 'have')} no picture"``. A float is one
    where it prints as 1 (0.9999999: '1 GPU', which 'needs'), so the words agree with the number the message shows."""
    return one if _shown(count) == "1" else other


def counted(count: float, noun: str, plural: str = "") -> str:
    """``count`` and its ``noun`` for a message, the noun in the singular for one: '1 frame', '3 frames'
    (``plural`` where an added s is not it: '1 box', '2 boxes'); a fraction as Ray counts GPUs: '0.5 GPUs'
    (a float without a trailing '.0': '2 GPUs')."""
    return f"{_shown(count)} {agree(count, noun, plural or noun + 's')}"


def _shown(count: float) -> str:
    """``count`` as messages print it: an integer (NumPy's too) whole, a float to 6 significant digits without a
    trailing '.0'."""
    return str(int(count)) if isinstance(count, numbers.Integral) else f"{count:g}"


def example(count: float, shown: str) -> str:
    """``shown``, one of ``count`` things a message counts, as the message names it: alone when it is the only one
    (which is no example), after "e.g. " when there are others:
    ``f"{counted(n, 'file')} left out ({example(n, safe_repr(names[0]))})"``."""
    return agree(count, shown, f"e.g. {shown}")


def safe_repr(value: object, limit: int = SAFE_REPR_LIMIT) -> str:
    """A short, single-line, terminal-safe repr of an untrusted name or value for an error message.

    Paths become their string; ``repr`` escapes control characters (ESC, newlines, bidi
    overrides, undecodable bytes), so no ANSI sequence or line break from a file name reaches the
    terminal. A value that is not a name (a number, a list, a mapping) is shown bounded (its first items,
    two levels deep, cut after ``limit`` characters), so a huge or nested one costs nothing. A name longer
    than ``limit`` characters loses its middle to ``...`` (its end, e.g. a file's suffix, stays).
    """
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    if isinstance(value, str):
        text = repr(value if len(value) <= 4 * limit else value[: 2 * limit] + value[-2 * limit:])
    else:
        try:
            text = printable_text(_VALUE_REPR.repr(value))
        except Exception:  # noqa: BLE001 - e.g. an int too large to print (reprlib shows a raising __repr__ itself)
            text = f"<{type(value).__name__}>"
        return text if len(text) <= limit else text[: max(limit - 3, 2)] + "..."  # its first items, as reprlib
    return _cut_middle(text, limit, "...")


def shell_word(text: str) -> str:
    """``text`` as one shell word that reads back as ``text``, for a command a message tells to run: ``shlex.quote``'s
    word, or where ``text`` holds a character that is not printable (a newline, ESC), bash's ``$'...'`` word with
    those characters escaped, so the command stays one terminal-safe line and still runs as shown."""
    import shlex

    if text.isprintable():
        return shlex.quote(text)
    return "$'" + "".join(_shell_escape(c) for c in text) + "'"


def _shell_escape(c: str) -> str:
    """One character inside bash's ``$'...'``: quotes and backslashes escaped, a character that is not printable as
    its code (an undecodable byte of a file name, held as a surrogate escape, as that byte)."""
    if c in "'\\":
        return "\\" + c
    if c.isprintable():
        return c
    code = ord(c)
    if code < 0x80:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's escape of an undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable_text(text: str) -> str:
    """``text`` with every character that is not printable (control characters, line breaks, bidi overrides)
    escaped as ``repr`` escapes it: a name in a status line ("wrote ...") stays one terminal-safe line and
    reads as the user wrote it, non-ASCII letters included (``escape_text`` escapes those too)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _cut_middle(text: str, limit: int, marker: str) -> str:
    """``text``, or when longer than ``limit`` its two ends around ``marker`` (a file's suffix, an error's
    last words stay)."""
    if len(text) <= limit:
        return text
    keep = max(limit - len(marker), 2)
    return text[: keep - keep // 2] + marker + text[len(text) - keep // 2:]
