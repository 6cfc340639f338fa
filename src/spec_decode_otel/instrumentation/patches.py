"""Attributes set on other packages' classes (the openai SDK, LiteLLM, DSPy's lm15), and
putting them back.

Putting back leaves alone an attribute someone has since replaced or wrapped ours in
(another instrumentation loaded after us): theirs stays, and ours inside it passes every
call through, because each of our wrappers checks that its instrumentation is still the
active one. Restoring theirs' original would silently remove them.
"""

from __future__ import annotations

from typing import Any

from spec_decode_otel._logging import report_internal_error

#: What a class's own attribute was when it had none (it came from a base, or nowhere).
ABSENT: Any = object()


class Patches:
    """The attributes set, in order, each with what the class itself held before.

    Not locked: each user holds its own lock around set and restore.
    """

    def __init__(self, where: str) -> None:
        #: The internal-error label of a failed restore.
        self._where = where
        self._made: list[tuple[type, str, Any, Any]] = []

    def __bool__(self) -> bool:
        return bool(self._made)

    def set(self, cls: type, name: str, ours: Any) -> None:
        """Set ``ours`` as ``cls.name``, remembering what the class itself held."""
        own = vars(cls).get(name, ABSENT)
        setattr(cls, name, ours)
        self._made.append((cls, name, own, ours))

    def restore(self) -> None:
        """Put back what each attribute held, newest first, where ours is still there."""
        for cls, name, own, ours in reversed(self._made):
            try:
                if vars(cls).get(name) is ours:
                    if own is ABSENT:
                        delattr(cls, name)
                    else:
                        setattr(cls, name, own)
            except Exception:
                report_internal_error(self._where)
        self._made.clear()
