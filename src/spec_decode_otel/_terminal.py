"""The commands' output: text from a server or a file made safe to print on a terminal,
and standard output that may refuse it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


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
    if sys.stdout is None:
        raise OutputError("standard output is closed")
    with _refused():
        print(text, file=sys.stdout, flush=flush)


def flush_out() -> None:
    """Flush standard output, its failures raised as :func:`write_out` raises them."""
    if sys.stdout is not None:
        with _refused():
            sys.stdout.flush()


@contextmanager
def _refused() -> Iterator[None]:
    """A failed write as :class:`OutputError`; a reader that left as it is."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(exc.strerror or str(exc)) from exc
