"""How the applications word what they print: one terminal-safe line an error; whether anyone still reads it."""

from __future__ import annotations

import sys


def one_line(exc: BaseException | str, limit: int = 600) -> str:
    """An exception (or text) as one terminal-safe line: control characters escaped, line breaks
    folded, long text shortened in the middle; an empty message becomes the exception's type."""
    text = str(exc)
    if not text.strip() and isinstance(exc, BaseException):
        text = type(exc).__name__
    text = " ".join(text.split())
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    if len(text) > limit:
        text = text[: limit // 2 - 2] + " ... " + text[-(limit // 2 - 3):]
    return text


def stdout_reader_gone() -> bool:
    """Whether the reader of stdout has gone (the CLI's guard found its pipe closed, e.g. ``| head -1``):
    a run whose only output is its stdout lines can stop."""
    return bool(getattr(sys.stdout, "reader_gone", False))
