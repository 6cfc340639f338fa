"""User dimensions (workload, tenant, ...) for spans and, when allow-listed, metrics.

A ``contextvars`` variable, so values follow the logical flow of control: they cross
``await`` and stay inside the task or thread that set them, never bleeding into another.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_current: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "spec_decode_otel_attributes", default=_EMPTY
)

_ALLOWED_TYPES = (str, bool, int, float)


@contextmanager
def attributes(**values: str | bool | int | float) -> Iterator[None]:
    """Add ``values`` to every instrumented call made inside the ``with`` block.

    Nested blocks merge, inner values winning. Only str/bool/int/float values are kept,
    because they are what span and metric attributes can carry.
    """
    merged = dict(_current.get())
    merged.update({k: v for k, v in values.items() if isinstance(v, _ALLOWED_TYPES)})
    token = _current.set(MappingProxyType(merged))
    try:
        yield
    finally:
        _current.reset(token)


def current_attributes() -> Mapping[str, Any]:
    """The user attributes in effect here (read-only)."""
    return _current.get()
