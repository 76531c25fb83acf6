"""How the applications word what they print: one terminal-safe line an error; whether anyone still reads it."""

from __future__ import annotations

import sys

_ONE_LINE_LIMIT = 600  # characters of a message line; longer text loses its middle


def one_line(exc: BaseException | str) -> str:
    """An exception (or text) as one terminal-safe line: control characters escaped, line breaks
    folded, text longer than 600 characters shortened in the middle; an empty message becomes the
    exception's type."""
    text = str(exc)
    if not text.strip() and isinstance(exc, BaseException):
        text = type(exc).__name__
    text = " ".join(text.split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > _ONE_LINE_LIMIT:
        text = text[: _ONE_LINE_LIMIT // 2 - 2] + " ... " + text[-(_ONE_LINE_LIMIT // 2 - 3):]
    return text


def stdout_reader_gone() -> bool:
    """Whether the reader of stdout has gone (the CLI's guard found its pipe closed, e.g. ``| head -1``):
    a run whose only output is its stdout lines can stop."""
    return bool(getattr(sys.stdout, "reader_gone", False))
