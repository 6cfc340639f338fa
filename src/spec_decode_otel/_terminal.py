"""The commands' output: text from a server or a file made safe to print on a terminal,
and standard output that may refuse it."""

from __future__ import annotations

import sys


class OutputError(Exception):
    """Standard output took no more (a full disk, a closed descriptor): the command's
    output is lost, which ``main`` says on stderr, with exit status 1, as ``cat`` does."""


def printable(text: str) -> str:
    """``text`` with what a terminal would act on (C0 and C1 controls, DEL, line and
    paragraph separators, bidi overrides: every character Python finds unprintable but
    the space) written as its escape, ``\\x1b``, ``\\n``, ``\\u202e``: a model name or an
    error message can neither clear the screen nor break the lines of a report."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def write_out(text: str, *, flush: bool = False) -> None:
    """``print(text)`` on standard output. A reader that left still raises
    ``BrokenPipeError`` (``main`` stops quietly then); any other failed write, or a
    standard output that was closed when the command started (``>&-``, where ``print``
    would drop the text without a word), raises :class:`OutputError`."""
    out = sys.stdout
    if out is None:
        raise OutputError("standard output is closed")
    try:
        print(text, file=out, flush=flush)
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(exc.strerror or str(exc)) from exc


def flush_out() -> None:
    """Flush standard output, its failures raised as :func:`write_out` raises them."""
    out = sys.stdout
    if out is None:
        return
    try:
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(exc.strerror or str(exc)) from exc
