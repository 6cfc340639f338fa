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
    mine = MappingProxyType(merged)
    token = _current.set(mine)
    try:
        yield
    finally:
        try:
            _current.reset(token)
        except ValueError:
            # The block ends in another context than it began in: a generator stepped in
            # a copy of the context per step (Starlette's iterate_in_threadpool), an async
            # generator closed by another task. ``reset`` refuses there; that context gets
            # back the values from before the block if it holds this block's, else it
            # keeps its own, as OpenTelemetry's ``detach`` leaves a foreign context be.
            if _current.get() is mine:
                old = token.old_value
                _current.set(_EMPTY if old is contextvars.Token.MISSING else old)


def current_attributes() -> Mapping[str, Any]:
    """The user attributes in effect here (read-only)."""
    return _current.get()
