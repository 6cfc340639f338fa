"""Text from a server or a file, made safe to print on a terminal."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with what a terminal would act on (C0 and C1 controls, DEL, line and
    paragraph separators, bidi overrides: every character Python finds unprintable but
    the space) written as its escape, ``\\x1b``, ``\\n``, ``\\u202e``: a model name or an
    error message can neither clear the screen nor break the lines of a report."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
